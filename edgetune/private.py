"""Private files and directories: what edgetune creates holding results, inventory, agents or
artifacts is readable by its owner only (directories 0700, files 0600), and a directory edgetune
is about to trust (a work dir its agent runs from) must be owned by the user and closed to others.

Another local user who pre-creates a predictable path (``/tmp/edgetune-...``) therefore gets a
refusal, never our agent run from their directory.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from edgetune.errors import UserInputError


def edgetune_home() -> Path:
    """Where edgetune keeps its state (database, inventory, artifacts); see ``private_home``."""
    return Path(os.environ.get("EDGETUNE_HOME") or Path.home() / ".edgetune")


DIR_MODE = 0o700
FILE_MODE = 0o600


class NotPrivate(UserInputError):
    """A directory edgetune would trust is owned by someone else or open to others."""


def check_private_dir(path: str | os.PathLike, what: str = "directory") -> Path:
    """Raise ``NotPrivate`` unless ``path`` is a real directory (not a symlink) owned by this user
    with no group/other permission bits."""
    p = Path(path)
    try:
        st = os.lstat(p)
    except OSError as exc:
        raise NotPrivate(f"{what} {p} cannot be checked: {exc.strerror or exc}") from None
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise NotPrivate(f"{what} {p} is not a directory (a link or a file is there); refusing to use it")
    if st.st_uid != os.getuid():
        raise NotPrivate(f"{what} {p} is owned by uid {st.st_uid}, not by you (uid {os.getuid()}); "
                         f"refusing to use it (someone else may have planted it)")
    if st.st_mode & 0o077:
        raise NotPrivate(f"{what} {p} has mode {stat.S_IMODE(st.st_mode):04o}, open to other users; "
                         f"refusing to use it (chmod 700 {p} if it is yours)")
    return p


def private_dir(path: str | os.PathLike, what: str = "directory") -> Path:
    """Create ``path`` (and missing parents) with mode 0700 when absent; then check it is private.
    An existing directory is never silently re-moded: one open to others is refused."""
    p = Path(path)
    if not p.exists() and not p.is_symlink():
        try:
            p.parent.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
            os.mkdir(p, DIR_MODE)
        except FileExistsError:
            pass  # another process created it: checked below like any existing one
        except OSError as exc:
            raise UserInputError(f"cannot create {what} {p}: {exc.strerror or exc}") from None
    return check_private_dir(p, what)


def create_private_file(path: str | os.PathLike) -> None:
    """Create an empty file with mode 0600 unless it exists (used before a library opens it)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, FILE_MODE)
    except FileExistsError:
        return
    os.close(fd)


def write_atomic_file(path: str | os.PathLike, data: bytes | str, mode: int = FILE_MODE) -> Path:
    """Write ``path`` whole or not at all: a new temporary file beside it (created exclusively, a
    name of its own per call, so threads and processes never share one), given ``mode``, then
    renamed over ``path``. An OSError propagates, and leaves no temporary file behind."""
    p = Path(path)
    raw = data.encode() if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), mode)
            f.write(raw)
        os.replace(tmp, p)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return p


def write_private(path: str | os.PathLike, data: bytes | str) -> None:
    """Write ``path`` atomically (temp file + rename) with mode 0600."""
    write_atomic_file(path, data, FILE_MODE)
