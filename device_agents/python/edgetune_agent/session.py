"""``session JOBS_DIR``: many jobs over one channel (PROTOCOL.md "The session"). The host keeps one
agent process per device connection; it reads each job's request on stdin, forks the job's
supervisor exactly as the zygote does, and answers with the job's bundle, framed, on stdout."""

import os
import re
import select
import signal
import sys
import time

from .common import PR_SET_CHILD_SUBREAPER, PR_SET_PDEATHSIG, PROTOCOL, _prctl
from .run_stdio import cmd_run_stdio
from .zygote import _loads, import_runtimes, zygote_eligible

# A job through ``run-stdio`` pays a process start on the device and a command of the transport
# (an ssh channel, an adb shell) besides its own work: ~60 ms of ~250 on the reference host with the
# zygote. In a session those are paid once. The frames (all ASCII lines, then raw bytes):
#   agent -> host, once:  "EDGETUNE-SESSION <protocol> <pid>\n"  (or "... 0 <why>\n" and exit: not here)
#   host -> agent:        "JOB <id> <size>\n" <size bytes: the request, as run-stdio reads it>
#   agent -> host:        "RESULT <id> <rc> <stdout size> <stderr size>\n" <run-stdio's stdout> <its stderr>
# where <id> names the job dir, JOBS_DIR/<id>. A request the session does not serve (not a runtime
# configuration of a runtime it can fork: zygote_eligible) is answered "RESULT <id> refused 0 0".
# EOF on stdin ends the session; so does anything on stdin while a job runs (the host never sends
# then): the job is stopped first (SIGTERM to its supervisor, which sweeps it).
JOB_ID = re.compile(r"^[0-9a-f]{8,32}$")
MAX_REQUEST = 64 << 20
STDERR_TAIL = 4096


def _read_line(fd, limit=256):
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = os.read(fd, 1)
        if not chunk:
            return None
        buf += chunk
        if len(buf) > limit:
            return None
    return buf[:-1].decode("ascii", "replace")


def _read_exact(fd, n):
    parts, left = [], n
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            return None
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _spool():
    """An anonymous file for one job's stdout or stderr (memfd where there is one)."""
    try:
        return os.memfd_create("edgetune-job")
    except (AttributeError, OSError):
        import tempfile

        return os.dup(tempfile.TemporaryFile().fileno())


def _slurp(fd, tail=None):
    size = os.fstat(fd).st_size
    start = 0 if tail is None else max(0, size - tail)
    data = os.pread(fd, size - start, start) if size > start else b""
    os.close(fd)
    return data


class _Job:
    """One job of the session: a fork that becomes the job's supervisor (run-stdio's code)."""

    def __init__(self, jobdir, data, started):
        self.out, self.err = _spool(), _spool()
        self.pid = os.fork()
        if self.pid == 0:
            rc = 70
            try:
                os.setpgid(0, 0)  # not in the session's group: a kill of the session leaves it to sweep
                _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)  # the session gone: stop the job, sweep it
                if os.getppid() != SESSION_PID[0]:
                    os._exit(70)
                for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGPIPE):
                    signal.signal(sig, signal.SIG_DFL)
                null = os.open(os.devnull, os.O_RDONLY)
                os.dup2(null, 0)
                os.dup2(self.out, 1)
                os.dup2(self.err, 2)
                for fd in (null, self.out, self.err):
                    os.close(fd)
                rc = cmd_run_stdio(jobdir, data, started=started, isolation="fork of the agent session")
                try:
                    sys.stdout.flush()
                    sys.stderr.flush()
                except OSError:
                    pass
            finally:
                os._exit(rc)
        try:
            self.pidfd = os.pidfd_open(self.pid)
        except (AttributeError, OSError):
            self.pidfd = None

    def wait(self, stdin_fd):
        """The job's exit code; None when the host spoke (or hung up) while it ran: then it was stopped."""
        while True:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return os.waitstatus_to_exitcode(status)
            watch = [stdin_fd] + ([self.pidfd] if self.pidfd is not None else [])
            r, _, _ = select.select(watch, [], [], 1.0 if self.pidfd is not None else 0.005)
            if stdin_fd in r:
                self.stop()
                return None

    def stop(self):
        try:
            os.kill(self.pid, signal.SIGTERM)  # the supervisor stops the worker and sweeps its processes
        except OSError:
            pass
        give_up = time.monotonic() + 15.0
        while time.monotonic() < give_up:
            if os.waitpid(self.pid, os.WNOHANG)[0]:
                return
            time.sleep(0.005)
        try:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        except OSError:
            pass

    def answer(self):
        return _slurp(self.out), _slurp(self.err, STDERR_TAIL)


SESSION_PID = [0]


class _Stopped(Exception):
    """SIGTERM, SIGHUP or SIGINT to the session: stop the job it runs, then end."""


def _on_signal(signum, frame):
    raise _Stopped()


def cmd_session(jobs_dir):
    out = 1
    SESSION_PID[0] = os.getpid()
    if not _prctl(PR_SET_CHILD_SUBREAPER, 1):
        # without a subreaper a job's process could outlive its sweep (qemu-user): run-stdio it is
        _write_all(out, b"EDGETUNE-SESSION 0 no-subreaper\n")
        return 0
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, _on_signal)
    job = None
    try:
        _write_all(out, ("EDGETUNE-SESSION %d %d\n" % (PROTOCOL, os.getpid())).encode())
        warm = set()
        while True:
            head = _read_line(0)
            if head is None:
                return 0  # the host closed the channel
            parts = head.split(" ")
            if len(parts) != 3 or parts[0] != "JOB" or not JOB_ID.match(parts[1]) or not parts[2].isdigit() \
                    or int(parts[2]) > MAX_REQUEST:
                _write_all(out, b"ERROR bad job header\n")
                return 2
            job_id, size = parts[1], int(parts[2])
            started = time.monotonic()
            data = _read_exact(0, size)
            if data is None:
                return 0
            req = _loads(data)
            if not zygote_eligible(req):
                _write_all(out, ("RESULT %s refused 0 0\n" % job_id).encode())
                continue
            job = _Job(os.path.join(jobs_dir, job_id), data, started)
            rc = job.wait(0)
            if rc is None:
                return 0  # the host spoke during a job: it gave up on it, and on this session
            body, err = job.answer()
            job = None
            _write_all(out, ("RESULT %s %d %d %d\n" % (job_id, rc, len(body), len(err))).encode() + body + err)
            if req["backend"] not in warm:  # for the jobs after it: between jobs, never beside a timed run
                import_runtimes([req["backend"]])
                warm.add(req["backend"])
    except _Stopped:
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)
        if job is not None:
            job.stop()
        return 0
    except (BrokenPipeError, ConnectionError):  # the host is gone while we answered
        return 0
