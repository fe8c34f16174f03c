"""Private key files for the ssh transport: whether one is passphrase-protected (edgetune does not
prompt: the error says what to do instead), and the PKCS#8 keys OpenSSH reads and paramiko does not."""

from __future__ import annotations

import base64
import io

import paramiko

from edgetune.errors import AuthError


def encrypted_key_error(path: str) -> AuthError:
    return AuthError(
        f"private key file {path} is encrypted (passphrase-protected); edgetune does not prompt for "
        f"passphrases: use a key without one kept for the device farm (ssh-keygen -t ed25519 -N '' -f "
        f"~/.ssh/edgetune_farm; append ~/.ssh/edgetune_farm.pub to the device's ~/.ssh/authorized_keys; "
        f"then edgetune devices add NAME URL --key ~/.ssh/edgetune_farm)"
    )


def key_file_is_encrypted(path: str) -> bool:
    """Whether a private key file is passphrase-protected, from its headers: PEM ("Proc-Type:
    4,ENCRYPTED"), PKCS#8 ("BEGIN ENCRYPTED PRIVATE KEY") or OpenSSH (a cipher other than "none"
    in the key's header). Reads the file only; nothing of it is kept or shown."""
    try:
        with open(path, "rb") as f:
            data = f.read(1 << 16)
    except OSError:
        return False
    if b"-----BEGIN ENCRYPTED PRIVATE KEY-----" in data or b"Proc-Type: 4,ENCRYPTED" in data:
        return True
    begin, end = b"-----BEGIN OPENSSH PRIVATE KEY-----", b"-----END OPENSSH PRIVATE KEY-----"
    if begin not in data:
        return False
    head = b"".join(data.split(begin, 1)[1].split(end, 1)[0].split())[:128]  # the header: magic, cipher
    try:
        blob = base64.b64decode(head + b"=" * (-len(head) % 4))
    except ValueError:
        return False
    magic = b"openssh-key-v1\0"
    if not blob.startswith(magic) or len(blob) < len(magic) + 4:
        return False
    n = int.from_bytes(blob[len(magic):len(magic) + 4], "big")
    cipher = blob[len(magic) + 4:len(magic) + 4 + n]
    return cipher not in (b"", b"none")


def pkcs8_key(path: str) -> paramiko.PKey | None:
    """An unencrypted PKCS#8 key ("BEGIN PRIVATE KEY", ssh-keygen -m PKCS8), which OpenSSH reads and
    paramiko does not: re-encoded in memory in OpenSSH's format. None for anything else."""
    try:
        from cryptography.hazmat.primitives import serialization

        with open(path, "rb") as f:
            data = f.read(1 << 16)
        if b"-----BEGIN PRIVATE KEY-----" not in data:
            return None
        from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

        key = serialization.load_pem_private_key(data, password=None)
        classes = ((rsa.RSAPrivateKey, paramiko.RSAKey), (ec.EllipticCurvePrivateKey, paramiko.ECDSAKey),
                   (ed25519.Ed25519PrivateKey, paramiko.Ed25519Key))
        cls = next((c for t, c in classes if isinstance(key, t)), None)
        if cls is None:
            return None
        blob = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                 serialization.NoEncryption())
        return cls.from_private_key(io.StringIO(blob.decode()))
    except Exception:  # noqa: BLE001 - parsers raise anything; their text may quote the file
        return None
