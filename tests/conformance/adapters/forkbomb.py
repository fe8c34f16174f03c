"""Fork bomb: the first call forks in a loop, and every child forks in a loop too. The agent's
supervisor must stop it at the job's process bound (``too-many-processes``) and leave no process."""
import os
import time


def load(model_path, params):
    def run(inputs):
        while True:
            try:
                os.fork()
            except OSError:  # refused (a pids cgroup): keep trying, as a bomb does
                time.sleep(0.001)
    return run
