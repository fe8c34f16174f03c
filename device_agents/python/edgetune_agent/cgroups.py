"""The job's own cgroups for memory and pids (PROTOCOL.md "The supervisor", cgroups), where the
device lets the agent make them."""

import os
import re
import signal
import time

from .common import _read_bytes


def pids_cgroup_max(max_procs):
    """pids.max counts threads too: room for every process's runtime threads above max_procs, which
    the poll enforces on processes alone. The cgroup is the backstop that stops a fork bomb between polls."""
    return max_procs + 64 + 16 * (os.cpu_count() or 1)


def _write_text(path, text):
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


class Cgroups:
    """The job's own cgroups for memory and pids, where the device lets the agent make them: a
    child of the agent's cgroup in a cgroup v2 hierarchy that has the controller (a delegated
    subtree), else in a writable cgroup v1 hierarchy of that controller. Any step that fails
    leaves that controller to the rlimit and the poll: a job never fails for want of a cgroup."""

    def __init__(self, tag, memory_mb, max_procs):
        self.dirs = {}  # controller -> (dir, version)
        self._made = []
        if os.environ.get("EDGETUNE_AGENT_CGROUP", "1") == "0":  # tests: the path phones without cgroups take
            return
        mounts, own = self._mounts(), self._own()
        for ctl, value, files in (("memory", memory_mb, self._memory_files), ("pids", max_procs, self._pids_files)):
            if value is None:
                continue
            try:
                made = self._make(ctl, tag, mounts, own)
                if made:
                    for name, text, needed in files(*made, value=value):
                        try:
                            _write_text(os.path.join(made[0], name), text)
                        except OSError:
                            if needed:
                                raise
                    self.dirs[ctl] = made
            except OSError:
                pass
        for d in list(self._made):
            if not any(d == v[0] for v in self.dirs.values()):
                self._rmdir(d)

    @staticmethod
    def _mounts():
        out = []  # (fstype, mount point, root in the hierarchy, super options)
        for line in (_read_bytes("/proc/self/mountinfo", 1 << 20) or b"").decode("utf-8", "replace").splitlines():
            left, _, right = line.partition(" - ")
            f, r = left.split(), right.split()
            if len(f) >= 5 and len(r) >= 3 and r[0] in ("cgroup", "cgroup2"):
                out.append((r[0], f[4], f[3], r[2].split(",")))
        return out

    @staticmethod
    def _own():
        out = {}  # controller ("" for v2) -> this process's cgroup path
        for line in (_read_bytes("/proc/self/cgroup", 65536) or b"").decode("utf-8", "replace").splitlines():
            parts = line.split(":", 2)
            if len(parts) == 3:
                for c in (parts[1].split(",") if parts[1] else [""]):
                    out[c] = parts[2]
        return out

    def _make(self, ctl, tag, mounts, own):
        for fstype, mnt, root, opts in mounts:
            path = own.get("" if fstype == "cgroup2" else ctl)
            if path is None or (fstype == "cgroup" and ctl not in opts):
                continue
            rel = path[len(root):] if root != "/" and path.startswith(root) else path
            base = os.path.join(mnt, rel.lstrip("/"))
            if fstype == "cgroup2":
                if ctl not in (_read_bytes(os.path.join(base, "cgroup.controllers")) or b"").decode().split():
                    continue
                if ctl not in (_read_bytes(os.path.join(base, "cgroup.subtree_control")) or b"").decode().split():
                    _write_text(os.path.join(base, "cgroup.subtree_control"), "+" + ctl)
            self._clean_stale(base)
            d = os.path.join(base, "edgetune-" + tag)
            if d not in self._made:
                os.mkdir(d, 0o700)
                self._made.append(d)
            if os.path.exists(os.path.join(d, ctl + ".max" if fstype == "cgroup2" else ctl + (
                    ".limit_in_bytes" if ctl == "memory" else ".max"))):
                return d, 2 if fstype == "cgroup2" else 1
        return None

    @staticmethod
    def _memory_files(d, version, value):
        limit = str(value << 20)
        if version == 2:  # swap off, and an OOM takes the whole job at once
            return [("memory.max", limit, True), ("memory.swap.max", "0", False), ("memory.oom.group", "1", False)]
        return [("memory.limit_in_bytes", limit, True), ("memory.memsw.limit_in_bytes", limit, False),
                ("memory.swappiness", "0", False)]

    @staticmethod
    def _pids_files(d, version, value):
        return [("pids.max", str(pids_cgroup_max(value)), True)]

    def _clean_stale(self, base):
        """Cgroups a killed supervisor left behind (its pid gone): their processes die here."""
        try:
            names = os.listdir(base)
        except OSError:
            return
        for name in names:
            if name.startswith("edgetune-") and name[9:].isdigit() and not os.path.exists("/proc/" + name[9:]):
                d = os.path.join(base, name)
                for _ in range(100):
                    pids = _pids_in(d)
                    if not pids:
                        break
                    for p in pids:
                        _kill(p)
                    time.sleep(0.001)
                self._rmdir(d)

    def add(self, pid):
        for ctl, (d, _) in list(self.dirs.items()):
            try:
                _write_text(os.path.join(d, "cgroup.procs"), str(pid))
            except OSError:
                del self.dirs[ctl]

    def has(self, ctl):
        return ctl in self.dirs

    def procs(self):
        """The job's processes (two v1 hierarchies hold the same ones: one is read)."""
        if not self.dirs:
            return set()
        return set(_pids_in(self.dirs["pids" if "pids" in self.dirs else "memory"][0]))

    def _memory_file(self, v1, v2):
        d, version = self.dirs["memory"]
        return _read_bytes(os.path.join(d, v2 if version == 2 else v1), 4096) or b""

    def oom_kills(self):
        """Processes of the job the kernel's OOM killer stopped in its memory cgroup (v1 kernels
        before 4.13 have no counter: then the times the limit was hit)."""
        if "memory" not in self.dirs:
            return 0
        m = re.search(rb"oom_kill (\d+)", self._memory_file("memory.oom_control", "memory.events"))
        if m:
            return int(m.group(1))
        if self.dirs["memory"][1] == 1:
            raw = self._memory_file("memory.failcnt", "")
            return int(raw) if raw.strip().isdigit() else 0
        return 0

    def memory_bytes(self, peak=False):
        if "memory" not in self.dirs:
            return None
        raw = self._memory_file("memory.max_usage_in_bytes" if peak else "memory.usage_in_bytes",
                                "memory.peak" if peak else "memory.current")
        return int(raw) if raw.strip().isdigit() else None

    def kill_all(self):
        for d, version in self.dirs.values():
            if version == 2 and os.path.exists(os.path.join(d, "cgroup.kill")):
                try:
                    _write_text(os.path.join(d, "cgroup.kill"), "1")
                except OSError:
                    pass
        for p in self.procs():
            _kill(p)

    def remove(self):
        for d in self._made:
            self._rmdir(d)
        self._made = []

    @staticmethod
    def _rmdir(d):
        for _ in range(200):  # a killed task leaves its cgroup a moment after it was reaped
            try:
                os.rmdir(d)
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.001)


def _pids_in(d):
    raw = _read_bytes(os.path.join(d, "cgroup.procs"), 1 << 20) or b""
    return [int(x) for x in raw.split() if x.isdigit()]


def _kill(pid):
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
