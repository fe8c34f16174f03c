"""SshTransport against a real OpenSSH sshd on 127.0.0.1 (tools/farm/ssh_farm.py)."""

from __future__ import annotations

import hashlib
import os
import signal
import time

import pytest

from edgetune.devices.base import Completed, Transport
from edgetune.errors import DeviceError
from tests.farm.ssh_fixtures import transport_for


def _gone(pid: int, within: float = 5.0) -> bool:
    """The farm's sshd runs on this machine, so /proc shows the remote processes."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def test_is_a_transport(ssh_transport, ssh_farm):
    assert isinstance(ssh_transport, Transport)
    assert ssh_transport.kind == "ssh"
    assert ssh_transport.address == f"ssh://{ssh_farm['user']}@127.0.0.1:{ssh_farm['port']}"
    assert repr(ssh_transport) == f"SshTransport({ssh_transport.address})"


@pytest.mark.parametrize(
    "argv, code",
    [(["true"], 0), (["false"], 1), (["sh", "-c", "exit 42"], 42), (["sh", "-c", "exit 255"], 255)],
)
def test_exit_codes(ssh_transport, argv, code):
    r = ssh_transport.run(argv, timeout=10)
    assert isinstance(r, Completed)
    assert (r.returncode, r.timed_out) == (code, False)


def test_killed_by_signal_gives_negative_signal(ssh_transport):
    r = ssh_transport.run(["sh", "-c", "kill -SEGV $$"], timeout=10)
    assert r.returncode == -signal.SIGSEGV and not r.timed_out


def test_missing_program(ssh_transport):
    r = ssh_transport.run(["no-such-program-xyz"], timeout=10)
    assert r.returncode == 127
    assert b"no-such-program-xyz" in r.stderr


def test_stdout_stderr_are_separate_and_pid_line_is_stripped(ssh_transport):
    r = ssh_transport.run(["sh", "-c", "printf out; printf err >&2"], timeout=10)
    assert (r.stdout, r.stderr, r.returncode) == (b"out", b"err", 0)
    r = ssh_transport.run(["printf", "%s\\n", "edgetune-pid:1"], timeout=10)
    assert r.stdout == b"edgetune-pid:1\n"  # only the wrapper's own first line is removed


def test_stdin_binary_and_large(ssh_transport):
    data = os.urandom(3 * 1024 * 1024) + bytes(range(256))
    r = ssh_transport.run(["cat"], timeout=60, stdin=data)
    assert r.ok
    assert hashlib.sha256(r.stdout).hexdigest() == hashlib.sha256(data).hexdigest()
    r = ssh_transport.run(["sha256sum"], timeout=60, stdin=data)
    assert r.stdout.split()[0].decode() == hashlib.sha256(data).hexdigest()


def test_no_stdin_means_eof(ssh_transport):
    r = ssh_transport.run(["cat"], timeout=10)  # would hang if stdin were left open
    assert r.ok and r.stdout == b""


def test_timeout_kills_the_remote_process_group(ssh_transport, tmp_path):
    pidfile = tmp_path / "pids"
    script = f'echo $$ > "{pidfile}"; sleep 300 & echo $! >> "{pidfile}"; echo started; wait'
    t0 = time.monotonic()
    r = ssh_transport.run(["sh", "-c", script], timeout=1.5)
    elapsed = time.monotonic() - t0
    assert r.timed_out and r.returncode == -signal.SIGKILL and not r.ok
    assert r.stdout == b"started\n"
    assert elapsed < 8
    pids = [int(p) for p in pidfile.read_text().split()]
    assert len(pids) == 2
    for pid in pids:  # the command and the child it started in the background
        assert _gone(pid), f"remote pid {pid} survived the timeout"
        # and as the device sees it (a killed orphan may stay a zombie until init reaps it)
        deadline = time.monotonic() + 10
        while ssh_transport.run(["kill", "-0", str(pid)], timeout=10).returncode == 0:
            assert time.monotonic() < deadline, f"remote pid {pid} still signalable"
            time.sleep(0.1)
    assert ssh_transport.run(["echo", "still usable"], timeout=10).stdout == b"still usable\n"


def test_push_pull_5mb_sha256(ssh_transport, ssh_farm, tmp_path):
    src = tmp_path / "blob.bin"
    data = os.urandom(5 * 1024 * 1024)
    src.write_bytes(data)
    digest = hashlib.sha256(data).hexdigest()
    rdir = f"{ssh_farm['home']}/push-test"
    assert ssh_transport.run(["mkdir", "-p", rdir], timeout=10).ok
    remote = f"{rdir}/blob.bin"
    ssh_transport.push(str(src), remote)
    r = ssh_transport.run(["sha256sum", remote], timeout=30)
    assert r.stdout.split()[0].decode() == digest
    assert ssh_transport.run(["ls", "-a", rdir], timeout=10).stdout.split() == [b".", b"..", b"blob.bin"]
    back = tmp_path / "back.bin"
    ssh_transport.pull(remote, str(back))
    assert hashlib.sha256(back.read_bytes()).hexdigest() == digest
    assert sorted(p.name for p in tmp_path.iterdir()) == ["back.bin", "blob.bin"]  # no .part left


def test_push_keeps_the_executable_bit(ssh_transport, ssh_farm, tmp_path):
    script = tmp_path / "hello.sh"
    script.write_text("#!/bin/sh\necho hello from \"$1\"\n")
    script.chmod(0o755)
    remote = f"{ssh_farm['home']}/hello.sh"
    ssh_transport.push(str(script), remote)
    assert ssh_transport.run([remote, "a b"], timeout=10).stdout == b"hello from a b\n"


def test_push_pull_errors_are_device_errors(ssh_transport, ssh_farm, tmp_path):
    src = tmp_path / "x"
    src.write_bytes(b"x")
    with pytest.raises(DeviceError, match="push"):
        ssh_transport.push(str(src), f"{ssh_farm['home']}/no/such/dir/x")
    with pytest.raises(DeviceError, match="push"):
        ssh_transport.push(str(tmp_path / "missing"), f"{ssh_farm['home']}/x")
    with pytest.raises(DeviceError, match="pull"):
        ssh_transport.pull(f"{ssh_farm['home']}/does-not-exist", str(tmp_path / "y"))
    assert not (tmp_path / "y").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["x"]
    assert ssh_transport.run(["true"], timeout=10).ok  # the connection survives file errors


NASTY = [
    "a b",
    "  leading and trailing  ",
    "it's",
    'say "hi"',
    "$(touch {marker})",
    "`touch {marker}`",
    "; touch {marker}",
    "&& touch {marker} ||",
    "| touch {marker}",
    "> {marker}",
    "a\nb\n; touch {marker}",
    "ünïcødé ✓ 日本語",
    "*",
    "~",
    "$HOME",
    "${{PATH}}",
    "-n",
    "",
    "\\",
    "'\"'\"'",
    "\t tab",
]


def test_args_are_passed_verbatim_without_injection(ssh_transport, ssh_farm):
    marker = f"{ssh_farm['home']}/INJECTED"
    args = [a.format(marker=marker) for a in NASTY]
    r = ssh_transport.run(["printf", "%s\\0", *args], timeout=10)
    assert r.ok, r.stderr
    assert r.stdout.split(b"\0")[:-1] == [a.encode() for a in args]
    assert ssh_transport.run(["test", "-e", marker], timeout=10).returncode == 1
    assert not os.path.exists(marker)


def test_paths_with_spaces_quotes_and_unicode(ssh_transport, ssh_farm, tmp_path):
    rdir = f"{ssh_farm['home']}/dir with 'quotes' $(touch X) ; ü ✓"
    assert ssh_transport.run(["mkdir", "-p", rdir], timeout=10).ok
    src = tmp_path / "src file ü.txt"
    src.write_text("payload\n")
    remote = f"{rdir}/file \"name\" ü.txt"
    ssh_transport.push(str(src), remote)
    assert ssh_transport.run(["cat", remote], timeout=10).stdout == b"payload\n"
    dst = tmp_path / "back 'ü'.txt"
    ssh_transport.pull(remote, str(dst))
    assert dst.read_text() == "payload\n"
    assert not os.path.exists(f"{ssh_farm['home']}/X") and not os.path.exists("X")


def test_session_environment_is_clean(ssh_transport, ssh_farm):
    env = dict(
        line.split("=", 1)
        for line in ssh_transport.run(["env"], timeout=10).text().splitlines()
        if "=" in line
    )
    assert env["HOME"] == ssh_farm["home"]
    assert "PYENV_ROOT" not in env  # the login user's ~/.bashrc was not read


def test_concurrent_runs_share_one_connection(ssh_farm):
    import threading

    t = transport_for(ssh_farm)
    try:
        results = [None] * 8

        def work(i):
            results[i] = t.run(["sh", "-c", f"sleep 0.3; echo {i}"], timeout=20)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert [r.stdout for r in results] == [f"{i}\n".encode() for i in range(8)]
        assert t.connects == 1
    finally:
        t.close()


def test_command_that_closes_its_output_still_times_out(ssh_transport, tmp_path):
    pidfile = tmp_path / "pid"
    r = ssh_transport.run(
        ["sh", "-c", f'echo $$ > "{pidfile}"; exec >/dev/null 2>&1 </dev/null; sleep 300'],
        timeout=1.5,
    )
    assert r.timed_out
    assert _gone(int(pidfile.read_text()))


def test_unread_stdin_does_not_hang(ssh_transport):
    r = ssh_transport.run(["true"], timeout=20, stdin=os.urandom(8 * 1024 * 1024))
    assert r.ok
    r = ssh_transport.run(["head", "-c", "5"], timeout=20, stdin=b"x" * (8 * 1024 * 1024))
    assert r.ok and r.stdout == b"xxxxx"


def test_a_flooding_command_is_cut_at_max_output_and_killed_at_once(ssh_transport):
    """A device cannot make the host hold more than the caller's bound, nor keep it waiting."""
    t0 = time.monotonic()
    c = ssh_transport.run(["sh", "-c", "yes"], timeout=60, max_output=1 << 20)
    assert c.overflow and not c.timed_out and len(c.stdout) == 1 << 20
    assert time.monotonic() - t0 < 10
