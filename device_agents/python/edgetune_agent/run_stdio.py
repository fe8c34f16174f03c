"""``run-stdio JOBDIR``: the job as the host runs it, one round trip: the request on stdin, the job
under the supervisor, one bundle on stdout (result.json and every .npy), the job dir removed."""

import json
import os
import re
import sys
import time

from .common import AGENT, AGENT_VERSION, PROTOCOL
from .job import request_limits
from .supervisor import Supervisor, log_tail

BUNDLE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,123}\.npy$")  # the host's file-name rule, .npy only


def _bundle_files(jobdir, max_bytes):
    """The worker's result.json with the supervisor's fields appended (its last '}' found by
    scanning back over whitespace: nothing else of it is read) and its outputs: [(name, path,
    size)], or (None, why) when the result is unusable."""
    path = os.path.join(jobdir, "result.json")
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError as exc:
        return None, "crashed: cannot open the worker's result.json: %s" % exc.strerror
    try:
        size = os.fstat(fd).st_size
        if max_bytes is not None and size > max_bytes:
            return None, size
        tail = os.pread(fd, 4096, max(0, size - 4096))
    finally:
        os.close(fd)
    body = tail.rstrip()
    if not body.endswith(b"}"):
        return None, "crashed: the worker's result.json is not a JSON object"
    keep = size - (len(tail) - len(body)) - 1  # bytes before the closing brace
    empty = body[:-1].rstrip().endswith(b"{")
    files = [("result.json", path, keep, empty)]
    for name in sorted(os.listdir(jobdir)):
        if BUNDLE_NAME.match(name):
            p = os.path.join(jobdir, name)
            try:
                st = os.lstat(p)
            except OSError:
                continue
            if (st.st_mode & 0o170000) == 0o100000:  # regular files only, never a link
                files.append((name, p, st.st_size, None))
    return files, None


def _emit(out, entries):
    """Write a bundle: entries are (name, bytes) or (name, path, size[, suffix])."""
    out.write(b"EDGETUNE-BUNDLE 1\n")
    for name, data in entries:
        if isinstance(data, bytes):
            out.write(("%s %d\n" % (name, len(data))).encode() + data)
            continue
        path, size, suffix = data
        out.write(("%s %d\n" % (name, size + len(suffix))).encode())
        with open(path, "rb") as f:
            left = size
            while left > 0:
                chunk = f.read(min(left, 1 << 20))
                if not chunk:  # cannot happen: every process of the job is dead
                    chunk = b"\0" * left
                out.write(chunk)
                left -= len(chunk)
        out.write(suffix)
    out.write(b"END\n")
    out.flush()


def cmd_run_stdio(jobdir, data=None, client=None, started=None, isolation=None, answered=None, prepared=None):
    """One round trip per job: request on stdin, result + outputs back as one bundle on stdout
    ("EDGETUNE-BUNDLE 1\n" {"NAME SIZE\n" bytes}* "END\n"); the job dir is removed afterwards.
    The job runs in a worker process under this one, the supervisor (PROTOCOL.md). A job the
    zygote serves comes with its request read already and the client's connection; one a session
    serves (session.py), with its request, what its worker is a fork of, and a pipe (``answered``)
    told when the bundle is whole, before the job's cgroups and dir are removed; and perhaps the
    job's supervisor, prepared before the job came (``prepared``: used if the job's bounds fit it)."""
    started = time.monotonic() if started is None else started
    if data is None:
        data = sys.stdin.buffer.read()
    os.makedirs(jobdir, exist_ok=True)
    with open(os.path.join(jobdir, "request.json"), "wb") as f:
        f.write(data)
    base = {"protocol": PROTOCOL, "agent": AGENT, "agent_version": AGENT_VERSION}
    try:
        req = json.loads(data.decode("utf-8"))
    except ValueError:
        req = None  # unreadable: the worker says so in its result
    try:
        limits = request_limits(req if isinstance(req, dict) else {})
    except ValueError as exc:
        if prepared is not None:
            prepared.abort()
        _emit(sys.stdout.buffer, [("result.json", json.dumps(
            dict(base, status="error", reason="bad request: %s" % exc)).encode())])
        _remove_jobdir(jobdir)
        return 0
    if prepared is not None and not prepared.fits(limits):
        prepared.abort()
        prepared = None
    sup = prepared or Supervisor(jobdir, started, limits)  # prepared: made ready before the job came (session.py)
    if prepared is None:
        sup.client = client
        sup.isolation = isolation
    try:
        if prepared is not None:
            sup.go(jobdir, started, limits)
        else:
            sup.start()
    except OSError as exc:  # no worker (fork refused, or the prepared one is gone): an answer all the same
        if sup.cg is not None:
            sup.cg.remove()
        _emit(sys.stdout.buffer, [("result.json", json.dumps(
            dict(base, status="error", reason="cannot start the job's worker: %s" % exc)).encode())])
        _remove_jobdir(jobdir)
        return 0
    violation = sup.watch()
    sup.sweep()
    synth = sup.outcome(violation)
    if violation and violation[0] == "signal":  # the host gave up on this job: nobody reads a bundle
        sup.cg.remove()
        _relay_log(jobdir)
        _remove_jobdir(jobdir)
        return 128 + sup.stop_signal
    entries = None
    if synth is None:
        files, why = _bundle_files(jobdir, limits["max_bundle_bytes"])
        if files is not None:
            suffix = json.dumps(sup.supervisor_fields())[1:].encode()  # '"k": v, ...}' after the worker's fields
            name, path, keep, empty = files[0]
            entries = [(name, (path, keep, (b"" if empty else b",") + suffix))]
            entries += [(n, (p, size, b"")) for n, p, size, _ in files[1:]]
            total = len(b"EDGETUNE-BUNDLE 1\n") + len(b"END\n") + sum(
                len(n) + 2 + len(str(d[1] + len(d[2]))) + d[1] + len(d[2]) for n, d in entries)
            if limits["max_bundle_bytes"] is not None and total > limits["max_bundle_bytes"]:
                why, entries = total, None
        if entries is None:
            if isinstance(why, int):
                synth = {"status": "error", "limit": "output", "reason": "result too large: the bundle is %d bytes "
                         "(limit %d bytes)" % (why, limits["max_bundle_bytes"])}
            else:
                synth = {"status": "crashed", "reason": why}
    if entries is None:
        result = dict(base, **synth)
        result.update(sup.supervisor_fields())
        entries = [("result.json", json.dumps(result).encode())]
    _relay_log(jobdir)
    try:
        _emit(sys.stdout.buffer, entries)
    except BrokenPipeError:
        pass
    if answered is not None:  # the answer is whole: a session sends it while this one cleans up
        try:
            sys.stderr.flush()
            os.write(answered, b"0")
        except OSError:
            pass
    sup.cg.remove()  # every process of the job is gone (the sweep): nothing of it is left to bound
    _remove_jobdir(jobdir)
    return 0


def _relay_log(jobdir):
    """The tail of what the worker printed, on the agent's stderr (diagnostics only)."""
    tail = log_tail(jobdir)
    if tail:
        try:
            sys.stderr.buffer.write(tail if tail.endswith(b"\n") else tail + b"\n")
            sys.stderr.flush()
        except OSError:
            pass


def _remove_jobdir(jobdir):
    import shutil

    shutil.rmtree(jobdir, ignore_errors=True)
