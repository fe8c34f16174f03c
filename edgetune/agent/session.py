"""The host's side of the agent's session (device_agents/PROTOCOL.md "The session"): one agent
process per device connection, reached over the transport's stream, that serves every runtime
configuration. ``start`` opens one and reads its hello; ``exchange`` sends one job and reads the
answer that names it. AgentClient (host.py) decides which jobs go there and drops a session that
cannot serve on."""

from __future__ import annotations

import signal
import time
from typing import Sequence

from edgetune.devices.base import Completed, Stream, StreamTimeout, Transport

START_S = 30.0  # how long an agent session may take to say it is there
MAX_STDERR_FRAME = 1 << 20  # the most of a job's stderr tail a session may send


def start(transport: Transport, argv: Sequence[str], protocol: int) -> tuple[Stream | None, str | None]:
    """An open session speaking ``protocol``, or (None, why there is none): an agent that says it
    cannot (no subreaper: qemu-user), or that did not answer as a session."""
    stream = transport.open_stream(list(argv))
    try:
        hello = stream.read_line(time.monotonic() + START_S)
    except StreamTimeout:
        hello = None
    except BaseException:
        stream.kill()
        raise
    words = (hello or b"").decode("ascii", "replace").split(" ")
    if len(words) == 3 and words[0] == "EDGETUNE-SESSION" and words[1] == str(protocol) and words[2].isdigit():
        return stream, None
    stream.kill()
    if len(words) >= 3 and words[:2] == ["EDGETUNE-SESSION", "0"]:
        return None, " ".join(words[2:])
    return None, "no answer" if hello is None else "not an agent session"


def exchange(stream: Stream, job_id: bytes, data: bytes, deadline: float,
             max_output: int) -> tuple[Completed | None, bool]:
    """Run one job: what the agent answered, as run-stdio's Completed (None: refused, not a job a
    session serves), and whether the session can serve on after it. Past the deadline the answer
    is a timeout, and the session must go (its job is stopped and swept on the device)."""
    try:
        stream.send(b"JOB %s %d\n" % (job_id, len(data)) + data)
        return _answer(stream, job_id, deadline, max_output)
    except StreamTimeout:
        return Completed(-signal.SIGKILL, b"", b"", timed_out=True), False


def _answer(stream: Stream, job_id: bytes, deadline: float, max_output: int) -> tuple[Completed | None, bool]:
    head = stream.read_line(deadline)
    parts = head.split(b" ") if head is not None else []
    if len(parts) == 5 and parts[:2] == [b"RESULT", job_id] and parts[2] == b"refused":
        return None, True
    if not (len(parts) == 5 and parts[:2] == [b"RESULT", job_id] and all(p.lstrip(b"-").isdigit() for p in parts[2:])
            and int(parts[3]) >= 0 and 0 <= int(parts[4]) <= MAX_STDERR_FRAME):
        why = "ended before it answered" if head is None else "answered out of protocol"
        return Completed(70, b"", f"the agent session {why}".encode()), False
    rc, n_out, n_err = (int(p) for p in parts[2:])
    if n_out > max_output:  # a device cannot make us hold more: the session goes, like the command
        return Completed(-signal.SIGKILL, b"", b"", overflow=True), False
    out = stream.read_exact(n_out, deadline)
    err = stream.read_exact(n_err, deadline)
    if out is None or err is None:
        return Completed(70, b"", b"the agent session ended while it answered"), False
    return Completed(rc, out, err), True
