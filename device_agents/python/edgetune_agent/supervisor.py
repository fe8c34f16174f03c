"""``run-stdio``'s supervisor (PROTOCOL.md "The supervisor"): the worker it forks for the job, the
bounds it enforces by polling (time, processes, memory), the sweep that leaves nothing of the job
running, and what became of the worker."""

import json
import os
import re
import signal
import stat
import sys
import time

from .cgroups import Cgroups, _kill, pids_cgroup_max
from .common import PAGE, PR_SET_CHILD_SUBREAPER, PR_SET_PDEATHSIG, _prctl, _read_bytes
from .job import cmd_run


# run-stdio runs the job in a worker process and watches it from here (PROTOCOL.md "The supervisor").
# Every POLL_S the supervisor reaps, checks the deadline and looks at the job's processes: from
# its cgroups when it has them (cgroup.procs and the OOM counter: two small reads), else from
# /proc (a directory listing; only processes new since the last look are read, by their ppid)
# and the statm of each of the job's processes. 10 ms bounds how far past a bound a job gets (a
# deadline by 10 ms, a hog by what it can fault in in 10 ms, ~20-40 MB) while the supervisor
# sleeps nearly all the time: a timed call is interrupted at most once per 10 ms, for tens of
# microseconds, and only where supervisor and candidate share a core. When a look costs more (a
# large tree, a slow board) the supervisor sleeps 50 times as long as it worked, up to
# POLL_MAX_S: it never takes more than ~2% of one core from the candidate. Between looks it waits
# on a pidfd of the worker where the kernel has them (Linux 5.3+), so the worker's exit wakes it at
# once instead of up to a poll later.
POLL_S = 0.010
POLL_MAX_S = 0.1
WORK_FACTOR = 50
RESCAN_S = 1.0  # every process in /proc is read again this often (a pid reused since the last look)
PSS_EVERY_S = 0.2  # the costlier PSS confirmation of a tree over its memory bound, at most this often
SWEEP_POLL_MAX_S = 0.05  # the sweep looks again after 1, 2, 4 ... ms, then every 50 ms
SWEEP_GIVE_UP_S = 10.0  # a process that survives SIGKILL this long is in the kernel (D state): reported
LOG_NAME = "agent.log"  # the worker's stdout and stderr (relayed, its tail only, to the agent's stderr)
LOG_TAIL = 8192


def data_limit_bytes(memory_mb):
    """RLIMIT_DATA of the worker: a per-process backstop, not the bound itself. It counts writable
    memory reserved but never touched (8 MB per thread stack, allocator arenas, BLAS buffers: numpy
    alone reserves ~115 MB for ~47 MB resident, onnxruntime with 8 threads 179 MB for 78 MB), so at
    memory_mb it would refuse honest runtimes; the bound on resident memory is the cgroup or the poll.
    RLIMIT_AS (every mapping, even PROT_NONE reservations: 740 MB for that onnxruntime) is worse."""
    return (2 * memory_mb + 256) << 20


def proc_table():
    """pid -> (ppid, state) of every process in /proc."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        raw = _read_bytes("/proc/%s/stat" % name, 1024)
        if not raw:
            continue
        rest = raw[raw.rfind(b")") + 2:].split(None, 2)  # the name may hold ") "
        if len(rest) >= 2:
            out[int(name)] = (int(rest[1]), rest[0])
    return out


class Tree:
    """The job's processes (the supervisor's descendants) by ppid links in /proc, kept up to date
    cheaply: a process that is not the job's when first seen never becomes the job's (orphans go
    to the supervisor, a subreaper), so only processes new since the last look are read."""

    def __init__(self, root):
        self.root = root
        self.members = set()
        self.foreign = set()
        self.next_rescan = 0.0

    def refresh(self, now, stop=None):
        """The job's processes; past ``stop`` of them it stops reading and returns at once (a fork
        bomb is stopped at its first step past the bound, not after the supervisor read the
        thousands of processes it made meanwhile): then the set is incomplete."""
        if now >= self.next_rescan:
            self.foreign = set()
            self.next_rescan = now + RESCAN_S
        current = set(int(n) for n in os.listdir("/proc") if n.isdigit())
        self.members &= current
        self.foreign &= current
        pending = {}
        for pid in sorted(current - self.members - self.foreign - {self.root}):  # a parent mostly first
            raw = _read_bytes("/proc/%d/stat" % pid, 1024)
            if raw:
                ppid = int(raw[raw.rfind(b")") + 2:].split(None, 2)[1])
                if ppid == self.root or ppid in self.members:
                    self.members.add(pid)
                    if stop is not None and len(self.members) > stop:
                        return self.members
                else:
                    pending[pid] = ppid
        grew = True
        while grew:  # a new process may be the child of another new one
            grew = False
            for pid, ppid in list(pending.items()):
                if ppid == self.root or ppid in self.members:
                    self.members.add(pid)
                    del pending[pid]
                    grew = True
        self.foreign.update(pending)
        return self.members


def descendants(root, table):
    """Live (not zombie) descendants of root, by ppid links."""
    children = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = [], [root]
    while todo:
        for c in children.get(todo.pop(), ()):
            todo.append(c)
            if table[c][1] != b"Z":
                out.append(c)
    return out


def runs_this_job(pid, jobdir):
    """Whether a process (of this user) runs this very job although it is not in the supervisor's
    tree: without a subreaper (qemu-user refuses PR_SET_CHILD_SUBREAPER) an orphan of the job goes
    to init, but a fork of the agent still shows its command line, which ends in "run-stdio" and the
    job dir (unique per job). A process that execs or rewrites its argv escapes this."""
    try:
        if os.stat("/proc/%d" % pid).st_uid != os.getuid():
            return False
    except OSError:
        return False
    raw = _read_bytes("/proc/%d/cmdline" % pid, 8192) or b""
    return raw.endswith(b"\0run-stdio\0" + os.fsencode(jobdir) + b"\0")


def _pss_bytes(pid):
    raw = _read_bytes("/proc/%d/smaps_rollup" % pid, 4096)
    if raw is None:
        return None
    m = re.search(rb"\nPss:\s+(\d+) kB", b"\n" + raw)
    return int(m.group(1)) << 10 if m else None


def signal_name(sig):
    try:
        return signal.Signals(sig).name
    except ValueError:
        return "signal %d" % sig


def _rlimit_data_takes():
    """Whether RLIMIT_DATA binds here: qemu-user accepts it for a guest and ignores it."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    probe = (1 << 60) if hard == resource.RLIM_INFINITY else hard - PAGE
    try:
        resource.setrlimit(resource.RLIMIT_DATA, (probe, hard))
        took = resource.getrlimit(resource.RLIMIT_DATA)[0] == probe
        resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))
        return took
    except (ValueError, OSError):
        return False


def _user_tasks():
    """Tasks (threads) the real user has now: what RLIMIT_NPROC counts, across the whole device."""
    me, n = os.getuid(), 0
    for name in os.listdir("/proc"):
        try:
            if not name.isdigit() or os.stat("/proc/" + name).st_uid != me:
                continue
        except OSError:
            continue
        m = re.search(rb"\nThreads:\s+(\d+)", _read_bytes("/proc/%s/status" % name, 4096) or b"")
        n += int(m.group(1)) if m else 1
    return n


def _lower_rlimit(which, value):
    import resource

    _, hard = resource.getrlimit(which)
    if hard != resource.RLIM_INFINITY:
        value = min(value, hard)
    resource.setrlimit(which, (value, value))


class Supervisor:
    """One run-stdio job: the worker that runs it, the bounds it runs under, and what came of it."""

    def __init__(self, jobdir, started, limits):
        self.jobdir = jobdir
        self.started = started
        self.limits = limits
        self.me = os.getpid()
        self.worker = None
        self.worker_status = None  # (wait status, max resident KiB) once reaped
        self.members = []  # the job's live processes, as last seen
        self.tree = Tree(self.me)
        self.next_pss = 0.0
        self.rss = 0
        self.peak_bytes = 0
        self.peak_procs = 0
        self.leftover = 0
        self.unkillable = 0
        self.stop_signal = None
        self.cg = None
        self.nproc = None  # RLIMIT_NPROC of the worker, where set
        self.subreaper = False  # orphans of the job come to the supervisor
        self.enforced = {}
        self._go = None  # the pipe that tells the prepared worker its job
        self.rlimit_data = False
        self.pidfd = None  # the worker's pidfd, where there are pidfds: its exit wakes the poll
        self.client = None  # zygote-served job: the connection of the client that brought it
        self.isolation = None  # what the worker is a fork of, where not a fresh process (session.py)

    # -- set-up
    def start(self):
        self.prepare()
        self.go()

    def prepare(self):
        """All that comes before the job: the subreaper, the job's cgroups, and the worker forked
        into them, where it waits to be told its job (``go``). Only ``memory_mb`` and ``max_procs``
        of the limits are used here: a session prepares the next job's supervisor before that job
        comes (session.py), and uses it only for a job with the same two."""
        lim = self.limits
        self.subreaper = _prctl(PR_SET_CHILD_SUBREAPER, 1)  # orphans of the job, even after setsid + double fork
        self.cg = Cgroups(str(self.me), lim["memory_mb"], lim["max_procs"])
        self.rlimit_data = _rlimit_data_takes()
        # no pids cgroup: RLIMIT_NPROC stops a fork bomb in the kernel instead, between polls; it
        # counts every task of the user on the device (so: what it has now plus the job's
        # allowance) and binds no one running as root
        if lim["max_procs"] is not None and not self.cg.has("pids") and os.getuid() != 0:
            self.nproc = _user_tasks() + pids_cgroup_max(lim["max_procs"])
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        go_r, go_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(go_w)
                self._become_worker(go_r)
            finally:
                os._exit(70)
        os.close(go_r)
        self._go = go_w
        self.worker = pid
        try:
            self.pidfd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            self.pidfd = None
        try:
            os.setpgid(pid, pid)  # also done by the worker: whichever runs first
        except OSError:
            pass
        try:  # a job that saturates every core (a fork bomb) must not starve the one process that can
            # stop it: where it may (root, CAP_SYS_NICE) the supervisor, asleep nearly all the time,
            # takes the highest priority of the fair scheduler; the worker keeps the one it started with
            os.setpriority(os.PRIO_PROCESS, 0, -20)
        except (OSError, AttributeError):
            pass
        self.cg.add(pid)
        self.members = [pid]

    def fits(self, limits):
        """Whether this prepared supervisor can run a job with these limits."""
        return all(limits[k] == self.limits[k] for k in ("memory_mb", "max_procs"))

    def go(self, jobdir=None, started=None, limits=None):
        """The job: its dir, start and limits (those of ``prepare`` where not given) to the worker,
        which starts once it is in its cgroups."""
        if jobdir is not None:
            self.jobdir, self.started, self.limits = jobdir, started, limits
        lim = self.limits
        self.enforced = {
            "memory": None if lim["memory_mb"] is None else
            "cgroup" if self.cg.has("memory") else "rlimit+poll" if self.rlimit_data else "poll",
            "processes": None if lim["max_procs"] is None else
            "cgroup+poll" if self.cg.has("pids") else "rlimit+poll" if self.nproc else "poll",
            "time": None if lim["timeout_s"] is None else "supervisor",
            "output": None if lim["max_bundle_bytes"] is None else "supervisor",
            "leftovers": "subreaper" if self.subreaper else "process group+cmdline",
            "isolation": self.isolation or ("fork of the zygote" if self.client is not None else "fresh process"),
        }
        msg = json.dumps({"jobdir": self.jobdir, "max_bundle_bytes": lim["max_bundle_bytes"]}).encode()
        try:
            os.write(self._go, msg)
        finally:
            os.close(self._go)
            self._go = None

    def abort(self):
        """A prepared supervisor that gets no job: its worker ends, its cgroups go."""
        if self._go is not None:
            os.close(self._go)  # EOF without a job: the worker exits
            self._go = None
        try:
            os.waitpid(self.worker, 0)
        except ChildProcessError:
            pass
        self.worker_status = (0, 0)
        self.cg.remove()

    def _on_signal(self, signum, frame):
        self.stop_signal = signum

    def _become_worker(self, go_r):
        import resource

        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGXFSZ):
            signal.signal(sig, signal.SIG_DFL)
        if self.client is not None:  # the zygote's connection to the client is the supervisor's
            self.client.close()
        os.setpgid(0, 0)  # its own process group: killed as one
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != self.me:  # the supervisor died before the line above
            os._exit(70)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if self.limits["memory_mb"] is not None:
            _lower_rlimit(resource.RLIMIT_DATA, data_limit_bytes(self.limits["memory_mb"]))
        if self.nproc is not None:
            _lower_rlimit(resource.RLIMIT_NPROC, self.nproc)
        msg = b""  # the job (go): sent once the worker is in its cgroups; EOF without it: no job
        while True:
            chunk = os.read(go_r, 65536)
            if not chunk:
                break
            msg += chunk
        if not msg:
            os._exit(0)
        job = json.loads(msg.decode("utf-8"))
        self.jobdir = job["jobdir"]
        if job["max_bundle_bytes"] is not None:  # no file of the job may outgrow the whole bundle
            _lower_rlimit(resource.RLIMIT_FSIZE, job["max_bundle_bytes"])
        # nothing the candidate prints reaches the result stream, and it holds none of the transport's pipes
        log = os.open(os.path.join(self.jobdir, LOG_NAME), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        for fd in [int(x) for x in os.listdir("/proc/self/fd")]:  # the transport's pipes and sockets
            try:
                if fd > 2 and (stat.S_ISFIFO(os.fstat(fd).st_mode) or stat.S_ISSOCK(os.fstat(fd).st_mode)):
                    os.close(fd)
            except OSError:
                pass
        import faulthandler

        faulthandler.enable()  # a fatal signal writes where it struck to the log: the crash names it
        rc = cmd_run(self.jobdir)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)

    # -- watching
    def _reap(self):
        while True:
            try:
                pid, status, ru = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.worker:
                self.worker_status = (status, ru.ru_maxrss)

    def watch(self):
        """Until the worker exits or breaks a bound: (limit, reason) of the violation, or None."""
        while True:
            t0 = time.perf_counter()
            violation = self._poll()
            if violation is not False:
                return violation
            self._wait(min(POLL_MAX_S, max(POLL_S, WORK_FACTOR * (time.perf_counter() - t0))))

    def _wait(self, seconds):
        """Sleep until the next look, or until the worker exits (its pidfd turns readable)."""
        if self.pidfd is None:
            time.sleep(seconds)
            return
        import select

        try:
            select.select([self.pidfd], [], [], seconds)
        except (OSError, ValueError):
            self.pidfd = None
            time.sleep(seconds)

    def _poll(self):
        lim = self.limits
        self._reap()
        if self.worker_status is not None:
            return None
        if self.stop_signal is None and self.client is not None and _hung_up(self.client):
            self.stop_signal = signal.SIGHUP  # the host gave up on the job: its client is gone
        if self.stop_signal is not None:
            return "signal", "stopped by %s" % signal_name(self.stop_signal)
        now = time.monotonic()
        if lim["timeout_s"] is not None and now - self.started > lim["timeout_s"]:
            return "time", "hung: still running after %.2f s (limit %g s)" % (now - self.started, lim["timeout_s"])
        self.members = sorted(self.cg.procs() if self.cg.dirs else self.tree.refresh(now, lim["max_procs"]))
        if lim["memory_mb"] is not None and not self.cg.has("memory"):
            self.members = self._resident()  # drops zombies: they hold no memory and are no process any more
        n = len(self.members)
        self.peak_procs = max(self.peak_procs, n)
        if lim["max_procs"] is not None and n > lim["max_procs"]:
            self.leftover = n - 1
            return "processes", "too many processes: %s%d processes (limit %d)" % (
                "" if self.cg.dirs else "at least ", n, lim["max_procs"])
        if lim["memory_mb"] is not None:
            over = self._memory_over(now, lim["memory_mb"])
            if over:
                return "memory", over
        return False

    def _resident(self):
        self.rss = 0
        alive = []
        for p in self.members:
            raw = _read_bytes("/proc/%d/statm" % p, 256)
            fields = raw.split() if raw else ()
            if len(fields) > 1 and fields[0] != b"0":
                self.rss += int(fields[1]) * PAGE
                alive.append(p)
        return alive

    def _memory_over(self, now, memory_mb):
        limit = memory_mb << 20
        if self.cg.has("memory"):  # the kernel enforces it; the peak is read once, at the end
            kills = self.cg.oom_kills()
            if kills:
                peak = self.cg.memory_bytes(peak=True) or self.cg.memory_bytes() or 0
                return "out of memory: the kernel's OOM killer stopped %d process(es) of the job in its memory " \
                       "cgroup (peak %.1f MB; limit %d MB)" % (kills, peak / 2**20, memory_mb)
            return None
        rss, alive = self.rss, self.members
        self.peak_bytes = max(self.peak_bytes, rss)
        if rss <= limit or now < self.next_pss:
            return None
        # resident pages shared between forked processes count once in each: the proportional set
        # size (costlier: the kernel walks the page tables) confirms before the job is stopped
        t0 = time.perf_counter()
        pss = [_pss_bytes(p) for p in alive]
        self.next_pss = now + max(PSS_EVERY_S, WORK_FACTOR * (time.perf_counter() - t0))
        if None in pss:
            return "out of memory: %.1f MB resident in %d processes (limit %d MB)" % (rss / 2**20, len(alive), memory_mb)
        if sum(pss) > limit:
            return "out of memory: %.1f MB in %d processes (proportional set size; limit %d MB)" % (
                sum(pss) / 2**20, len(alive), memory_mb)
        return None

    # -- ending
    def sweep(self):
        """Kill every process of the job and reap until none is left. A fork bomb ends too: each
        pass kills all it finds, their children come to the supervisor (the subreaper), the next
        pass kills those; it is over when the supervisor has no child left at all."""
        give_up = time.monotonic() + SWEEP_GIVE_UP_S
        pause, killed = 0.0005, set()
        count = self.worker_status is not None  # a job that ended by itself: what it left running is counted
        while True:
            # the worker's whole group at once, first (a fork bomb that keeps its group cannot outrun
            # one kill); not reaped yet, the group id is still the job's
            if self.worker_status is None:
                try:
                    os.killpg(self.worker, signal.SIGKILL)
                except OSError:
                    pass
            table = proc_table()
            tree = set(descendants(self.me, table))
            if not self.subreaper:
                tree |= set(p for p, (_, state) in table.items() if p not in tree and p != self.me and state != b"Z"
                            and runs_this_job(p, self.jobdir))
            if count:
                self.leftover = len(tree - {self.worker})
                count = False
            live = (tree | self.cg.procs()) - {self.me}
            self.cg.kill_all()
            for p in live:
                _kill(p)
            self._reap()
            if not live and self._no_children():
                break
            if time.monotonic() > give_up:
                self.unkillable = len(live)
                break
            # killed processes need the CPU to exit: a supervisor (at the highest priority where it
            # may) that looked every millisecond took it from them, and on a loaded machine a killed
            # worker took 7 s to go. While the pass finds only processes it killed before, the looks
            # back off to SWEEP_POLL_MAX_S (the worker's exit ends the wait at once: its pidfd); a
            # new process (a fork bomb's) brings them back to every millisecond
            pause = 0.001 if live - killed else min(SWEEP_POLL_MAX_S, pause * 2)
            killed |= live
            if self.worker_status is None:
                self._wait(pause)
            else:
                time.sleep(pause)

    @staticmethod
    def _no_children():
        try:  # WNOWAIT: looks without reaping
            os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return True
        return False

    def outcome(self, violation):
        """(result to synthesise or None to relay the worker's, limit or None)."""
        lim = self.limits
        status, maxrss_kb = self.worker_status or (0, 0)
        self.peak_bytes = max(self.peak_bytes, maxrss_kb << 10, self.cg.memory_bytes(peak=True) or 0)
        if violation:
            limit, reason = violation
            return {"status": "error", "reason": reason, "limit": limit}
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            name = signal_name(sig)
            # an allocation refused under RLIMIT_DATA or the memory cgroup often ends as a NULL
            # dereference, an abort or the OOM killer's SIGKILL: past the bound, that is what it was
            if lim["memory_mb"] is not None and (self.cg.oom_kills() or (maxrss_kb << 10) > lim["memory_mb"] << 20):
                return {"status": "error", "limit": "memory",
                        "reason": "out of memory: the worker was killed by %s at %.1f MB resident (limit %d MB)"
                                  % (name, (maxrss_kb << 10) / 2**20, lim["memory_mb"])}
            if sig == signal.SIGXFSZ and lim["max_bundle_bytes"] is not None:
                return {"status": "error", "limit": "output",
                        "reason": "result too large: a file of the job grew past %d bytes (limit %d bytes)"
                                  % (lim["max_bundle_bytes"], lim["max_bundle_bytes"])}
            site = crash_site(self.jobdir)
            return {"status": "crashed", "signal": name,
                    "reason": "crashed: the worker was killed by %s%s" % (name, " in " + site if site else "")}
        if not os.path.isfile(os.path.join(self.jobdir, "result.json")):
            return {"status": "crashed", "reason": "crashed: the worker exited with status %d and no result"
                                                   % os.WEXITSTATUS(status)}
        return None

    def supervisor_fields(self):
        return {"limits_enforced": self.enforced, "leftover_processes": self.leftover,
                "usage": {"wall_s": round(time.monotonic() - self.started, 3),
                          "peak_memory_mb": round(self.peak_bytes / 2**20, 1), "peak_procs": self.peak_procs},
                **({"unkillable_processes": self.unkillable} if self.unkillable else {})}


_FAULT_FRAME = re.compile(r'^\s*File "([^"\n]{1,400})", line (\d+) in ([A-Za-z0-9_<>.]{1,80})\s*$')


def log_tail(jobdir):
    """The last LOG_TAIL bytes of what the worker printed (its log), or None when unreadable."""
    try:
        with open(os.path.join(jobdir, LOG_NAME), "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - LOG_TAIL))
            return f.read(LOG_TAIL)
    except OSError:
        return None


def crash_site(jobdir):
    """Where a fatal signal struck the worker, from faulthandler's dump in its log (the innermost
    Python frame of the crashing thread: "run (edgetune_agent.py:410)"), or None. The log is the
    candidate's output: only a line of faulthandler's own form is taken, and only its file's name."""
    tail = log_tail(jobdir)
    lines = tail.decode("utf-8", "replace").splitlines() if tail else []
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].startswith("Current thread") and "most recent call first" in lines[i]:
            m = _FAULT_FRAME.match(lines[i + 1]) if i + 1 < len(lines) else None
            if m:
                return "%s (%s:%s)" % (m.group(3), os.path.basename(m.group(1)), m.group(2))
            return None
    return None


def _hung_up(sock):
    """Whether the peer of a stream socket closed it (the zygote's client was killed)."""
    import select

    try:
        r, _, _ = select.select([sock], [], [], 0)
        return bool(r) and sock.recv(1, 0x40 | 0x2) == b""  # MSG_DONTWAIT | MSG_PEEK
    except (OSError, ValueError):
        return True
