"""The adbd emulator against both real adb binaries (Debian's and the one bundled in adbutils):
CLI shell v1/v2, push/pull/ls (sync v1 and v2), banner, AUTH refusal, several phones, SIGTERM."""

from __future__ import annotations

import ctypes
import hashlib
import os
import signal
import subprocess
import time

import pytest

from edgetune.errors import AuthError, DeviceUnreachable
from tests.farm.adb_fixtures import adb_transport_for


@pytest.fixture(params=["system-adb", "bundled-adb"])
def farm(request):
    return request.getfixturevalue("adb_farm" if request.param == "system-adb" else "adb_farm_bundled")


def _sh(farm, *args, phone=None, **kw):
    return farm.adb("-s", (phone or farm.phone).serial, *args, **kw)


def test_banner_in_device_list(farm):
    out = farm.adb("devices", "-l").stdout.decode()
    line = next(l for l in out.splitlines() if l.startswith(farm.phone.serial))
    assert "device" in line.split()[1]
    assert "model:EdgetunePhone" in line and "product:edgetune_emu" in line
    assert "signature verified" in open(farm.phone.log).read()  # real RSA AUTH, not --no-auth


def test_cli_shell_v2_exit_code_and_streams(farm):
    r = _sh(farm, "shell", "echo out; echo err >&2; exit 5")
    assert (r.returncode, r.stdout, r.stderr) == (5, b"out\n", b"err\n")


def test_cli_shell_v1(farm):
    r = _sh(farm, "shell", "-x", "echo out; echo err >&2; exit 5")  # -x: no shell protocol
    assert r.returncode == 0 and sorted(r.stdout.splitlines()) == [b"err", b"out"] and r.stderr == b""


def test_cli_shell_stdin(farm):
    p = subprocess.run([farm.adb_bin, "-P", str(farm.adb_port), "-s", farm.phone.serial, "shell", "cat | wc -c"],
                       input=b"x" * 100000, capture_output=True, env=farm.env(), timeout=30)
    assert p.returncode == 0 and p.stdout.strip() == b"100000"


def test_cli_push_pull_ls(farm, tmp_path):
    payload = os.urandom(1_500_000)
    src = tmp_path / "in.bin"
    src.write_bytes(payload)
    remote_dir = f"/data/local/tmp/cli {farm.adb_bin.count('/')}/sub dir"
    r = _sh(farm, "push", str(src), f"{remote_dir}/a file.bin")
    assert r.returncode == 0, r
    r = _sh(farm, "pull", f"{remote_dir}/a file.bin", str(tmp_path / "out.bin"))
    assert r.returncode == 0, r
    assert hashlib.sha256((tmp_path / "out.bin").read_bytes()).digest() == hashlib.sha256(payload).digest()
    r = _sh(farm, "ls", remote_dir)
    assert r.returncode == 0 and b"a file.bin" in r.stdout
    r = _sh(farm, "pull", "/data/local/tmp/none-such", str(tmp_path / "x"))
    assert r.returncode != 0


def test_unknown_key_stays_unauthorized(farm, adb_farm_module, tmp_path):
    _, stranger = adb_farm_module.gen_adb_key(str(tmp_path / "stranger"))
    phone = farm.add_phone(name=f"locked{len(farm.phones)}", trust_server_key=False, extra_keys=[stranger],
                           wait_state=None)
    farm.wait_state(phone.serial, "unauthorized")
    time.sleep(0.5)
    assert farm.state(phone.serial) == "unauthorized"
    r = _sh(farm, "shell", "true", phone=phone)
    assert r.returncode != 0 and b"unauthorized" in (r.stdout + r.stderr)
    with pytest.raises(AuthError):
        adb_transport_for(farm, phone).run(["true"], timeout=5)
    log = open(phone.log).read()
    assert "unknown public key" in log and "authorized" not in log.replace("unauthorized", "")
    # the phone's filesystem was never touched by a command
    assert os.listdir(phone.host_path("/data/local/tmp")) == []


def test_two_phones_are_separate(farm):
    if len([p for p in farm.phones if "second" in p.name]) == 0:
        farm.add_phone(name=f"second-{len(farm.phones)}")
    second = next(p for p in farm.phones if "second" in p.name)
    a, b = adb_transport_for(farm), adb_transport_for(farm, second)
    assert a.run(["getprop", "ro.serialno"], 10).stdout.strip() != b.run(["getprop", "ro.serialno"], 10).stdout.strip()
    assert b.run(["sh", "-c", "echo only-b > /data/local/tmp/mark"], 10).ok
    assert os.path.exists(second.host_path("/data/local/tmp/mark"))
    assert not os.path.exists(farm.phone.host_path("/data/local/tmp/mark"))


def test_sigterm_stops_cleanly_and_kills_commands(adb_farm):
    phone = adb_farm.add_phone(name="sigterm")
    t = adb_transport_for(adb_farm, phone)
    # a command still running on the phone when the emulator is told to stop
    runner = subprocess.Popen([adb_farm.adb_bin, "-P", str(adb_farm.adb_port), "-s", phone.serial, "shell",
                               "echo $$ > /data/local/tmp/long.pid; exec sleep 1000"],
                              env=adb_farm.env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        pidfile = phone.host_path("/data/local/tmp/long.pid")
        deadline = time.monotonic() + 10
        while not (os.path.exists(pidfile) and open(pidfile).read().strip()):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        pid = int(open(pidfile).read())
        os.kill(pid, 0)  # same pid namespace: the host can see it
        # The kernel may hand a process-directed SIGTERM to any thread; aim it at a worker thread,
        # the case where a main thread parked in accept() used to sleep through it.
        workers = [int(t) for t in os.listdir(f"/proc/{phone.proc.pid}/task") if int(t) != phone.proc.pid]
        assert workers, "the emulator serves the shell from worker threads"
        libc = ctypes.CDLL(None, use_errno=True)
        assert libc.tgkill(phone.proc.pid, workers[0], signal.SIGTERM) == 0, os.strerror(ctypes.get_errno())
        assert phone.proc.wait(timeout=10) == 0
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        else:
            pytest.fail("the phone's command survived the emulator")
        assert "stopped" in open(phone.log).read()
        assert runner.wait(timeout=10) is not None  # the adb client saw its stream end
        with pytest.raises(DeviceUnreachable):  # the phone is gone: one clear error, no hang
            t.run(["true"], timeout=5)
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait()


def test_pubkey_format_and_signature_check(adb_farm, adb_farm_module, tmp_path):
    """Our adbkey.pub codec matches what adb itself writes, and only the right key verifies."""
    import secrets

    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import padding, utils

    emu = adb_farm_module.adb_proto
    r = subprocess.run([adb_farm.adb_bin, "keygen", str(tmp_path / "k")], capture_output=True, timeout=60)
    assert r.returncode == 0, r
    priv = serialization.load_pem_private_key((tmp_path / "k").read_bytes(), password=None)
    n, e = emu.android_pubkey_decode((tmp_path / "k.pub").read_text())
    assert (n, e) == (priv.public_key().public_numbers().n, priv.public_key().public_numbers().e)
    assert emu.android_pubkey_encode(n, e, "x").split()[0] == (tmp_path / "k.pub").read_text().split()[0]
    token = secrets.token_bytes(20)
    sig = priv.sign(token, padding.PKCS1v15(), utils.Prehashed(hashes.SHA1()))
    assert emu.verify_token(n, e, token, sig)
    assert not emu.verify_token(n, e, secrets.token_bytes(20), sig)
    other_n, other_e = emu.android_pubkey_decode(adb_farm.pub_line)
    assert not emu.verify_token(other_n, other_e, token, sig)
