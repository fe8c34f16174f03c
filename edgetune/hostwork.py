"""Where the host side's heavy work runs: in this process (the default), or on a Ray cluster
(``--ray ADDRESS``) when a lab has one.

The heavy work is the host's, never a device's: the float64 host references of every shape point
(a model run per input set) and the TVM builds of the tvm-relax candidates. Measurements always
stay on the devices, driven from this process. The Ray cluster is part of the host side, trusted as
this host is (the devices are what is checked), and it must compute what this host would have:

* at connection, one task reports the cluster's edgetune, onnxruntime, TVM and numpy versions; any
  that differs from this host's is refused (the references and artifacts would not be this
  host's, and the records say which versions made them);
* every remote build reports its build identity (edgetune, TVM, the compiler that links it, its
  ``--version``); one that differs from the identity this host keys the artifact by is refused (the
  candidate's build fails, said so), never cached under a key that does not describe it.

The model travels once per task as bytes (``ray.put``), so the cluster's nodes need no shared
filesystem; built artifacts come back as bytes and are written here atomically. Without Ray,
nothing changes: references are computed here, builds run here when a candidate is prepared.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

import edgetune
from edgetune.build.identity import build_identity
from edgetune.build.tvm_kernel import resolve_cross_cc
from edgetune.build.tvm_relax import build_relax_model
from edgetune.errors import EdgetuneError, UserInputError
from edgetune.modelfile import load_model
from edgetune.private import write_atomic_file
from edgetune.workload import compute_reference


def _versions() -> dict[str, str]:
    """What makes the host's references and builds what they are."""
    import onnxruntime

    out = {"edgetune": edgetune.__version__, "onnxruntime": onnxruntime.__version__, "numpy": np.__version__}
    try:
        import tvm

        out["tvm"] = tvm.__version__
    except ImportError:
        out["tvm"] = "absent"
    return out


def _model_file(model_bytes: bytes, sha256: str, suffix: str) -> Path:
    """The model as a file on this (remote) node, written once per node and model."""
    d = Path(tempfile.gettempdir()) / f"edgetune-ray-{os.getuid()}"
    d.mkdir(mode=0o700, exist_ok=True)
    path = d / f"{sha256}{suffix}"
    if not path.exists() or hashlib.sha256(path.read_bytes()).hexdigest() != sha256:
        write_atomic_file(path, model_bytes)
    return path


def _remote_references(model_bytes: bytes, sha256: str, suffix: str, input_set: list[np.ndarray]) -> dict:
    """A Ray task: the host reference of one input set, and who computed it."""
    model = load_model(_model_file(model_bytes, sha256, suffix))
    if model.sha256 != sha256:
        raise EdgetuneError("the model changed on its way to the Ray node")
    return {"outputs": compute_reference(model, input_set), "pid": os.getpid(), "node": os.uname().nodename}


def _remote_build(model_bytes: bytes, sha256: str, suffix: str, shapes: dict, target: dict, cross_cc: str | None,
                  threads: int) -> dict:
    """A Ray task: one tvm-relax build, returned as bytes with the identity that made it."""
    path = _model_file(model_bytes, sha256, suffix)
    ident = build_identity(resolve_cross_cc(target, cross_cc), threads)
    with tempfile.TemporaryDirectory(prefix="edgetune-ray-build-") as d:
        out = build_relax_model(path, shapes, target, Path(d) / "model.so", cross_cc=cross_cc)
        data = out.read_bytes()
    return {"so": data, "identity": ident, "pid": os.getpid(), "node": os.uname().nodename}


class HostWork:
    """The host's heavy work, here or on a Ray cluster. ``address``: a Ray cluster's address
    (``ray start --head`` prints it; "auto" finds a local one); None: everything in this process."""

    def __init__(self, address: str | None = None):
        self.address = address
        self.remote = address is not None
        self._ray: Any = None
        self._refs: dict[str, Any] = {}  # model sha256 -> the model's bytes in the object store
        self._builds: dict[str, Any] = {}  # artifact path -> a build in flight
        self.workers: set[tuple[str, int]] = set()  # (node, pid) of the Ray workers that did work
        if self.remote:
            self._connect()

    def _connect(self) -> None:
        try:
            import ray
        except ImportError:
            raise UserInputError("--ray needs Ray on this host: pip install 'edgetune[ray]'") from None
        self._ray = ray
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # nothing leaves the lab
        host = _probe(self.address)  # Ray itself retries an unreachable address for ever
        # a head on this host's loopback: this driver is on its node, at 127.0.0.1 (not this host's network
        # address, where that head does not listen)
        local = {"_node_ip_address": "127.0.0.1"} if host in ("127.0.0.1", "localhost", "::1") else {}
        try:
            ray.init(address=self.address, ignore_reinit_error=True, log_to_driver=False, logging_level="ERROR",
                     configure_logging=False, **local)
        except Exception as exc:  # ConnectionError, ValueError ... : whatever Ray says, in one line
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise UserInputError(f"cannot reach the Ray cluster at {self.address}: {first[:300]}") from None
        self._task_refs = ray.remote(_remote_references)
        self._task_build = ray.remote(_remote_build)
        theirs = ray.get(ray.remote(_versions).remote(), timeout=300)
        ours = _versions()
        diff = [f"{k} {theirs.get(k)} (here {v})" for k, v in ours.items() if theirs.get(k) != v]
        if diff:
            self.close()
            raise UserInputError(f"the Ray cluster at {self.address} runs {', '.join(diff)}: its references and "
                                 f"builds would not be this host's; install the same versions on its nodes")

    def close(self) -> None:
        if self._ray is not None:
            self._builds.clear()
            self._refs.clear()
            self._ray.shutdown()
            self._ray = None

    def _model_ref(self, model) -> Any:
        if model.sha256 not in self._refs:
            self._refs[model.sha256] = self._ray.put(Path(model.path).read_bytes())
        return self._refs[model.sha256]

    # ---------------------------------------------------------------- host references
    def references(self, workloads: Sequence[Any], check: Callable[[], None] | None = None) -> None:
        """Compute the references of every input set of every workload: on the cluster, all at
        once (set into each workload, as Workload.references would compute them here); here, one
        after another. ``check``: called between results (a Deadline's check: raises when it passed)."""
        if not self.remote:
            for wl in workloads:
                wl.references()
                if check:
                    check()
            return
        ray = self._ray
        jobs = [[self._task_refs.remote(self._model_ref(wl.model), wl.model.sha256, Path(wl.model.path).suffix,
                                        list(s)) for s in wl.input_sets] for wl in workloads]
        try:
            for wl, refs in zip(workloads, jobs):
                outs = []
                for r in refs:
                    got = _ray_get(ray, r)
                    self.workers.add((got["node"], got["pid"]))
                    outs.append([np.ascontiguousarray(o) for o in got["outputs"]])
                    if check:
                        check()
                wl._references = outs
        except BaseException:
            for refs in jobs:
                for r in refs:
                    ray.cancel(r, force=True)
            raise

    # ---------------------------------------------------------------- builds
    def start_build(self, model, shapes: Mapping[str, Sequence[int]], target: dict, cross_cc: str | None,
                    threads: int, out: Path) -> None:
        """Begin building ``out`` on the cluster (a no-op here, or when it is built or begun)."""
        if not self.remote or out.exists() or str(out) in self._builds:
            return
        self._builds[str(out)] = self._task_build.remote(self._model_ref(model), model.sha256, Path(model.path).suffix,
                                                         {k: list(v) for k, v in shapes.items()}, target, cross_cc,
                                                         threads)

    def finish_build(self, out: Path, identity: dict) -> Path:
        """Wait for ``out``'s build, check the identity it was built with against ``identity`` (the
        one its cache key names), write it atomically; EdgetuneError when it failed or differs."""
        # (kept: the candidates of one artifact, and the devices of one tune, wait for the same build)
        got = _ray_get(self._ray, self._builds[str(out)])
        self.workers.add((got["node"], got["pid"]))
        if got["identity"] != identity:
            raise EdgetuneError(f"the Ray node {got['node']} builds with {got['identity']}, not this host's "
                                f"{identity}: its artifact is not the one this candidate names")
        return write_atomic_file(out, got["so"], 0o644)


def _probe(address: str, timeout_s: float = 5.0) -> str | None:
    """UserInputError unless ``address`` (host:port, ray://host:port, or "auto": a cluster on this
    host, which Ray finds itself) accepts a connection; returns its host."""
    import socket

    if address == "auto":
        return None
    hostport = address.split("://", 1)[-1].rstrip("/")
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise UserInputError(f"--ray wants HOST:PORT (a cluster's head, as 'ray start --head' prints it), "
                             f"ray://HOST:PORT or auto; got '{address}'")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise UserInputError(f"cannot reach the Ray cluster at {address}: {exc.strerror or exc}") from None
    return host.strip("[]")


def _ray_get(ray: Any, ref: Any) -> Any:
    """A task's result; its failure as one EdgetuneError line (the task's own error first)."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as exc:
        cause = exc.cause if getattr(exc, "cause", None) is not None else exc
        if isinstance(cause, UserInputError):
            raise UserInputError(str(cause)) from None
        first = (str(cause).strip().splitlines() or [type(cause).__name__])[0]
        raise EdgetuneError(f"Ray task failed: {first[:300]}") from None
    except ray.exceptions.RayError as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise EdgetuneError(f"Ray task failed: {first[:300]}") from None
