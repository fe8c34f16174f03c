"""AdbTransport through the real adb server to the adbd emulator (tests/farm/adb_fixtures.py)."""

from __future__ import annotations

import hashlib
import os
import socket
import threading
import time

import pytest

from edgetune.devices.adb import AdbTransport
from edgetune.devices.base import MAX_STDERR, Transport
from edgetune.errors import DeviceError, DeviceUnreachable
from tests.farm.adb_fixtures import adb_transport_for

TMP = "/data/local/tmp"


def test_kind_address_and_protocol(adb_farm, adb_transport):
    assert isinstance(adb_transport, Transport)
    assert adb_transport.kind == "adb"
    assert adb_transport.address == f"adb://{adb_farm.phone.serial}@127.0.0.1:{adb_farm.adb_port}"
    assert AdbTransport("abc").address == "adb://abc"


def test_exit_code_stdout_stderr(adb_transport):
    r = adb_transport.run(["sh", "-c", "echo out; echo err >&2; exit 3"], timeout=10)
    assert (r.returncode, r.stdout, r.stderr, r.timed_out) == (3, b"out\n", b"err\n", False)
    assert adb_transport.run(["true"], timeout=10).ok
    assert adb_transport.run(["false"], timeout=10).returncode == 1


def test_killed_by_signal_and_missing_command(adb_transport):
    assert adb_transport.run(["sh", "-c", "kill -9 $$"], timeout=10).returncode == 128 + 9
    r = adb_transport.run(["no-such-tool-xyz"], timeout=10)
    assert r.returncode == 127 and b"not found" in r.stderr


def test_stdin_small_binary(adb_transport):
    data = bytes(range(256)) * 3 + b"\n\0end"
    r = adb_transport.run(["cat"], timeout=10, stdin=data)
    assert r.ok and r.stdout == data


def test_stdin_large_while_output_flows(adb_transport):
    data = os.urandom(3 * 1024 * 1024)
    r = adb_transport.run(["cat"], timeout=30, stdin=data)
    assert r.ok and hashlib.sha256(r.stdout).digest() == hashlib.sha256(data).digest()


def test_no_stdin_is_eof(adb_transport):
    t0 = time.monotonic()
    r = adb_transport.run(["cat"], timeout=10)
    assert r.ok and r.stdout == b"" and time.monotonic() - t0 < 5


def test_large_output_flow_control(adb_transport):
    r = adb_transport.run(["head", "-c", "6000000", "/dev/urandom"], timeout=30)
    assert r.ok and len(r.stdout) == 6_000_000
    r = adb_transport.run(["sh", "-c", "head -c 2000000 /dev/zero; head -c 1500000 /dev/zero >&2"], timeout=30)
    # stdout whole; stderr keeps its tail only (where a failure is said), whatever the device sends
    assert r.ok and len(r.stdout) == 2_000_000 and len(r.stderr) == MAX_STDERR


def test_timeout_kills_remote_process_group(adb_farm, adb_transport):
    d = f"{TMP}/timeout-test"
    assert adb_transport.run(["mkdir", "-p", d], timeout=10).ok
    t0 = time.monotonic()
    r = adb_transport.run(
        ["sh", "-c", f"echo $$ > {d}/sh.pid; sleep 100 & echo $! > {d}/child.pid; echo started; wait"],
        timeout=1.5)
    elapsed = time.monotonic() - t0
    assert r.timed_out and not r.ok and r.stdout == b"started\n"
    assert elapsed < 5
    pids = [adb_transport.run(["cat", f"{d}/{n}.pid"], timeout=10).text().strip() for n in ("sh", "child")]
    assert all(p.isdigit() for p in pids)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        alive = [p for p in pids if adb_transport.run(["kill", "-0", p], timeout=10).returncode == 0]
        if not alive:
            break
        time.sleep(0.1)
    assert not alive, f"still running on the phone: {alive}"


WEIRD = [
    "plain", "a b  c", "", " lead", "trail ", "it's", 'say "hi"', "back\\slash", "$HOME", "${PATH}",
    "$(touch /data/local/tmp/pwned1)", "`touch /data/local/tmp/pwned2`", "; touch /data/local/tmp/pwned3",
    "&& touch /data/local/tmp/pwned4", "| touch /data/local/tmp/pwned5", ">/data/local/tmp/pwned6", "*", "~",
    "line1\nline2\n", "tab\there", "héllo wörld ✓ 日本語", "-n", "--", "#comment", "!", "a=b", "\x01\x7f",
]


def test_arguments_are_never_interpreted(adb_farm, adb_transport):
    r = adb_transport.run(["printf", "%s\\0", *WEIRD], timeout=10)
    assert r.ok, r
    assert r.stdout.split(b"\0")[:-1] == [a.encode() for a in WEIRD]
    # the same through a second sh level: the argument reaches the script as one $1
    r = adb_transport.run(["sh", "-c", 'printf "%s" "$1"', "sh", "$(id) `id`; id && id | id"], timeout=10)
    assert r.stdout == b"$(id) `id`; id && id | id"
    for i in range(1, 7):
        assert not os.path.exists(adb_farm.phone.host_path(f"{TMP}/pwned{i}"))
    assert adb_transport.run(["sh", "-c", "ls /data/local/tmp | grep pwned"], timeout=10).returncode == 1


def test_push_pull_5mb_roundtrip_odd_paths(adb_farm, adb_transport, tmp_path):
    payload = os.urandom(5 * 1024 * 1024 + 123)
    digest = hashlib.sha256(payload).hexdigest()
    src = tmp_path / "src file.bin"
    src.write_bytes(payload)
    rdir = f"{TMP}/edgetune/dir with space/ünï 'q' $(x);y"
    remote = f"{rdir}/file, name \"1\".bin"
    assert adb_transport.run(["mkdir", "-p", rdir], timeout=10).ok
    adb_transport.push(str(src), remote)
    r = adb_transport.run(["sha256sum", remote], timeout=30)
    assert r.ok and r.text().split()[0] == digest
    # it really is in the phone's filesystem (the sandbox), where the host sees it too
    assert hashlib.sha256(open(adb_farm.phone.host_path(remote), "rb").read()).hexdigest() == digest
    dst = tmp_path / "back ü.bin"
    adb_transport.pull(remote, str(dst))
    assert hashlib.sha256(dst.read_bytes()).hexdigest() == digest
    assert not [p for p in os.listdir(tmp_path) if ".part" in p]


def test_pushed_executable_runs_with_mode(adb_transport, tmp_path):
    script = tmp_path / "tool.sh"
    script.write_text("#!/system/bin/sh\necho \"tool:$#:$1\"\n")
    script.chmod(0o755)
    data = tmp_path / "data.txt"
    data.write_text("x")
    data.chmod(0o644)
    d = f"{TMP}/edgetune/bin"
    assert adb_transport.run(["mkdir", "-p", d], timeout=10).ok
    adb_transport.push(str(script), f"{d}/tool")
    adb_transport.push(str(data), f"{d}/data.txt")
    r = adb_transport.run([f"{d}/tool", "a b"], timeout=10)
    assert r.ok and r.stdout == b"tool:1:a b\n"
    assert adb_transport.run(["test", "-x", f"{d}/data.txt"], timeout=10).returncode == 1


def test_pull_missing_and_push_readonly_fail_cleanly(adb_transport, tmp_path):
    dst = tmp_path / "nothing.bin"
    with pytest.raises(DeviceError, match="does not exist"):
        adb_transport.pull(f"{TMP}/no/such/file", str(dst))
    assert not dst.exists() and os.listdir(tmp_path) == []
    src = tmp_path / "x"
    src.write_bytes(b"x")
    with pytest.raises(DeviceError, match="push"):  # the shell user cannot write /system, as on a phone
        adb_transport.push(str(src), "/system/bin/evil")
    with pytest.raises(DeviceError):
        adb_transport.push(str(tmp_path / "missing-local"), f"{TMP}/x")


def test_unreachable_server_is_one_clear_line():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here
    t = AdbTransport("127.0.0.1:5555", adb_port=port, connect_timeout=2)
    with pytest.raises(DeviceUnreachable) as ei:
        t.run(["true"], timeout=5)
    msg = str(ei.value)
    assert "\n" not in msg and f"127.0.0.1:{port}" in msg and "unreachable" in msg
    with pytest.raises(OSError):  # and no server was started behind our back (adbutils would)
        socket.create_connection(("127.0.0.1", port), timeout=1).close()


def test_unknown_serial_is_unreachable(adb_farm):
    t = adb_transport_for(adb_farm, serial="127.0.0.1:1")
    with pytest.raises(DeviceUnreachable) as ei:
        t.run(["true"], timeout=5)
    assert "\n" not in str(ei.value) and "127.0.0.1:1" in str(ei.value)


def test_closed_transport_refuses(adb_farm):
    t = adb_transport_for(adb_farm)
    assert t.run(["true"], timeout=10).ok
    t.close()
    with pytest.raises(DeviceError):
        t.run(["true"], timeout=10)


def test_phone_is_a_phone(adb_transport):
    r = adb_transport.run(["sh", "-c", "command -v python3 || command -v python || echo no-python"], timeout=10)
    assert r.stdout == b"no-python\n"
    assert adb_transport.run(["sh", "-c", "ls /usr/bin/python3 /usr/bin/python /bin/sh"], timeout=10).returncode != 0
    assert adb_transport.run(["sh", "-c", "echo $PATH"], timeout=10).stdout == b"/system/bin:/system/xbin:/vendor/bin\n"
    assert adb_transport.run(["getprop", "ro.product.model"], timeout=10).stdout == b"EdgetunePhone\n"
    assert adb_transport.run(["getprop", "no.such.prop", "dflt"], timeout=10).stdout == b"dflt\n"
    assert b"[ro.build.version.sdk]: [34]" in adb_transport.run(["getprop"], timeout=10).stdout
    assert adb_transport.run(["id", "-u"], timeout=10).stdout in (b"2000\n", b"0\n")
    assert int(adb_transport.run(["nproc"], timeout=10).stdout) >= 1
    assert adb_transport.run(["uname", "-m"], timeout=10).ok
    assert adb_transport.run(["pwd"], timeout=10).stdout == b"/\n"


def test_concurrent_commands(adb_transport):
    errors = []

    def worker(i: int) -> None:
        for j in range(8):
            r = adb_transport.run(["sh", "-c", f"echo {i}-{j}; echo e{i} >&2; exit {j}"], timeout=20)
            if (r.stdout, r.stderr, r.returncode) != (f"{i}-{j}\n".encode(), f"e{i}\n".encode(), j):
                errors.append((i, j, r))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_command_that_closes_its_output_still_times_out(adb_transport):
    t0 = time.monotonic()
    r = adb_transport.run(["sh", "-c", "echo early; exec >&- 2>&-; sleep 100"], timeout=1.5)
    assert r.timed_out and r.stdout == b"early\n" and time.monotonic() - t0 < 6


def test_unread_stdin_does_not_hang(adb_transport):
    for data in (b"x" * 1000, os.urandom(4 * 1024 * 1024)):
        t0 = time.monotonic()
        r = adb_transport.run(["sh", "-c", "echo done"], timeout=20, stdin=data)
        assert r.ok and r.stdout == b"done\n" and time.monotonic() - t0 < 10


def test_a_flooding_command_is_cut_at_max_output_and_killed_at_once(adb_transport):
    t0 = time.monotonic()
    c = adb_transport.run(["sh", "-c", "while :; do echo edgetune; done"], timeout=60, max_output=1 << 20)
    assert c.overflow and not c.timed_out and len(c.stdout) == 1 << 20
    assert time.monotonic() - t0 < 10
