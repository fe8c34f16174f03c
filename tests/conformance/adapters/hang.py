"""Deliberately hanging: never returns."""
import time


def load(model_path, params):
    def run(inputs):
        while True:
            time.sleep(60)
    return run
