"""The command line: ``info``, ``run``, ``run-stdio``, ``session``, ``serve``, ``version``, ``tvm-device``, ``gpu-check``."""

import sys

from .common import AGENT, AGENT_VERSION, PROTOCOL
from .gpucheck import cmd_gpu_check, cmd_tvm_device
from .info import cmd_info
from .job import cmd_run
from .run_stdio import cmd_run_stdio
from .session import cmd_session
from .zygote import _loads, cmd_serve, start_zygote, via_zygote, zygote_eligible


_SITE_DONE = []


def _site():
    """The site-packages a ``python -S`` start skipped (the host starts the agent so)."""
    if sys.flags.no_site and not _SITE_DONE:
        import site

        site.main()
        _SITE_DONE.append(1)


def main(argv):
    if not (len(argv) == 3 and argv[1] == "run-stdio"):
        _site()
    if len(argv) >= 2 and argv[1] == "info":
        return cmd_info()
    if len(argv) == 3 and argv[1] == "run":
        return cmd_run(argv[2])
    if len(argv) == 3 and argv[1] == "run-stdio":
        data = sys.stdin.buffer.read()
        req = _loads(data)
        rc = via_zygote(argv[2], data, req)
        if rc is not None:
            return rc
        _site()
        rc = cmd_run_stdio(argv[2], data)
        try:
            sys.stdout.flush()
        except OSError:
            pass
        if zygote_eligible(req):
            start_zygote()  # for the next job, after this one: never beside a timed run
        return rc
    if len(argv) == 3 and argv[1] == "session":
        return cmd_session(argv[2])
    if len(argv) == 2 and argv[1] == "serve":
        return cmd_serve()
    if len(argv) >= 2 and argv[1] == "version":
        sys.stdout.write("%d %s %s\n" % (PROTOCOL, AGENT, AGENT_VERSION))
        return 0
    if len(argv) == 3 and argv[1] == "tvm-device":
        return cmd_tvm_device(argv[2])
    if len(argv) == 2 and argv[1] == "gpu-check":
        return cmd_gpu_check()
    sys.stderr.write("usage: edgetune_agent.py info | run JOBDIR | run-stdio JOBDIR | session JOBS_DIR | serve | version"
                     " | tvm-device cpu|cuda | gpu-check\n")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
