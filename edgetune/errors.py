"""One exception root for infrastructure errors.

Candidate failures (wrong numerics, crashes, hangs) are *data* (see ``edgetune.result``),
never exceptions. What raises is what stops the user's command: a missing model, an
unreachable device, an unwritable database. The CLI maps each class to one error line and
an exit code.
"""

from __future__ import annotations


class EdgetuneError(Exception):
    """Root of every error edgetune raises on purpose. ``str(err)`` is the one line shown."""

    exit_code = 1


class UserInputError(EdgetuneError):
    """The user asked for something that cannot be: bad model, shape, sweep, config key."""

    exit_code = 2


class ModelError(UserInputError):
    """Missing, unreadable, corrupt or unsupported model file."""


class DeviceError(EdgetuneError):
    """A device is unknown, unreachable, refuses us, or went away."""

    exit_code = 3


class DeviceUnreachable(DeviceError):
    """Connection refused / timed out / dropped. Retryable."""


class HostKeyMismatch(DeviceError):
    """The device's host key does not match known_hosts: never retried."""


class AuthError(DeviceError):
    """Authentication failed (bad key, refused key)."""


class TransportTimeout(DeviceError):
    """A remote command exceeded its timeout."""


class StoreError(EdgetuneError):
    """The database cannot be opened/written (path unwritable, wrong schema)."""

    exit_code = 4


class ToolchainError(EdgetuneError):
    """A compiler or runtime needed for a build is missing."""

    exit_code = 5


class MissingExtra(EdgetuneError):
    """An optional dependency is not installed; the message names the extra."""

    exit_code = 5

    def __init__(self, what: str, extra: str):
        super().__init__(f"{what} needs the '{extra}' extra: pip install 'edgetune[{extra}]'")
