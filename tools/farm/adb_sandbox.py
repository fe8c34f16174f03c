"""The emulated phone's root filesystem (tools/farm/adbd_emu.py): host tools copied into
/system/bin, glibc and friends, /data/local/tmp, device nodes, /proc and /sys bind-mounted in a
mount namespace of the emulator's own."""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import shutil
import stat
import subprocess
import termios

from adb_proto import SHELL_UID, log

TOOLS = [
    "sh", "ls", "cat", "mkdir", "rm", "rmdir", "chmod", "chown", "sha256sum", "md5sum", "uname",
    "mv", "cp", "ln", "test", "[", "echo", "printf", "stat", "head", "tail", "kill", "sleep",
    "timeout", "nproc", "true", "false", "touch", "wc", "id", "env", "date", "dd", "df", "du",
    "tr", "cut", "sort", "uniq", "grep", "sed", "tee", "xargs", "find", "readlink", "realpath",
    "basename", "dirname", "pwd", "seq", "od", "cmp", "sync", "ps", "getconf", "yes", "mktemp", "tty",
]
EXTRA_LIBS = ["libm.so.6", "libstdc++.so.6", "libgcc_s.so.1", "libdl.so.2", "libpthread.so.0",
              "librt.so.1", "libresolv.so.2"]
DEV_NODES = {"null": (1, 3), "zero": (1, 5), "full": (1, 7), "random": (1, 8), "urandom": (1, 9)}


# ---------------------------------------------------------------------------------------------
# namespaces / sandbox

_libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
MS_RDONLY, MS_NOSUID, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 32, 4096, 16384, 1 << 18


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(src: str | None, dst: str, fstype: str | None, flags: int) -> None:
    _check(_libc.mount(src.encode() if src else None, dst.encode(),
                       fstype.encode() if fstype else None, ctypes.c_ulong(flags), None), f"mount {dst}")


class Sandbox:
    """The phone's root filesystem (see module doc)."""

    def __init__(self, root: str, props: dict[str, str]):
        self.root = os.path.realpath(root)
        self.props = props
        self.mountns = False
        self.userns = False
        self.shell_uid = 0

    # -- set-up, called before any thread starts (unshare(CLONE_NEWUSER) needs one thread)
    def setup(self) -> None:
        os.makedirs(self.root, exist_ok=True)
        self._enter_namespace()
        self.shell_uid = SHELL_UID if (os.geteuid() == 0 and not self.userns) else 0
        r = self.root
        for d in ("system/bin", "system/xbin", "system/etc", "vendor/bin", "data/local/tmp",
                  "sdcard", "dev", "proc", "sys", "mnt", "storage", "etc"):
            os.makedirs(os.path.join(r, d), exist_ok=True)
        os.chmod(os.path.join(r, "data/local/tmp"), 0o771)
        for d in ("data/local/tmp", "sdcard"):
            self._own(os.path.join(r, d))
        self._install_tools()
        self._write_props()
        self._setup_dev_proc()

    def _enter_namespace(self) -> None:
        try:
            if os.geteuid() == 0:
                _check(_libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
            else:
                uid, gid = os.geteuid(), os.getegid()
                _check(_libc.unshare(CLONE_NEWUSER | CLONE_NEWNS), "unshare(CLONE_NEWUSER|CLONE_NEWNS)")
                self.userns = True
                with open("/proc/self/setgroups", "w") as f:
                    f.write("deny")
                with open("/proc/self/uid_map", "w") as f:
                    f.write(f"0 {uid} 1")
                with open("/proc/self/gid_map", "w") as f:
                    f.write(f"0 {gid} 1")
            _mount(None, "/", None, MS_REC | MS_PRIVATE)
            self.mountns = True
        except OSError as exc:
            if os.geteuid() != 0:
                raise SystemExit(f"adbd_emu: cannot sandbox the phone: {exc} "
                                 "(need root or unprivileged user namespaces)")
            log(f"no private mount namespace ({exc}); /proc and /sys will be missing on the phone")

    def _own(self, path: str) -> None:
        if self.shell_uid:
            os.chown(path, self.shell_uid, self.shell_uid)

    def own(self, path: str, follow: bool = True) -> None:
        """Files the sync service creates belong to the shell user, as on a phone."""
        if self.shell_uid:
            os.chown(path, self.shell_uid, self.shell_uid, follow_symlinks=follow)

    def shell_may_write(self, host_dir: str) -> bool:
        """The sync service runs as root here; refuse what the shell user could not write."""
        if not self.shell_uid:
            return True
        st = os.stat(host_dir)
        if st.st_uid == self.shell_uid:
            return bool(st.st_mode & stat.S_IWUSR)
        if st.st_gid == self.shell_uid:
            return bool(st.st_mode & stat.S_IWGRP)
        return bool(st.st_mode & stat.S_IWOTH)

    def _install_tools(self) -> None:
        bindir = os.path.join(self.root, "system/bin")
        hostpath = "/usr/bin:/bin:/usr/sbin:/sbin"
        copied = []
        for name in TOOLS:
            src = shutil.which(name, path=hostpath)
            if name == "sh":
                src = shutil.which("dash", path=hostpath) or src
            if not src:
                continue
            dst = os.path.join(bindir, name)
            if not os.path.exists(dst):
                shutil.copy2(os.path.realpath(src), dst)
                os.chmod(dst, 0o755)
            copied.append(dst)
        for name, body in (("getprop", GETPROP), ("which", WHICH)):
            dst = os.path.join(bindir, name)
            with open(dst, "w") as f:
                f.write(body)
            os.chmod(dst, 0o755)
        self._install_libs(copied)

    def _install_libs(self, binaries: list[str]) -> None:
        out = subprocess.run(["ldd", *binaries], capture_output=True, text=True).stdout
        libs = set()
        for line in out.splitlines():
            line = line.strip()
            if line.endswith(":"):  # "FILE:" header when ldd is given several files
                continue
            if "=>" in line:
                path = line.split("=>", 1)[1].strip().split(" (")[0].strip()
            else:
                path = line.split(" (")[0].strip()
            if path.startswith("/"):
                libs.add(path)
        libdirs = {os.path.dirname(p) for p in libs if "libc.so" in p}
        for name in EXTRA_LIBS:
            for d in libdirs:
                if os.path.exists(os.path.join(d, name)):
                    libs.add(os.path.join(d, name))
        for path in sorted(libs):
            dst = os.path.join(self.root, path.lstrip("/"))
            if os.path.exists(dst):
                continue
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            shutil.copy2(os.path.realpath(path), dst)

    def _write_props(self) -> None:
        with open(os.path.join(self.root, "system/build.prop"), "w") as f:
            for k, v in self.props.items():
                f.write(f"{k}={v}\n")
        with open(os.path.join(self.root, "etc/hostname"), "w") as f:
            f.write(self.props.get("ro.serialno", "emu") + "\n")

    def _setup_dev_proc(self) -> None:
        dev = os.path.join(self.root, "dev")
        for name, (major, minor) in DEV_NODES.items():
            dst = os.path.join(dev, name)
            if self.mountns and os.path.exists(f"/dev/{name}"):
                if not os.path.exists(dst):
                    open(dst, "w").close()
                try:
                    _mount(f"/dev/{name}", dst, None, MS_BIND)
                    continue
                except OSError as exc:
                    log(f"bind /dev/{name}: {exc}")
            if not os.path.exists(dst) or not stat.S_ISCHR(os.stat(dst).st_mode):
                try:
                    if os.path.exists(dst):
                        os.unlink(dst)
                    os.mknod(dst, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
                except OSError as exc:
                    log(f"mknod /dev/{name}: {exc}")
        if self.mountns:
            for name in ("proc", "sys"):
                try:
                    _mount(f"/{name}", os.path.join(self.root, name), None, MS_BIND | MS_REC)
                except OSError as exc:
                    log(f"bind /{name}: {exc}")

    # -- per command
    def preexec(self, pty_slave: bool = False):
        root, uid = self.root, self.shell_uid

        def _fn():  # runs in the child between fork and exec: syscalls only
            os.chroot(root)
            os.chdir("/")
            if pty_slave:
                fcntl.ioctl(0, termios.TIOCSCTTY, 0)
            if uid:
                os.setgroups([])
                os.setgid(uid)
                os.setuid(uid)

        return _fn

    def env(self) -> dict[str, str]:
        return {
            "PATH": "/system/bin:/system/xbin:/vendor/bin",
            "HOME": "/",
            "TMPDIR": "/data/local/tmp",
            "ANDROID_DATA": "/data",
            "ANDROID_ROOT": "/system",
            "SHELL": "/system/bin/sh",
            "USER": "shell" if self.shell_uid else "root",
            "LOGNAME": "shell" if self.shell_uid else "root",
            "HOSTNAME": self.props.get("ro.serialno", "emu"),
            "TERM": "dumb",
            "LANG": "C.UTF-8",
        }

    def resolve(self, devpath: str, follow_last: bool = True) -> str:
        """Device path -> host path, with chroot semantics (symlinks stay inside the sandbox)."""
        parts = [p for p in devpath.split("/") if p and p != "."]
        cur: list[str] = []
        hops = 0
        while parts:
            p = parts.pop(0)
            if p == "..":
                if cur:
                    cur.pop()
                continue
            host = os.path.join(self.root, *cur, p)
            if (parts or follow_last) and os.path.islink(host):
                hops += 1
                if hops > 40:
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP))
                target = os.readlink(host)
                if target.startswith("/"):
                    cur = []
                parts = [x for x in target.split("/") if x and x != "."] + parts
                continue
            cur.append(p)
        return os.path.join(self.root, *cur)


GETPROP = r"""#!/system/bin/sh
# getprop [NAME [DEFAULT]]: Android's property lookup, from /system/build.prop
F=/system/build.prop
if [ $# -eq 0 ]; then
  while IFS='=' read -r k v; do [ -n "$k" ] && printf '[%s]: [%s]\n' "$k" "$v"; done < "$F"
  exit 0
fi
while IFS='=' read -r k v; do
  if [ "$k" = "$1" ]; then printf '%s\n' "$v"; exit 0; fi
done < "$F"
printf '%s\n' "${2-}"
"""

WHICH = r"""#!/system/bin/sh
rc=0
for a in "$@"; do
  p=$(command -v -- "$a") && case "$p" in /*) printf '%s\n' "$p";; *) rc=1;; esac || rc=1
done
exit $rc
"""
