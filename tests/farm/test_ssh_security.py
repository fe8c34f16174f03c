"""Host keys, authentication, secrets, unreachable devices, dropped connections (real sshd)."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from edgetune.devices.ssh import SshTransport
from edgetune.errors import AuthError, DeviceUnreachable, HostKeyMismatch
from tests.farm.ssh_fixtures import transport_for


def _keygen(path, kind="ed25519"):
    subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-f", str(path)], check=True)
    return path


def _secret_lines(key_path) -> list[str]:
    """The base64 body lines of a private key file: what must never leak."""
    lines = open(key_path).read().splitlines()
    return [ln for ln in lines if ln and not ln.startswith("-----")]


@pytest.fixture
def debug_logs(caplog):
    caplog.set_level(logging.DEBUG)  # root: catches paramiko's and edgetune's records
    return caplog


def test_host_key_mismatch_is_refused_clearly(ssh_farm, tmp_path, debug_logs):
    other = _keygen(tmp_path / "impostor")
    keytype, b64 = open(f"{other}.pub").read().split()[:2]
    known = tmp_path / "known_hosts"
    name = f"[127.0.0.1]:{ssh_farm['port']}"
    known.write_text(f"{name} {keytype} {b64}\n")
    before = known.read_text()
    for tofu in (False, True):  # trust-on-first-use never overrides a known, different key
        t = transport_for(ssh_farm, known_hosts=str(known), trust_on_first_use=tofu)
        with pytest.raises(HostKeyMismatch) as exc:
            t.run(["true"], timeout=10)
        msg = str(exc.value)
        assert "MISMATCH" in msg and name in msg and str(known) in msg
        assert "ssh-keygen -R" in msg
        t.close()
    assert known.read_text() == before


def test_unknown_host_refused_without_tofu(ssh_farm, tmp_path):
    known = tmp_path / "known_hosts"
    t = transport_for(ssh_farm, known_hosts=str(known))
    with pytest.raises(HostKeyMismatch) as exc:
        t.run(["true"], timeout=10)
    msg = str(exc.value)
    assert "not in known_hosts" in msg and "--trust-on-first-use" in msg and str(known) in msg
    assert not known.exists()


def test_unknown_host_accepted_with_tofu_then_pinned(ssh_farm, tmp_path):
    known = tmp_path / "sub" / "known_hosts"  # parent directory created on demand
    t = transport_for(ssh_farm, known_hosts=str(known), trust_on_first_use=True)
    assert t.run(["echo", "ok"], timeout=10).stdout == b"ok\n"
    t.close()
    lines = known.read_text().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"[127.0.0.1]:{ssh_farm['port']} ")
    # the key it learned is the real one: a strict transport now connects...
    strict = transport_for(ssh_farm, known_hosts=str(known))
    assert strict.run(["true"], timeout=10).ok
    strict.close()
    # ...and so does OpenSSH's own client with that file (the line is in OpenSSH format)
    r = subprocess.run(
        ["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
         "-o", f"UserKnownHostsFile={known}", "-i", ssh_farm["key"], "-p", str(ssh_farm["port"]),
         f"{ssh_farm['user']}@127.0.0.1", "true"],
        capture_output=True, timeout=30,
    )
    assert r.returncode == 0, r.stderr


def test_wrong_key_is_auth_error_and_key_never_leaks(ssh_farm, tmp_path, debug_logs):
    wrong = _keygen(tmp_path / "not_authorized")
    t = transport_for(ssh_farm, key_filename=str(wrong))
    with pytest.raises(AuthError) as exc:
        t.run(["true"], timeout=10)
    assert str(wrong) in str(exc.value)  # names the file...
    for secret in _secret_lines(wrong):  # ...never its content
        assert secret not in str(exc.value)
        assert secret not in repr(exc.value)
        assert secret not in debug_logs.text
        assert secret not in repr(t)


def test_unusable_key_files_are_auth_errors_without_content(ssh_farm, tmp_path, debug_logs):
    garbage = tmp_path / "garbage_key"
    secret = "TOP-SECRET-PAYLOAD-a9f3c1"
    garbage.write_text(f"-----BEGIN OPENSSH PRIVATE KEY-----\n{secret}\n-----END OPENSSH PRIVATE KEY-----\n")
    encrypted = tmp_path / "encrypted_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "hunter2-passphrase", "-f",
                    str(encrypted)], check=True)
    for path, needle in ((garbage, secret), (encrypted, "hunter2-passphrase")):
        t = transport_for(ssh_farm, key_filename=str(path))
        with pytest.raises(AuthError) as exc:
            t.connect()
        assert str(path) in str(exc.value)
        assert needle not in str(exc.value)
        for line in _secret_lines(path):
            assert line not in str(exc.value) and line not in debug_logs.text
    with pytest.raises(AuthError, match="does not exist"):
        transport_for(ssh_farm, key_filename=str(tmp_path / "nope")).connect()


# every format ssh-keygen writes: OpenSSH (the default), PEM and PKCS#8; paramiko raises a different
# exception (and wording) per format for an encrypted one
KEY_FORMATS = [("ed25519", None), ("ecdsa", None), ("rsa", None), ("ecdsa", "PEM"), ("rsa", "PEM"),
               ("ecdsa", "PKCS8"), ("rsa", "PKCS8")]
KEY_IDS = [f"{kind}-{fmt or 'openssh'}" for kind, fmt in KEY_FORMATS]
PASSPHRASE = "hunter2-passphrase"


def _keygen_as(path, kind, fmt, passphrase):
    subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", passphrase, "-f", str(path)]
                   + (["-m", fmt] if fmt else []), check=True)
    return path


def _offline_transport(tmp_path, key) -> SshTransport:
    """Keys are loaded before any connection: no server needed (nothing listens on port 9)."""
    return SshTransport("127.0.0.1", port=9, user="nobody", key_filename=str(key),
                        known_hosts=str(tmp_path / "known_hosts"), connect_timeout=2)


@pytest.mark.parametrize("kind,fmt", KEY_FORMATS, ids=KEY_IDS)
def test_encrypted_keys_say_so_with_a_way_out(tmp_path, debug_logs, kind, fmt):
    key = _keygen_as(tmp_path / f"{kind}_{fmt or 'openssh'}", kind, fmt, PASSPHRASE)
    t = _offline_transport(tmp_path, key)
    with pytest.raises(AuthError) as exc:
        t.connect()
    msg = str(exc.value)
    assert msg.startswith(f"private key file {key} is encrypted (passphrase-protected); edgetune does not "
                          f"prompt for passphrases: "), msg
    assert "ssh-keygen -t ed25519 -N '' -f ~/.ssh/edgetune_farm" in msg and "--key ~/.ssh/edgetune_farm" in msg
    assert "\n" not in msg
    assert exc.value.__cause__ is None and exc.value.__suppress_context__  # the parser's text is not chained
    for text in (msg, repr(exc.value), debug_logs.text, repr(t)):
        assert PASSPHRASE not in text
        for line in _secret_lines(key):
            assert line not in text


@pytest.mark.parametrize("kind,fmt", KEY_FORMATS, ids=KEY_IDS)
def test_unencrypted_keys_of_every_format_load(tmp_path, kind, fmt):
    key = _keygen_as(tmp_path / f"{kind}_{fmt or 'openssh'}", kind, fmt, "")
    assert _offline_transport(tmp_path, key)._load_key().get_name()


def test_devices_check_shows_the_encrypted_key_message(tmp_path):
    key = _keygen_as(tmp_path / "id_ed25519", "ed25519", None, PASSPHRASE)
    env = {**os.environ, "EDGETUNE_HOME": str(tmp_path / "home"), "COLUMNS": "400"}
    cli = [sys.executable, "-m", "edgetune.cli.main", "devices"]
    inv = ["--inventory", str(tmp_path / "devices.toml")]
    added = subprocess.run(cli + ["add", "pi", "ssh://nobody@127.0.0.1:9", "--key", str(key),
                                  "--known-hosts", str(tmp_path / "known_hosts")] + inv,
                           env=env, capture_output=True, text=True, timeout=60)
    assert added.returncode == 0, added.stderr
    for fmt in ("json", "table"):
        p = subprocess.run(cli + ["check", "pi", "--format", fmt] + inv, env=env, capture_output=True, text=True,
                           timeout=60)
        assert p.returncode == 3, p.stderr
        assert "is encrypted (passphrase-protected)" in p.stdout and "Traceback" not in p.stderr
        assert PASSPHRASE not in p.stdout + p.stderr
        if fmt == "json":
            (row,) = json.loads(p.stdout)
            assert row["health"] == "down" and "is encrypted (passphrase-protected)" in row["error"]


def test_good_connection_logs_no_key_material(ssh_farm, debug_logs):
    t = transport_for(ssh_farm)
    assert t.run(["true"], timeout=10).ok
    t.close()
    for line in _secret_lines(ssh_farm["key"]):
        assert line not in debug_logs.text


def test_connection_refused_is_unreachable(ssh_farm, ssh_farm_module):
    port = ssh_farm_module.free_port()  # nothing listens there
    t = transport_for(ssh_farm, port=port)
    with pytest.raises(DeviceUnreachable, match="connection refused"):
        t.run(["true"], timeout=5)
    assert t.address == f"ssh://{ssh_farm['user']}@127.0.0.1:{port}"


def test_silent_server_times_out_as_unreachable(ssh_farm):
    # a TCP listener that never speaks SSH: the handshake must give up after connect_timeout
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    try:
        t = transport_for(ssh_farm, port=srv.getsockname()[1], connect_timeout=1.0)
        t0 = time.monotonic()
        with pytest.raises(DeviceUnreachable):
            t.run(["true"], timeout=5)
        assert time.monotonic() - t0 < 10
    finally:
        srv.close()


def _server_side_sessions(farm_module, farm_info) -> list[int]:
    """sshd's per-connection processes (children of the listener)."""
    kids = farm_module._children()  # noqa: SLF001
    return kids.get(farm_info["pid"], [])


def test_dropped_connection_reconnects_lazily(ssh_farm, ssh_farm_module):
    t = transport_for(ssh_farm)
    try:
        assert t.run(["echo", "one"], timeout=10).stdout == b"one\n"
        assert t.connects == 1
        before = set(_server_side_sessions(ssh_farm_module, ssh_farm))
        # kill the server side of every open connection (ours among them)
        for pid in before:
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while t._t is not None and t._t.is_active() and time.monotonic() < deadline:  # noqa: SLF001
            time.sleep(0.02)
        assert t.run(["echo", "two"], timeout=10).stdout == b"two\n"
        assert t.connects == 2
    finally:
        t.close()


def test_connection_lost_mid_command_raises_then_recovers(ssh_farm):
    t = transport_for(ssh_farm)
    try:
        assert t.run(["true"], timeout=10).ok
        # the command's parent is sshd's process for this connection: killing it drops us
        with pytest.raises(DeviceUnreachable, match="connection lost"):
            t.run(["sh", "-c", "kill -9 $PPID; sleep 5"], timeout=20)
        assert t.run(["echo", "back"], timeout=10).stdout == b"back\n"
        assert t.connects == 2
    finally:
        t.close()


def test_push_after_drop_reconnects(ssh_farm, ssh_farm_module, tmp_path):
    t = transport_for(ssh_farm)
    try:
        src = tmp_path / "f"
        src.write_bytes(b"abc")
        t.push(str(src), f"{ssh_farm['home']}/f1")
        for pid in _server_side_sessions(ssh_farm_module, ssh_farm):
            os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)
        t.push(str(src), f"{ssh_farm['home']}/f2")
        assert t.run(["cat", f"{ssh_farm['home']}/f2"], timeout=10).stdout == b"abc"
    finally:
        t.close()
