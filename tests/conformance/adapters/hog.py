"""Memory hog: its first call allocates 16 MB after 16 MB, each filled so every page is resident,
and keeps them all, without bound. The agent's supervisor must stop it at the job's memory bound
(``out-of-memory``), long before the host's timeout."""

CHUNK = 16 << 20


def load(model_path, params):
    hoard = []

    def run(inputs):
        while True:
            hoard.append(bytearray(b"\x01") * CHUNK)
    return run
