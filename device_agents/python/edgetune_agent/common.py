"""What every part of the agent shares: who it is (protocol, version), where it runs from, small
file and hash helpers, prctl."""

import hashlib
import os

PROTOCOL = 3
# a job whose params name one of these runs code the candidate brought, beside the runtime's own
CODE_PARAMS = ("adapter", "custom_ops_library")
AGENT = "python"
AGENT_VERSION = "2.6.0"
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36


def _agent_file():
    """The file this agent runs from (W/agent/edgetune_agent.py on a device). ``__file__`` is that
    one file everywhere in the agent: the host bundles these modules into it (edgetune/agent/bundle.py),
    and the bundle is the only form of the agent that runs."""
    return os.path.realpath(os.path.abspath(__file__))


def work_dir():
    """The device's work dir W (PROTOCOL.md "Layout on the device"): the agent is W/agent/edgetune_agent.py;
    caches that outlive a job (TensorRT's engines, torch.compile's) live under W."""
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _read(path, default=None):
    try:
        with open(path, "r", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return default


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def sha256_array(arr):
    import numpy as np

    return hashlib.sha256(np.ascontiguousarray(arr).tobytes()).hexdigest()


def _read_bytes(path, limit=65536):
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, limit)
    except OSError:
        return None
    finally:
        os.close(fd)


def _prctl(option, arg):
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl(option, arg, 0, 0, 0) == 0
    except (ImportError, OSError, AttributeError):
        return False
