#!/usr/bin/env python3
"""Start/stop the SSH part of the test farm: a real OpenSSH sshd on 127.0.0.1 (docs/design.md §6).

Two kinds of device, each in its own state directory:

* ``plain``: ``sshd -D -e -f STATE/sshd_config`` on a free high port, with host keys, a client key,
  an authorized_keys file and a known_hosts file generated into STATE.
* ``board`` (the "aarch64 board"): the same sshd, but started inside a new user + mount namespace
  whose *own* binfmt_misc instance (Linux >= 6.7) has qemu-aarch64 registered, so aarch64 ELF
  binaries pushed to it simply run (static ones directly, dynamic ones through
  ``QEMU_LD_PREFIX=/usr/aarch64-linux-gnu``). Nothing is registered system-wide. The board's sessions
  get ``EDGETUNE_EMULATED=qemu-aarch64`` (timings there are emulated and must never be compared
  with real ones) and a PATH whose first directory holds an aarch64 ``uname`` (run through qemu,
  so ``uname -m`` prints ``aarch64`` for real) plus the host shell tools a board has; no Python.

Sessions get a clean environment: ``SetEnv HOME=STATE/home`` (an empty directory, so the login
shell's ``~/.bashrc`` -- e.g. ``pyenv init``, ~45 ms -- is not read), ``PermitUserRC no``,
``PermitUserEnvironment no``, ``UsePAM no``; sftp is ``internal-sftp`` (no shell at all).
The login user is the one running this script (root here; then ``PermitRootLogin
prohibit-password``). The working directory of a session is the user's home from passwd.

CLI::

    python tools/farm/ssh_farm.py start --state DIR [--board]   # prints JSON info, returns
    python tools/farm/ssh_farm.py stop --state DIR              # kills sshd and its sessions by PID

Python: ``start(state, board=False) -> dict`` and ``stop(state)``; ``missing_parts(board)`` says
what is not installed.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

HOST = "127.0.0.1"
SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
QEMU_LD_PREFIX = "/usr/aarch64-linux-gnu"
CROSS_GCC = "aarch64-linux-gnu-gcc"
EMULATED = "qemu-aarch64"
# aarch64 ELF header (e_ident + e_type EXEC/DYN + e_machine 0xb7), as used by qemu's own binfmt conf
AARCH64_MAGIC = r"\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00"
AARCH64_MASK = r"\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff"
# host tools the board offers on PATH (a board has a shell and coreutils; it has no Python)
BOARD_TOOLS = (
    "sh", "bash", "cat", "chmod", "cp", "date", "dd", "echo", "env", "false", "grep", "head",
    "id", "kill", "ln", "ls", "mkdir", "mktemp", "mv", "nproc", "printf", "ps", "pwd", "readlink",
    "rm", "rmdir", "sed", "setsid", "sha256sum", "sleep", "stat", "sync", "tail", "tar", "tee",
    "test", "timeout", "touch", "tr", "true", "wc", "xargs", "sort", "uniq", "cut", "find",
    "basename", "dirname", "cmp", "expr", "seq", "md5sum", "du", "df", "awk", "which", "file",
)

UNAME_C = r"""
/* uname for the emulated board: built for aarch64 and run through qemu, whose uname(2) reports
   the emulated machine, so `uname -m` prints aarch64 because an aarch64 process asked. */
#include <stdio.h>
#include <string.h>
#include <sys/utsname.h>
int main(int argc, char **argv) {
    struct utsname u;
    const char *f[6];
    int n = 0, i, all = 0, want[6] = {0};
    if (uname(&u) != 0) { perror("uname"); return 1; }
    f[0] = u.sysname; f[1] = u.nodename; f[2] = u.release; f[3] = u.version; f[4] = u.machine;
    f[5] = "GNU/Linux";
    if (argc == 1) want[0] = 1;
    for (i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (a[0] != '-' || !a[1]) { fprintf(stderr, "uname: extra operand '%s'\n", a); return 1; }
        if (!strcmp(a, "--all")) { all = 1; continue; }
        for (a++; *a; a++) switch (*a) {
            case 'a': all = 1; break;
            case 's': want[0] = 1; break;  case 'n': want[1] = 1; break;
            case 'r': want[2] = 1; break;  case 'v': want[3] = 1; break;
            case 'm': case 'p': case 'i': want[4] = 1; break;
            case 'o': want[5] = 1; break;
            default: fprintf(stderr, "uname: invalid option -- '%c'\n", *a); return 1;
        }
    }
    for (i = 0; i < 6; i++) if (all || want[i]) { printf(n++ ? " %s" : "%s", f[i]); }
    printf("\n");
    return 0;
}
"""


# ---------------------------------------------------------------------------------------------
# what is needed


def qemu_binary() -> str | None:
    """The qemu-aarch64 interpreter to register: the static one if installed."""
    for name in ("qemu-aarch64-static", "qemu-aarch64"):
        path = shutil.which(name)
        if path:
            return os.path.realpath(path)
    return None


def missing_parts(board: bool = False) -> list[str]:
    missing = []
    if not os.path.exists(SSHD):
        missing.append("sshd (apt-get install openssh-server)")
    if not shutil.which("ssh-keygen"):
        missing.append("ssh-keygen (apt-get install openssh-client)")
    if board:
        if not qemu_binary():
            missing.append("qemu-aarch64 (apt-get install qemu-user or qemu-user-static)")
        if not shutil.which(CROSS_GCC):
            missing.append(f"{CROSS_GCC} (apt-get install gcc-aarch64-linux-gnu)")
        if not os.path.isdir(QEMU_LD_PREFIX + "/lib"):
            missing.append(f"{QEMU_LD_PREFIX} (apt-get install libc6-dev-arm64-cross)")
        if os.geteuid() != 0:
            missing.append("root (the board's sshd needs its privsep user mapped in the namespace)")
        if not shutil.which("unshare"):
            missing.append("unshare (util-linux)")
        elif not _userns_binfmt_works():
            missing.append("binfmt_misc in a user namespace (needs Linux >= 6.7 and user namespaces)")
    return missing


def _userns_binfmt_works() -> bool:
    """Can a fresh user namespace mount its own binfmt_misc? (Linux >= 6.7)"""
    probe = (
        "mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc"
        " && test -w /proc/sys/fs/binfmt_misc/register"
    )
    try:
        r = subprocess.run(
            ["unshare", "--user", "--map-root-user", "--mount", "--fork", "sh", "-c", probe],
            capture_output=True, timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


# ---------------------------------------------------------------------------------------------
# start / stop


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _keygen(path: Path, kind: str = "ed25519") -> None:
    if not path.exists():
        subprocess.run(
            ["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", f"edgetune-farm-{path.name}",
             "-f", str(path)],
            check=True, capture_output=True,
        )


def _host_key_lines(state: Path, port: int) -> str:
    lines = []
    for pub in sorted(state.glob("ssh_host_*_key.pub")):
        keytype, b64 = pub.read_text().split()[:2]
        lines.append(f"[{HOST}]:{port} {keytype} {b64}\n")
    return "".join(lines)


def _q(value, tokens: bool = False) -> str:
    """A double-quoted sshd_config argument (paths may hold spaces; %-tokens where expanded)."""
    text = str(value)
    if '"' in text or "\n" in text:
        raise RuntimeError(f"state path not usable in sshd_config: {text!r}")
    if tokens:
        text = text.replace("%", "%%")
    return f'"{text}"'


def _write_config(state: Path, port: int, user: str, board: bool) -> Path:
    home = state / "home"
    home.mkdir(exist_ok=True)
    env = [f"HOME={home}"]
    if board:
        env += [
            f"PATH={state / 'bin'}",
            f"QEMU_LD_PREFIX={QEMU_LD_PREFIX}",
            f"EDGETUNE_EMULATED={EMULATED}",
        ]
    lines = [
        f"Port {port}",
        f"ListenAddress {HOST}",
        *(f"HostKey {_q(k)}" for k in sorted(state.glob("ssh_host_*_key"))),
        f"PidFile {_q(state / 'sshd.pid')}",
        f"AuthorizedKeysFile {_q(state / 'authorized_keys', tokens=True)}",
        f"AllowUsers {user}",
        "PermitRootLogin prohibit-password",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "HostbasedAuthentication no",
        "UsePAM no",
        # the state dir may live under /tmp (world-writable): StrictModes would refuse the keys
        "StrictModes no",
        "PermitUserEnvironment no",
        "PermitUserRC no",
        "UseDNS no",
        "PrintMotd no",
        "PrintLastLog no",
        "X11Forwarding no",
        "AllowTcpForwarding no",
        "AllowAgentForwarding no",
        "PermitTunnel no",
        "MaxSessions 64",
        "MaxStartups 64:30:128",
        "LoginGraceTime 30",
        "ClientAliveInterval 0",
        "LogLevel VERBOSE",
        "Subsystem sftp internal-sftp",
        # quoted so a state path with spaces stays one assignment
        "SetEnv " + " ".join(_q(e) for e in env),
    ]
    config = state / "sshd_config"
    config.write_text("\n".join(lines) + "\n")
    return config


def _build_board_bin(state: Path) -> None:
    """STATE/bin: an aarch64 `uname` (runs through qemu) + symlinks to the host's shell tools."""
    bindir = state / "bin"
    bindir.mkdir(exist_ok=True)
    src = state / "uname.c"
    src.write_text(UNAME_C)
    uname = bindir / "uname"
    if not uname.exists():
        subprocess.run(
            [CROSS_GCC, "-static", "-O2", "-o", str(uname), str(src)], check=True,
            capture_output=True,
        )
    for tool in BOARD_TOOLS:
        path = shutil.which(tool, path="/usr/bin:/bin:/usr/sbin:/sbin")
        link = bindir / tool
        if path and not link.exists() and not link.is_symlink():
            link.symlink_to(os.path.realpath(path))


def _board_entry_script(state: Path, qemu: str) -> Path:
    """Runs as root of the new user namespace: mount its binfmt_misc, register qemu, exec sshd."""
    rule = f":edgetune-aarch64:M::{AARCH64_MAGIC}:{AARCH64_MASK}:{qemu}:F"
    script = state / "board-enter.sh"
    script.write_text(
        "#!/bin/sh\n"
        "# entered by tools/farm/ssh_farm.py inside `unshare --user --mount`\n"
        "set -eu\n"
        "mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc\n"
        f"printf '%s' '{rule}' > /proc/sys/fs/binfmt_misc/register\n"
        'exec "$@"\n'
    )
    script.chmod(0o755)
    return script


def _unshare_argv(state: Path) -> tuple[list[str], dict[str, str]]:
    """``unshare`` into a user + mount namespace in which sshd can still do privilege separation.

    sshd setuid()s to its privsep user, so that user must exist inside the namespace: as real
    root we map all ids 0..65535 to themselves. util-linux writes such maps through the setuid
    helpers newuidmap/newgidmap (package uidmap); root needs no helper, so STATE/shim holds two
    one-line stand-ins that write /proc/PID/{uid,gid}_map directly (the kernel allows it because
    the writer has CAP_SETUID/CAP_SETGID in the parent namespace).
    """
    shim = state / "shim"
    shim.mkdir(exist_ok=True)
    for name, mapfile in (("newuidmap", "uid_map"), ("newgidmap", "gid_map")):
        tool = shim / name
        tool.write_text(
            "#!/bin/sh\n"
            "# newuidmap PID INSIDE OUTSIDE COUNT (root: no subuid policy to apply)\n"
            f'pid=$1; shift; printf "%s %s %s\\n" "$@" > "/proc/$pid/{mapfile}"\n'
        )
        tool.chmod(0o755)
    argv = ["unshare", "--user", "--mount", "--fork", "--kill-child",
            "--map-users=0,0,65536", "--map-groups=0,0,65536", "--setgroups=allow"]
    env = dict(os.environ, PATH=f"{shim}:{os.environ.get('PATH', '/usr/bin:/bin')}")
    return argv, env


def _wait_ready(port: int, proc: subprocess.Popen, log: Path, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sshd exited with {proc.returncode}:\n{_tail(log)}")
        try:
            with socket.create_connection((HOST, port), timeout=1.0) as s:
                s.settimeout(2.0)
                if s.recv(64).startswith(b"SSH-"):
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"sshd not ready on {HOST}:{port} after {timeout}s:\n{_tail(log)}")


def _tail(path: Path, n: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def start(state: str | os.PathLike, board: bool = False) -> dict:
    """Start one farm sshd with its state in ``state``; returns its info (also in STATE/info.json)."""
    state = Path(state).resolve()
    if (state / "farm.pid").exists():
        stop(state)
    missing = missing_parts(board)
    if missing:
        raise RuntimeError("missing: " + "; ".join(missing))
    state.mkdir(parents=True, exist_ok=True)
    state.chmod(0o700)
    user = getpass.getuser()
    if os.geteuid() == 0:
        # sshd's privilege-separation directory
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
    _keygen(state / "ssh_host_ed25519_key", "ed25519")
    _keygen(state / "ssh_host_ecdsa_key", "ecdsa")
    _keygen(state / "client_key", "ed25519")
    shutil.copyfile(state / "client_key.pub", state / "authorized_keys")
    if board:
        _build_board_bin(state)
    log = state / "sshd.log"
    last_error = None
    for _attempt in range(5):  # the free port can be taken between probe and bind
        port = free_port()
        config = _write_config(state, port, user, board)
        argv = [SSHD, "-D", "-e", "-f", str(config)]
        env = None
        if board:
            prefix, env = _unshare_argv(state)
            argv = prefix + [str(_board_entry_script(state, qemu_binary()))] + argv
        with open(log, "ab") as logf:
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=logf, stderr=logf,
                start_new_session=True, close_fds=True, env=env,
            )
        (state / "farm.pid").write_text(f"{proc.pid}\n")
        try:
            _wait_ready(port, proc, log)
            break
        except RuntimeError as exc:
            last_error = exc
            _kill_tree(proc.pid)
            (state / "farm.pid").unlink(missing_ok=True)
            if "Address already in use" not in str(exc):
                raise
    else:
        raise RuntimeError(f"could not start sshd: {last_error}")
    known_hosts = state / "known_hosts"
    known_hosts.write_text(_host_key_lines(state, port))
    info = {
        "kind": "board" if board else "plain",
        "host": HOST,
        "port": port,
        "user": user,
        "key": str(state / "client_key"),
        "known_hosts": str(known_hosts),
        "pid": proc.pid,
        "state": str(state),
        "home": str(state / "home"),
        "log": str(log),
    }
    if board:
        info.update(arch="aarch64", emulated=EMULATED, qemu=qemu_binary(),
                    qemu_ld_prefix=QEMU_LD_PREFIX)
    (state / "info.json").write_text(json.dumps(info, indent=2) + "\n")
    # proc is deliberately not waited for: it outlives this process when run from the CLI
    proc.returncode = 0  # silence ResourceWarning "subprocess still running" in the parent
    return info


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read().decode("ascii", "replace")
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        kids.setdefault(ppid, []).append(int(entry))
    return kids


def descendants(pid: int) -> list[int]:
    """All descendants of pid (sshd's per-connection processes and their commands)."""
    kids = _children()
    out, todo = [], [pid]
    while todo:
        for child in kids.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _kill_tree(pid: int, timeout: float = 5.0) -> None:
    """Stop everything the listener left running (sessions outlive a stopped sshd), then it.

    Sessions go first so that their parent, still alive, reaps them (no zombies left to init).
    """
    _signal_and_wait(descendants(pid), timeout / 2)
    _signal_and_wait([pid, *descendants(pid)], timeout / 2)


def _signal_and_wait(pids: list[int], timeout: float) -> None:
    for p in pids:
        try:
            os.kill(p, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + timeout
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        for p in list(alive):
            try:
                os.waitpid(p, os.WNOHANG)  # reaps it when it is our own child
            except ChildProcessError:
                pass
            if not _alive(p):
                alive.remove(p)
        if alive:
            time.sleep(0.02)
    for p in alive:
        try:
            os.kill(p, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            os.waitpid(p, 0)
        except ChildProcessError:
            pass


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def stop(state: str | os.PathLike) -> bool:
    """Kill the farm sshd started in ``state`` (by its recorded PID) and its sessions."""
    state = Path(state)
    pidfile = state / "farm.pid"
    try:
        pid = int(pidfile.read_text().strip())
    except (OSError, ValueError):
        return False
    _kill_tree(pid)
    pidfile.unlink(missing_ok=True)
    (state / "sshd.pid").unlink(missing_ok=True)
    return True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("start", help="start an sshd (prints JSON info)")
    s.add_argument("--state", required=True, help="state directory (keys, config, log, pid)")
    s.add_argument("--board", action="store_true", help="the emulated aarch64 board (qemu-user)")
    t = sub.add_parser("stop", help="stop the sshd started with --state")
    t.add_argument("--state", required=True)
    args = p.parse_args(argv)
    if args.cmd == "start":
        try:
            info = start(args.state, board=args.board)
        except (RuntimeError, subprocess.CalledProcessError, OSError) as exc:
            print(f"ssh_farm: {exc}", file=sys.stderr)
            return 1
        print(json.dumps(info, indent=2))
        return 0
    stopped = stop(args.state)
    print(json.dumps({"stopped": stopped}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
