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
from .job import request_limits
from .run_stdio import cmd_run_stdio
from .supervisor import Supervisor
from .zygote import _loads, import_runtimes, zygote_eligible

# A job through ``run-stdio`` pays a process start on the device and a command of the transport
# (an ssh channel, an adb shell) besides its own work: ~80 ms of ~230 on the reference host with the
# zygote. In a session those are paid once, and the next job's supervisor is prepared while the host
# verifies the last answer (_Job). The frames (all ASCII lines, then raw bytes):
#   agent -> host, once:  "EDGETUNE-SESSION <protocol> <pid>\n"  (or "... 0 <why>\n" and exit: not here)
#   host -> agent:        "JOB <id> <size>\n" <size bytes: the request, as run-stdio reads it>
#   agent -> host:        "RESULT <id> <rc> <stdout size> <stderr size>\n" <run-stdio's stdout> <its stderr>
# where <id> names the job dir, JOBS_DIR/<id>. A request the session does not serve (not a runtime
# configuration of a runtime it can fork: zygote_eligible) is answered "RESULT <id> refused 0 0".
# EOF on stdin ends the session; so does anything on stdin while a job runs (the host never sends
# then): the job is stopped first (SIGTERM to its supervisor, which sweeps it).
ISOLATION = "fork of the agent session"
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
    """One job of the session: a fork that prepares the job's supervisor (its cgroups and its
    worker, forked into them: run-stdio's code) for bounds like ``hint``, then waits for the job
    itself (``send``). The session forks the next one as soon as a job is over, so that all this
    is done while the host verifies the last answer; a job whose bounds differ gets a new one."""

    def __init__(self, hint):
        self.hint = hint
        self.out, self.err = _spool(), _spool()
        self.answered, answered = os.pipe()  # the job's answer is whole (its cleanup may go on)
        job_r, self.job_w = os.pipe()  # the job itself, from the session
        self.pid = os.fork()
        if self.pid == 0:
            rc = 70
            try:
                os.setpgid(0, 0)  # not in the session's group: a kill of the session leaves it to sweep
                _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)  # the session gone: stop the job, sweep it
                if os.getppid() != SESSION_PID[0]:
                    os._exit(70)
                for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
                    signal.signal(sig, signal.SIG_DFL)
                null = os.open(os.devnull, os.O_RDONLY)
                os.dup2(null, 0)
                os.dup2(self.out, 1)
                os.dup2(self.err, 2)
                for fd in (null, self.out, self.err, self.answered, self.job_w):
                    os.close(fd)
                rc = self._child(job_r, answered)
                try:
                    sys.stdout.flush()
                    sys.stderr.flush()
                except OSError:
                    pass
            finally:
                os._exit(rc)
        os.close(job_r)
        os.close(answered)
        self.reaped = False
        try:
            self.pidfd = os.pidfd_open(self.pid)
        except (AttributeError, OSError):
            self.pidfd = None

    def _child(self, job_r, answered):
        sup = None
        if self.hint is not None:
            sup = Supervisor(None, None, self.hint)
            sup.isolation = ISOLATION
            try:
                sup.prepare()
            except OSError:  # run-stdio tries again, and says why it cannot
                if sup.cg is not None:
                    sup.cg.remove()
                sup = None
        msg = b""
        while True:  # the job: "<started> <jobdir>\n<request>"; EOF without one (the session ended): none
            chunk = os.read(job_r, 1 << 20)
            if not chunk:
                break
            msg += chunk
        head, _, data = msg.partition(b"\n")
        words = head.decode("utf-8", "replace").split(" ", 1)
        if len(words) != 2:
            if sup is not None:
                sup.abort()
            return 0
        return cmd_run_stdio(words[1], data, started=float(words[0]), isolation=ISOLATION, answered=answered,
                             prepared=sup)

    def send(self, jobdir, data, started):
        try:
            _write_all(self.job_w, ("%r %s\n" % (started, jobdir)).encode() + data)
        finally:
            os.close(self.job_w)
            self.job_w = None

    def discard(self):
        """A prepared job that gets none: it ends (its supervisor aborts) and is reaped."""
        if self.job_w is not None:
            os.close(self.job_w)
            self.job_w = None
        self.finish()
        for fd in (self.out, self.err):
            os.close(fd)

    def wait(self, stdin_fd):
        """The job's exit code once its answer is whole (0: run-stdio wrote its bundle, and goes on
        to remove the job's cgroups and dir; ``finish`` waits for that); None when the host spoke
        (or hung up) while it ran: then it was stopped."""
        while True:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.reaped = True
                return os.waitstatus_to_exitcode(status)
            watch = [stdin_fd, self.answered] + ([self.pidfd] if self.pidfd is not None else [])
            r, _, _ = select.select(watch, [], [], 1.0 if self.pidfd is not None else 0.005)
            if stdin_fd in r:
                self.stop()
                return None
            if self.answered in r and os.read(self.answered, 1) == b"0":
                return 0

    def finish(self):
        """Until the job's process has exited (after its answer: its cleanup)."""
        os.close(self.answered)
        if not self.reaped:
            try:
                os.waitpid(self.pid, 0)
            except ChildProcessError:
                pass
            self.reaped = True
        if self.pidfd is not None:
            os.close(self.pidfd)

    def stop(self):
        if self.reaped:
            return
        try:
            os.kill(self.pid, signal.SIGTERM)  # the supervisor stops the worker and sweeps its processes
        except OSError:
            pass
        give_up = time.monotonic() + 15.0
        while time.monotonic() < give_up and not self.reaped:
            if os.waitpid(self.pid, os.WNOHANG)[0]:
                self.reaped = True
                return
            time.sleep(0.005)
        if not self.reaped:
            try:
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
            except OSError:
                pass
            self.reaped = True

    def answer(self):
        return _slurp(self.out), _slurp(self.err, STDERR_TAIL)


SESSION_PID = [0]


def _same_cgroup_bounds(a, b):
    return a is not None and all(a[k] == b[k] for k in ("memory_mb", "max_procs"))


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
    job = ready = None
    try:
        _write_all(out, ("EDGETUNE-SESSION %d %d\n" % (PROTOCOL, os.getpid())).encode())
        warm = set()
        while True:
            head = _read_line(0)
            if head is None:
                if ready is not None:
                    ready.discard()
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
            try:
                limits = request_limits(req)
            except ValueError:
                limits = None  # run-stdio's answer says why
            if ready is not None and (limits is None or not _same_cgroup_bounds(ready.hint, limits)):
                ready.discard()
                ready = None
            job, ready = ready or _Job(limits), None
            job.send(os.path.join(jobs_dir, job_id), data, started)
            rc = job.wait(0)
            if rc is None:
                return 0  # the host spoke during a job: it gave up on it, and on this session
            body, err = job.answer()
            _write_all(out, ("RESULT %s %d %d %d\n" % (job_id, rc, len(body), len(err))).encode() + body + err)
            job.finish()  # its cleanup, while the host verifies the answer; never beside the next job
            job = None
            if req["backend"] not in warm:  # for the jobs after it: between jobs, never beside a timed run
                import_runtimes([req["backend"]])
                warm.add(req["backend"])
            if limits is not None:
                ready = _Job(limits)  # the next job's supervisor, prepared while the host verifies this one
    except _Stopped:
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)
        if job is not None:
            job.stop()
        if ready is not None:
            ready.discard()
        return 0
    except (BrokenPipeError, ConnectionError):  # the host is gone while we answered
        return 0
