"""The forging "python" (see tests/forgery/__init__.py): runs the real agent, rewrites its answer."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import numpy as np

MAGIC = b"EDGETUNE-BUNDLE 1\n"
HOSTILE = "[/bold][red]\x1b[2J\x1b]0;pwned\x07\x7f\u202e"


def parse(out: bytes) -> dict[str, bytes]:
    pos = out.index(MAGIC) + len(MAGIC)
    files = {}
    while True:
        nl = out.index(b"\n", pos)
        line = out[pos:nl].decode()
        if line == "END":
            return files
        name, size = line.rsplit(" ", 1)
        files[name] = out[nl + 1: nl + 1 + int(size)]
        pos = nl + 1 + int(size)


def emit(files: list[tuple[str, bytes]]) -> bytes:
    out = bytearray(MAGIC)
    for name, blob in files:
        out += f"{name} {len(blob)}\n".encode() + blob
    return bytes(out + b"END\n")


def npy_bytes(a: np.ndarray) -> bytes:
    b = io.BytesIO()
    np.save(b, a, allow_pickle=False)
    return b.getvalue()


def forge_result(scenario: str, res: dict, files: dict[str, bytes]) -> bytes | None:
    """Rewrite one real answer; returns the whole stdout to send, or None to send the bundle."""
    first_out = res["outputs"][0][0]
    s = res.get("samples_ns", [])
    if scenario == "negative-timings":
        res["samples_ns"] = [-x for x in s]
    elif scenario == "zero-timings":
        res["samples_ns"] = [0 for _ in s]
    elif scenario == "one-ns-timings":
        res["samples_ns"] = [1 for _ in s]
    elif scenario in ("nan-timings", "inf-timings"):
        res["samples_ns"] = ["NAN" if scenario == "nan-timings" else "INF" for _ in s]
    elif scenario == "huge-timings":
        res["samples_ns"] = [1e30 for _ in s]
    elif scenario == "float-timings":
        res["samples_ns"] = [x + 0.5 for x in s]
    elif scenario == "timings-longer-than-wall":
        res["samples_ns"] = [x + 10_000_000_000 for x in s]
    elif scenario == "too-few-samples":
        res["samples_ns"] = s[:1]
    elif scenario == "npz-output":
        b = io.BytesIO()
        np.savez(b, x=np.load(io.BytesIO(files[first_out])))
        files[first_out] = b.getvalue()
    elif scenario == "pickle-output":
        import pickle

        files[first_out] = pickle.dumps({"x": 1})
    elif scenario == "huge-npy-header":  # claims 40 GB of float32
        head = "{'descr': '<f4', 'fortran_order': False, 'shape': (10000000000,), }"
        head += " " * (63 - (len(head) + 10) % 64) + "\n"
        files[first_out] = b"\x93NUMPY\x01\x00" + len(head).to_bytes(2, "little") + head.encode() + b"\0" * 64
    elif scenario == "truncated-npy":
        files[first_out] = files[first_out][:-7]
    elif scenario == "samples-string":
        res["samples_ns"] = "fast"
    elif scenario == "outputs-int":
        res["outputs"] = 5
    elif scenario == "result-list":
        files["result.json"] = b"[1, 2, 3]"
        return None
    elif scenario == "result-deep":
        files["result.json"] = b"[" * 100000 + b"]" * 100000
        return None
    elif scenario == "missing-output-file":
        del files[first_out]
    elif scenario == "traversal-name":
        files["../../escape.npy"] = files.pop(first_out)
        res["outputs"][0][0] = "../../escape.npy"
    elif scenario == "duplicate-file":
        order = list(files.items()) + [(first_out, files[first_out])]
        files["result.json"] = json.dumps(res).encode()
        return emit([(n, b) if n != "result.json" else (n, files["result.json"]) for n, b in order])
    elif scenario == "timed-check-out-of-range":
        for c in res.get("timed_checks", []):
            c["iter"] = 10 ** 9
    elif scenario == "sha-not-hex":
        res["input_sha256_before"] = ["zz" * 32 for _ in res.get("input_sha256_before") or [0]]
    elif scenario == "big-field":
        res["reason"] = "x" * (64 << 20)
    elif scenario == "huge-stream":  # a gigabyte: the host must stop reading long before
        out = sys.stdout.buffer
        out.write(MAGIC + b"result.json %d\n" % (1 << 30))
        chunk = b"0" * (1 << 20)
        try:
            for _ in range(1024):
                out.write(chunk)
            out.flush()
        except (BrokenPipeError, OSError):
            pass
        os._exit(0)
    elif scenario == "long-reason":
        res = {"protocol": res["protocol"], "status": "error", "reason": "y" * (3 << 20)}
        files.clear()
    elif scenario in ("markup-reason", "escape-reason"):
        res = {"protocol": res["protocol"], "status": "error",
               "reason": HOSTILE if scenario == "markup-reason" else "\x1b[31mred\x1b[0m\r\nfake line\x1b]52;c;cGF5bG9hZA==\x07"}
        files.clear()
    elif scenario == "garbage-stdout":
        sys.stdout.buffer.write(b"\xff\xfe garbage, no bundle\n")
        os._exit(0)
    files["result.json"] = json.dumps(res).encode().replace(b'"NAN"', b"NaN").replace(b'"INF"', b"Infinity")
    return None


def forge_info(scenario: str, raw: bytes) -> bytes:
    info = json.loads(raw.strip().splitlines()[-1])
    if scenario == "info-not-json":
        return b"{not json\n"
    if scenario == "info-list":
        return b"[1, 2]\n"
    if scenario == "info-fingerprint-string":
        info["fingerprint"] = "x"
    elif scenario == "info-huge":
        info["fingerprint"]["cpu_model"] = "x" * (1 << 20)
    elif scenario == "info-markup":
        info["fingerprint"]["cpu_model"] = HOSTILE
        info["agent_version"] = HOSTILE
    return (json.dumps(info) + "\n").encode()


def forge_answer(scenario: str, out: bytes) -> bytes:
    """What the forger sends for one job whose real run-stdio stdout is ``out``."""
    if scenario == "honest" or scenario.startswith("info-") or MAGIC not in out:
        return out
    files = parse(out)
    res = json.loads(files["result.json"])
    if res.get("status") != "ok":  # nothing to forge on a failed job: pass it on
        return out
    whole = forge_result(scenario, res, files)
    return whole if whole is not None else emit(list(files.items()))


def session(real_argv: list[str], scenario_file: str) -> None:
    """The agent's session (PROTOCOL.md "The session"), forged: the host's jobs go to the real one,
    each answer comes back rewritten under the scenario set at that moment (re-read per job)."""
    import threading

    p = subprocess.Popen(real_argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def relay() -> None:
        while True:
            chunk = os.read(0, 1 << 16)
            if not chunk:
                p.stdin.close()
                return
            p.stdin.write(chunk)
            p.stdin.flush()

    threading.Thread(target=relay, daemon=True).start()
    out = sys.stdout.buffer
    while True:
        line = p.stdout.readline()
        if not line:
            sys.exit(p.wait())
        parts = line.split()
        if len(parts) != 5 or parts[0] != b"RESULT" or parts[2] == b"refused":
            out.write(line)
            out.flush()
            continue
        body, err = p.stdout.read(int(parts[3])), p.stdout.read(int(parts[4]))
        with open(scenario_file) as f:
            scenario = f.read().strip()
        ok = MAGIC in body and json.loads(parse(body)["result.json"]).get("status") == "ok"
        if ok and scenario == "huge-stream":  # a frame that says a gigabyte, and sends it
            out.write(b"RESULT %s 0 %d 0\n" % (parts[1], 1 << 30))
            try:
                for _ in range(1024):
                    out.write(b"0" * (1 << 20))
                out.flush()
            except (BrokenPipeError, OSError):
                pass
            os._exit(0)
        if ok and scenario == "garbage-stdout":  # no frame at all
            out.write(b"\xff\xfe garbage, no bundle\n")
            out.flush()
            os._exit(0)
        forged = forge_answer(scenario, body)
        out.write(b"RESULT %s %s %d %d\n" % (parts[1], parts[2], len(forged), len(err)) + forged + err)
        out.flush()


def main(real: str, scenario: str, scenario_file: str | None = None) -> None:
    args = sys.argv[1:]
    flags = []
    while args and args[0].startswith("-") and args[0] != "-c":  # interpreter flags (the host passes -S)
        flags.append(args.pop(0))
    if len(args) < 2 or not args[0].endswith("edgetune_agent.py") or args[1] not in ("info", "run-stdio", "session"):
        os.execv(real, [real] + flags + args)
    real_argv = [real] + flags
    if args[1] == "session" and scenario_file:
        session(real_argv + args, scenario_file)
    if args[1] == "info":
        p = subprocess.run(real_argv + args, capture_output=True)
        sys.stdout.buffer.write(forge_info(scenario, p.stdout) if scenario.startswith("info-") else p.stdout)
        sys.exit(p.returncode)
    p = subprocess.run(real_argv + args, input=sys.stdin.buffer.read(), capture_output=True)
    forged = forge_answer(scenario, p.stdout)
    sys.stdout.buffer.write(forged)
    sys.stdout.buffer.flush()
    if forged is p.stdout:
        sys.exit(p.returncode)
