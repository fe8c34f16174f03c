"""The local transport: the host itself, through the same interface as ssh and adb."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from typing import Sequence

from edgetune.devices.base import Completed
from edgetune.errors import DeviceError


class LocalTransport:
    kind = "local"
    address = "local"

    def __init__(self, env: dict[str, str] | None = None):
        self._env = env

    def run(self, argv: Sequence[str], timeout: float, stdin: bytes | None = None) -> Completed:
        argv = [str(a) for a in argv]
        try:
            # own process group so a hung candidate and anything it spawned die together
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=self._env,
                start_new_session=True,
            )
        except FileNotFoundError as exc:
            return Completed(127, b"", f"{argv[0]}: not found ({exc.strerror})".encode())
        except PermissionError as exc:
            return Completed(126, b"", f"{argv[0]}: {exc.strerror}".encode())
        try:
            out, err = proc.communicate(stdin, timeout=timeout)
            return Completed(proc.returncode, out, err)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            out, err = proc.communicate()
            return Completed(-signal.SIGKILL, out, err, timed_out=True)
        except BaseException:
            _kill_group(proc)
            proc.wait()
            raise

    def push(self, local: str, remote: str) -> None:
        _copy(local, remote)

    def pull(self, remote: str, local: str) -> None:
        _copy(remote, local)

    def close(self) -> None:
        pass


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _copy(src: str, dst: str) -> None:
    try:
        if os.path.abspath(src) == os.path.abspath(dst):
            return
        tmp = f"{dst}.part{os.getpid()}"
        shutil.copyfile(src, tmp)
        os.replace(tmp, dst)
    except OSError as exc:
        raise DeviceError(f"local copy {src} -> {dst} failed: {exc.strerror or exc}") from exc
