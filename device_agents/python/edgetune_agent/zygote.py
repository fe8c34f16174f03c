"""The zygote (PROTOCOL.md "The zygote"): ``serve``, a process with the runtimes imported that forks
the supervisor of each job it is given, and the client side of ``run-stdio`` that hands it a job."""

import hashlib
import json
import os
import signal
import sys
import time

from .common import CODE_PARAMS, PR_SET_CHILD_SUBREAPER, _agent_file, _prctl, _read_bytes, sha256_file
from .run_stdio import cmd_run_stdio


# A job costs a process start plus the imports of numpy and its runtime (~0.35 s of ~0.46 s on the
# reference host). The zygote is a process per agent install with onnxruntime and LiteRT imported
# that forks the supervisor of each job it is given: the job still runs in a process of its own
# (a fork, under the same supervisor and bounds), without the imports. Only runtime configurations
# of those runtimes go there; code a candidate brings (adapters, custom-op libraries, TVM builds)
# starts in a fresh process, as does every job where the zygote is not running (it is started
# after such a job, for the next one) or cannot keep orphans (no subreaper: qemu-user).
# The client (``run-stdio``) reaches it on an abstract Unix socket named after the agent's path,
# checked to be the same user (SO_PEERCRED); a zygote whose agent file changed answers "stale"
# and exits, as it does when a variable the runtimes read at import differs from the client's
# (the job otherwise runs with its client's environment). It exits after ZYGOTE_IDLE_S without a
# job, or when its agent file is gone.
ZYGOTE_BACKENDS = ("ort", "tflite", "torch")
ZYGOTE_IDLE_S = float(os.environ.get("EDGETUNE_AGENT_ZYGOTE_IDLE_S") or 120.0)
# variables the runtimes read when imported: a client whose values differ gets a fresh process
ZYGOTE_ENV_AT_IMPORT = ("OMP_", "OPENBLAS_", "MKL_", "GOTO", "LD_", "PYTHON", "ORT_", "TF_", "TORCH", "CUDA_",
                        "EDGETUNE_AGENT_ZYGOTE")


# what a forked job of each backend finds imported (PyTorch where installed: its import and
# torch.compile's take ~1.6 s of a torch job; importing them starts no thread and touches no GPU,
# so a forked job is as a fresh one)
RUNTIME_MODULES = {"ort": ("numpy", "onnxruntime"),
                   "tflite": ("numpy", "ai_edge_litert.interpreter", "tflite_runtime.interpreter"),
                   "torch": ("numpy", "torch", "torch._dynamo")}


def import_runtimes(backends):
    """Import the runtimes of these backends here, for the jobs forked from this process."""
    env = dict(os.environ)
    for backend in backends:
        for mod in RUNTIME_MODULES.get(backend, ()):
            try:
                __import__(mod)
            except Exception:
                pass
    os.environ.clear()  # what an import set for itself (torch._dynamo: TORCHINDUCTOR_CACHE_DIR) is not this
    os.environ.update(env)  # process's environment, which a client's (a job's) must match


def zygote_eligible(req):
    if not isinstance(req, dict) or req.get("fresh_process") or req.get("backend") not in ZYGOTE_BACKENDS:
        return False
    params = req.get("params")
    if not isinstance(params, dict):
        return False
    if req.get("backend") == "torch" and params.get("device", "cpu") != "cpu":
        return False  # CUDA and fork: a GPU job of PyTorch starts fresh, whatever its imports touched
    return not any(k in params for k in CODE_PARAMS)


def _loads(data):
    try:
        return json.loads(data.decode("utf-8"))
    except ValueError:
        return None


def _zygote_name():
    key = hashlib.sha256(("%d:%s" % (os.getuid(), _agent_file())).encode()).hexdigest()[:32]
    return "\0edgetune-zygote-" + key


def _is_zygote(pid):
    """Whether the process is this agent's zygote as start_zygote starts it: this interpreter
    running this agent file with "serve" (a job's process never outlives its supervisor's sweep)."""
    raw = _read_bytes("/proc/%d/cmdline" % pid, 8192) or b""
    want = b"\0".join(os.fsencode(x) for x in (sys.executable, _agent_file(), "serve")) + b"\0"
    try:
        same_exe = os.path.realpath("/proc/%d/exe" % pid) == os.path.realpath(sys.executable)
    except OSError:
        return False
    return raw == want and same_exe


def _recv_line(sock, limit=256):
    buf = b""
    while not buf.endswith(b"\n") and len(buf) < limit:
        chunk = sock.recv(1)
        if not chunk:
            break
        buf += chunk
    return buf.decode("ascii", "replace").strip()


def via_zygote(jobdir, data, req):
    """Run the job (``data``, parsed: ``req``) on the zygote: its exit code, or None to run it here
    (no zygote, not eligible, stale). Once the zygote has taken the job ("go"), this process only
    waits and relays signals."""
    if os.environ.get("EDGETUNE_AGENT_ZYGOTE", "1") == "0":
        return None
    if not zygote_eligible(req) or not _prctl(PR_SET_CHILD_SUBREAPER, 1):
        return None  # without a subreaper a job's process could outlive it, and pose as the zygote
    import array
    import socket
    import struct

    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(_zygote_name())
        cred = s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        pid, uid, _ = struct.unpack("3i", cred)
        if uid != os.getuid() or not _is_zygote(pid):
            s.close()
            return None
    except OSError:
        s.close()
        return None
    try:
        head = json.dumps({"jobdir": os.path.abspath(jobdir), "agent_sha256": sha256_file(_agent_file()),
                           "size": len(data), "env": dict(os.environ)}).encode() + b"\n"
        s.sendmsg([head], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [1, 2]))])
        s.sendall(data)
        answer = _recv_line(s)
    except OSError:
        s.close()
        return None
    if not answer.startswith("go "):
        s.close()
        return None  # stale or refused: run it here
    pid = int(answer.split()[1])

    def relay(signum, frame):
        try:
            os.kill(pid, signum)
        except OSError:
            pass

    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, relay)
    try:
        end = _recv_line(s)
    except OSError:
        end = ""
    s.close()
    return int(end.split()[1]) if end.startswith("rc ") else 70


def start_zygote():
    """Start this agent's zygote in the background (detached; it exits by itself when idle)."""
    if os.environ.get("EDGETUNE_AGENT_ZYGOTE", "1") == "0":
        return
    try:
        pid = os.fork()
    except OSError:
        return
    if pid:
        try:
            os.waitpid(pid, 0)
        except OSError:
            pass
        return
    try:
        os.setsid()
        if os.fork():
            os._exit(0)
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.closerange(3, 65536)
        os.execv(sys.executable, [sys.executable, _agent_file(), "serve"])
    finally:
        os._exit(0)


def cmd_serve():
    import socket
    import struct

    me = _agent_file()
    my_sha = sha256_file(me)  # first: the bytes this process runs are the ones it vouches for
    if not _prctl(PR_SET_CHILD_SUBREAPER, 1):
        return 0  # no subreaper here: orphans of a forked job could escape the supervisor
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        srv.bind(_zygote_name())
    except OSError:
        return 0  # another zygote serves this agent
    srv.listen(16)
    import_runtimes(ZYGOTE_BACKENDS)
    stop = []
    signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
    srv.settimeout(1.0)
    last, children = time.monotonic(), set()
    while not stop:
        while True:  # the jobs, and their orphans (this is their subreaper)
            try:
                pid = os.waitpid(-1, os.WNOHANG)[0]
            except ChildProcessError:
                pid = 0
            if not pid:
                break
            children.discard(pid)
        if not os.path.exists(me) or (not children and time.monotonic() - last > ZYGOTE_IDLE_S):
            break
        try:
            conn, _ = srv.accept()
        except socket.timeout:
            continue
        except OSError:
            break
        cred = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        if struct.unpack("3i", cred)[1] != os.getuid():
            conn.close()
            continue
        last = time.monotonic()
        try:
            pid = os.fork()
        except OSError:
            conn.close()
            continue
        if pid == 0:
            rc = 70
            try:
                srv.close()
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                rc = _zygote_job(conn, my_sha)
            finally:
                os._exit(rc)
        conn.close()
        children.add(pid)
    srv.close()
    return 0


def _zygote_job(conn, my_sha):
    """One job in a child of the zygote: the client's stdout and stderr become ours, then the job
    runs exactly as run-stdio runs it."""
    import socket

    started = time.monotonic()
    msg, anc, _, _ = conn.recvmsg(1 << 20, socket.CMSG_SPACE(2 * 4))
    fds = []
    for level, kind, payload in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds += list(memoryview(payload).cast("i")[: len(payload) // 4])
    line, _, rest = msg.partition(b"\n")
    head = json.loads(line.decode("utf-8"))
    env = head.get("env") if isinstance(head.get("env"), dict) else {}
    imported = [k for k in set(env) | set(os.environ) if k.startswith(ZYGOTE_ENV_AT_IMPORT)
                and env.get(k) != os.environ.get(k)]
    if head.get("agent_sha256") != my_sha or len(fds) != 2 or imported:
        conn.sendall(b"stale\n")
        os.kill(os.getppid(), signal.SIGTERM)  # this zygote runs old code: let it go
        return 0
    data = rest
    while len(data) < head["size"]:
        chunk = conn.recv(min(1 << 20, head["size"] - len(data)))
        if not chunk:
            return 0
        data += chunk
    os.environ.clear()  # the job's environment is its client's (what the runtimes read at import agrees)
    os.environ.update({str(k): str(v) for k, v in env.items()})
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(fds[0], 1)
    os.dup2(fds[1], 2)
    for fd in (null, *fds):
        os.close(fd)
    conn.sendall(("go %d\n" % os.getpid()).encode())
    rc = cmd_run_stdio(head["jobdir"], data, client=conn, started=started)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except OSError:
        pass
    try:
        conn.sendall(("rc %d\n" % rc).encode())
    except OSError:
        pass
    return 0
