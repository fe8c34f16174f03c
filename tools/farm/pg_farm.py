"""A real PostgreSQL server for the lab database, on 127.0.0.1 only (DESIGN.md §6): ``initdb`` in a
directory of its own, ``pg_ctl start`` on a free port, trust authentication for one user
(loopback only). As root the server runs as the ``postgres`` user (PostgreSQL refuses root).

    python tools/farm/pg_farm.py start DIR     prints the database URL; stop with: ... stop DIR
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import sys
from pathlib import Path

USER = "edgetune"


def binary(name: str) -> str | None:
    """A PostgreSQL server program: on PATH, else Debian's versioned directory."""
    found = shutil.which(name)
    if found:
        return found
    hits = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return hits[-1] if hits else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _as_server_user(argv: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return argv
    return ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups", "--", *argv]


def start(base: Path) -> dict:
    initdb, pg_ctl = binary("initdb"), binary("pg_ctl")
    if not initdb or not pg_ctl:
        raise RuntimeError("PostgreSQL's server programs are missing (Debian: apt-get install postgresql)")
    base.mkdir(parents=True, exist_ok=True)
    data, sock = base / "data", base / "sock"
    sock.mkdir(exist_ok=True)
    if os.geteuid() == 0:
        pw = pwd.getpwnam("postgres")
        for p in (base, sock):
            os.chown(p, pw.pw_uid, pw.pw_gid)
    subprocess.run(_as_server_user([initdb, "-D", str(data), "-U", USER, "-A", "trust", "-E", "UTF8", "--no-sync",
                                    "--no-instructions"]), check=True, capture_output=True, timeout=300)
    port = _free_port()
    opts = f"-h 127.0.0.1 -p {port} -k {sock} -F -c fsync=off -c max_connections=200"
    proc = subprocess.run(_as_server_user([pg_ctl, "-D", str(data), "-o", opts, "-l", str(base / "server.log"),
                                           "-w", "-t", "60", "start"]), capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        log = (base / "server.log").read_text(errors="replace")[-2000:] if (base / "server.log").exists() else ""
        raise RuntimeError(f"pg_ctl start failed: {proc.stderr.strip()} {log}")
    return {"url": f"postgresql://{USER}@127.0.0.1:{port}/postgres", "port": port, "dir": str(base)}


def stop(base: Path) -> None:
    pg_ctl = binary("pg_ctl")
    if pg_ctl and (base / "data").exists():
        subprocess.run(_as_server_user([pg_ctl, "-D", str(base / "data"), "-m", "immediate", "-w", "stop"]),
                       capture_output=True, timeout=120)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("start", "stop"):
        sys.exit(__doc__)
    if sys.argv[1] == "start":
        print(start(Path(sys.argv[2]))["url"])
    else:
        stop(Path(sys.argv[2]))
