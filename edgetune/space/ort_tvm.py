"""Hybrid onnxruntime + TVM candidates: MetaSchedule-tuned kernels spliced into the onnxruntime graph.

Where a tuned kernel beats onnxruntime's own kernel for a node on a device, the hybrid keeps
onnxruntime for the rest of the graph and runs that node with the TVM kernel, through an
onnxruntime custom-op library built for the device (``device_agents/native/ortop.c``, libc only:
no TVM runtime on the device). Depthwise convolutions are the nodes: a depthwise ``Conv`` (group =
channels, weights and bias initializers, dilation 1), with the ``Relu``, ``Clip(0, 6)`` or
``HardSwish`` that follows it fused into the kernel when nothing else reads the conv's output.

For each such node at the shape point (``dwconv2d_fused`` workloads, edgetune/ops/dwconv2d_fused.py),
``prepare`` runs a kernel-tuning session on the device (edgetune/kernels/session.py): MetaSchedule
search with every measured kernel verified against a float64 reference, then final interleaved
rounds of the best kernel against onnxruntime's own form of the same nodes, with a verdict. Two
candidates, both exact (verified within the fp32 tolerance end to end like any other):

* ``hybrid=tvm-faster``: only the nodes whose kernel was confirmed faster than onnxruntime's;
* ``hybrid=tvm-faster-K`` (K = 1, 2, 4): of those, the K kernels that save the most time in the
  model (time saved per node × nodes of that shape). A kernel faster alone may cost more around it
  in the graph (a reorder out of onnxruntime's blocked layout and back), so the race measures the
  nested subsets end to end; a K past the number of faster kernels is not built (it would be
  ``tvm-faster`` again);
* ``hybrid=tvm-all``: every node with a verified kernel (onnxruntime's layout transformer may
  lose more around a spliced node than the kernel wins: the race says).

The rewritten model, the library and the kernels (``k-<sha256>.so``) are one artifact directory,
content-addressed; the model names its companion files in the ``edgetune:companions`` metadata, so
whoever moves the model moves them (``modelfile.external_data_files``). A kernel is compiled for the
shapes of the shape point: a run at another shape fails with the shapes named (a hybrid is a
per-shape artifact, like every tuned build).

Needs ``TuneConfig.tvm_trials > 0`` (``--tvm-trials``: the total MetaSchedule trials, split evenly
over the distinct depthwise nodes; ``tvm-tuned`` gets the same total for the whole model), TVM on
the host and onnxruntime on the device; the tuning databases are kept under
``EDGETUNE_HOME/kernels`` and reused.
"""

from __future__ import annotations

import hashlib
import math
import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import edgetune
from edgetune.agent.host import AgentInfo
from edgetune.build.native import build_ortop
from edgetune.candidate import REWRITE_KEYS, Candidate
from edgetune.errors import EdgetuneError, ToolchainError
from edgetune.hashing import sha256_file
from edgetune.private import write_atomic_file
from edgetune.kernels.session import KernelSessionConfig, tune_kernels
from edgetune.ops.dwconv2d_fused import DepthwiseConvFused
from edgetune.space import BuildFailed, Prepared
from edgetune.space.tvm_relax import device_target, tvm_on_host
from edgetune.modelfile import Model
from edgetune.workload import Workload, known_shapes

DOMAIN = "ai.edgetune"
OP = "TvmKernel"
COMPANIONS_KEY = "edgetune:companions"
# tvm-faster-K: the K confirmed-faster kernels that save the most time in the model. In this order
# --max-candidates samples them (every len/n-th): 2 of them are tvm-faster and tvm-all
VARIANTS = ("tvm-faster", "tvm-faster-1", "tvm-all", "tvm-faster-2", "tvm-faster-4")
ACTIVATIONS = {"Relu": 1, "HardSwish": 3}  # Clip(0, 6) is 2, checked on its bounds


@dataclass(frozen=True)
class Site:
    """One depthwise Conv node (and the activation fused after it) at a shape point."""

    conv: str  # node names
    act: str | None
    x: str
    w: str
    b: str | None
    y: str  # the output the spliced node writes (the activation's, when fused)
    workload: Any  # DepthwiseConvFused


def _attrs(node) -> dict[str, Any]:
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _const(graph_consts: dict[str, Any], name: str) -> float | None:
    import numpy as np

    v = graph_consts.get(name)
    if v is None or v.size != 1:
        return None
    return float(np.asarray(v).reshape(()))


def depthwise_sites(model_path: Path, input_shapes: dict[str, tuple[int, ...]]) -> list[Site]:
    """Every depthwise Conv of the model the hybrid can run, at these input shapes."""
    import onnx
    from onnx import numpy_helper

    m = onnx.load(str(model_path), load_external_data=False)
    try:
        shapes = known_shapes(m, input_shapes)
    except Exception as exc:  # noqa: BLE001 - onnx raises several types
        raise BuildFailed(f"shape inference failed: {str(exc).splitlines()[0][:200]}") from exc
    inits = {i.name: i for i in m.graph.initializer}
    small = {n: numpy_helper.to_array(t) for n, t in inits.items()
             if not t.external_data and int(math.prod(t.dims)) == 1}
    for node in m.graph.node:  # Constant nodes that hold scalars (Clip bounds in exported models)
        if node.op_type == "Constant":
            a = _attrs(node).get("value")
            if a is not None and int(math.prod(a.dims)) == 1:
                small[node.output[0]] = numpy_helper.to_array(a)
    consumers: dict[str, list] = {}
    for node in m.graph.node:
        for i in node.input:
            consumers.setdefault(i, []).append(node)
    graph_outputs = {o.name for o in m.graph.output}
    sites = []
    for node in m.graph.node:
        if node.op_type != "Conv" or node.domain not in ("", "ai.onnx") or len(node.input) < 2:
            continue
        a = _attrs(node)
        x, w = node.input[0], node.input[1]
        b = node.input[2] if len(node.input) > 2 and node.input[2] else None
        if w not in inits or (b is not None and b not in inits) or x not in shapes or len(shapes[x]) != 4:
            continue
        n, c, h, wd = shapes[x]
        wdims = tuple(inits[w].dims)
        if a.get("group", 1) != c or c < 2 or len(wdims) != 4 or wdims[:2] != (c, 1):
            continue
        if any(d != 1 for d in a.get("dilations", [1, 1])) or a.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
            continue
        if inits[w].data_type != 1 or (b is not None and inits[b].data_type != 1):
            continue
        r, s = wdims[2], wdims[3]
        sh, sw = (list(a.get("strides", [1, 1])) + [1, 1])[:2]
        pt, pl, pb, pr = (list(a.get("pads", [0, 0, 0, 0])) + [0] * 4)[:4]
        act_node, act = None, 0
        users = consumers.get(node.output[0], [])
        if len(users) == 1 and node.output[0] not in graph_outputs:
            u = users[0]
            if u.op_type in ACTIVATIONS and u.domain in ("", "ai.onnx"):
                act_node, act = u, ACTIVATIONS[u.op_type]
            elif u.op_type == "Clip" and u.domain in ("", "ai.onnx") and u.input[0] == node.output[0]:
                ua = _attrs(u)
                lo = _const(small, u.input[1]) if len(u.input) > 1 and u.input[1] else ua.get("min")
                hi = _const(small, u.input[2]) if len(u.input) > 2 and u.input[2] else ua.get("max")
                if lo == 0.0 and hi == 6.0:
                    act_node, act = u, 2
        try:
            wl = DepthwiseConvFused(N=n, C=c, H=h, W=wd, R=r, S=s, SH=sh, SW=sw, PT=pt, PL=pl, PB=pb, PR=pr,
                                    bias=int(b is not None), act=act)
        except EdgetuneError:
            continue
        y = act_node.output[0] if act_node is not None else node.output[0]
        sites.append(Site(node.name or f"#{len(sites)}", act_node.name if act_node is not None else None,
                          x, w, b, y, wl))
    return sites


def splice(model_path: Path, sites: list[Site], kernels: dict[str, str], library: str, out_path: Path) -> None:
    """Write the model with each site's nodes replaced by one ``ai.edgetune::TvmKernel`` node
    running ``kernels[site.workload.key()]`` (a file name next to the model)."""
    import onnx
    from onnx import helper

    m = onnx.load(str(model_path))
    by_conv = {s.conv: s for s in sites if s.workload.key() in kernels}
    acts = {s.act for s in by_conv.values() if s.act}
    was_used = {i for node in m.graph.node for i in node.input}
    nodes = []
    for i, node in enumerate(m.graph.node):
        name = node.name or f"#{i}"
        if node.op_type == "Conv" and name in by_conv:
            s = by_conv[name]
            w = s.workload
            ins = [s.x, s.w] + ([s.b] if s.b else [])
            in_shapes = ";".join(",".join(map(str, t.shape)) for t in w.inputs)
            nodes.append(helper.make_node(OP, ins, [s.y], name=f"tvm:{name}", domain=DOMAIN,
                                          kernel=kernels[w.key()], in_shapes=in_shapes,
                                          out_shape=",".join(map(str, w.outputs[0].shape))))
        elif node.name and node.name in acts:
            continue
        else:
            nodes.append(node)
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    # the output shape of each spliced node, as value_info: a custom op has no shape inference in
    # onnxruntime, and without the shape its layout transformer and fusions stop at the node
    # (measured on MobileNetV3: one spliced node left 30 Reshapes and 10 unfused Adds behind it)
    outs = {s.y: s.workload.outputs[0].shape for s in by_conv.values()}
    kept_vi = [v for v in m.graph.value_info if v.name not in outs]
    del m.graph.value_info[:]
    m.graph.value_info.extend(kept_vi)
    graph_outs = {o.name for o in m.graph.output}
    for name, shape in outs.items():
        if name not in graph_outs:
            m.graph.value_info.append(helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, list(shape)))
    # the Clip bounds of a fused activation are read by nothing now
    used = {i for node in nodes for i in node.input} | {o.name for o in m.graph.output}
    dropped = [t for t in m.graph.initializer if t.name in was_used and t.name not in used]
    for t in dropped:
        m.graph.initializer.remove(t)
    if not any(o.domain == DOMAIN for o in m.opset_import):
        m.opset_import.append(helper.make_opsetid(DOMAIN, 1))
    companions = [library, *sorted(set(kernels[s.workload.key()] for s in by_conv.values()))]
    kept = [p for p in m.metadata_props if p.key != COMPANIONS_KEY]
    del m.metadata_props[:]
    m.metadata_props.extend(kept)
    m.metadata_props.append(onnx.StringStringEntryProto(key=COMPANIONS_KEY, value=json.dumps(companions)))
    onnx.save(m, str(out_path))


def _session_params(cand: Candidate) -> dict[str, Any]:
    return {k: v for k, v in cand.param_dict.items() if k not in REWRITE_KEYS}


class _OneDevice:
    """What the kernel session asks of an inventory: the spec of the device being tuned."""

    def __init__(self, spec):
        self.spec = spec

    def get(self, name: str):
        return self.spec


class OrtTvmSpace:
    name = "ort-tvm"
    wants_spec = True  # kernels are tuned and measured on the device itself
    wants_progress = True  # and that takes minutes
    wants_trials = True  # TuneConfig.tvm_trials
    wants_store = True  # the kernel session is recorded in the tune's own store

    def __init__(self) -> None:
        self._sessions: dict[str, dict[str, Any]] = {}  # kernel-session outcome per (model, shapes, device, trials)

    def available(self, model: Model, info: AgentInfo) -> bool:
        # tvm_on_host: the host compiles the kernels
        return model.format == "onnx" and "onnxruntime" in info.runtimes and tvm_on_host()

    def candidates(self, model: Model, info: AgentInfo, trials: int = 0) -> list[Candidate]:
        if trials <= 0 or not self.available(model, info):
            return []
        return [Candidate.make("ort", {"hybrid": v, "kernel_trials": trials}) for v in VARIANTS]

    # ---- tuning -------------------------------------------------------------------------
    def _tune(self, workload: Workload, sites: list[Site], info: AgentInfo, trials: int, cache_dir: Path, spec,
              progress: Callable[[dict[str, Any]], None] | None, db: str | None) -> dict[str, Any]:
        """{workload key: {"artifact", "verified", "verdict", "speedup", "ci95", "median_ns", "baseline_ns"}},
        from a kernel-tuning session on the device; cached on disk by model, shapes, device and trials."""
        specs = sorted({s.workload.spec() for s in sites})
        import tvm

        # the verdicts hold for these runtimes: another onnxruntime, TVM or edgetune tunes again
        versions = [edgetune.__version__, tvm.__version__, str(info.runtimes.get("onnxruntime")), info.agent_version]
        key = hashlib.sha256(json.dumps([workload.model.sha256, specs, info.fingerprint_key, trials, versions]
                                        ).encode()).hexdigest()[:20]
        if key in self._sessions:
            return self._sessions[key]
        record = cache_dir / f"ort-tvm-kernels-{key}.json"
        if record.is_file():
            try:
                got = json.loads(record.read_text())
                if all(Path(v["artifact"]).is_file() for v in got.values() if v.get("artifact")):
                    self._sessions[key] = got
                    return got
            except (OSError, ValueError, KeyError, TypeError):
                pass
        if spec is None:
            raise BuildFailed("the hybrid needs the device to tune its kernels on")

        def emit(ev: dict[str, Any]) -> None:
            if progress is not None and ev.get("event") == "trial":
                progress({"kernel": ev.get("name"), "trials": ev.get("done"), "best_gflops": ev.get("best_gflops")})

        # --tvm-trials is a total, as for tvm-tuned: the same search budget for both, split evenly
        per_kernel = max(1, trials // len(specs))
        cfg = KernelSessionConfig(device=spec.name, ops=specs, trials=per_kernel, inventory=_OneDevice(spec), db=db,
                                  command="edgetune tune --space ort-tvm (hybrid kernels)")
        try:
            outcome = tune_kernels(cfg, emit)
        except EdgetuneError as exc:
            raise BuildFailed(f"tuning the hybrid's kernels: {str(exc).splitlines()[0][:300]}") from exc
        out: dict[str, Any] = {}
        for r in outcome.results:
            base = r.baseline or {}
            out[r.workload_key] = {"spec": r.spec, "artifact": r.artifact, "verified": bool(r.verified),
                                   "reason": r.reason, "median_ns": r.median_ns, "verdict": base.get("verdict"),
                                   "speedup": base.get("speedup"), "ci95": base.get("ci95"),
                                   "baseline": base.get("backend"), "baseline_ns": base.get("median_ns"),
                                   "run_id": outcome.run_id}
        cache_dir.mkdir(parents=True, exist_ok=True)
        write_atomic_file(record, json.dumps(out, indent=1, sort_keys=True))
        self._sessions[key] = out
        return out

    # ---- the artifact -------------------------------------------------------------------
    def prepare(self, cand: Candidate, workload: Workload, info: AgentInfo, cache_dir: Path,
                spec=None, progress=None, db: str | None = None) -> Prepared:
        p = cand.param_dict
        variant, trials = str(p.get("hybrid")), int(p.get("kernel_trials", 0))
        if variant not in VARIANTS or trials <= 0:
            raise BuildFailed(f"unknown hybrid candidate {p}")
        sites = depthwise_sites(workload.model.path, dict(workload.input_shapes))
        if not sites:
            raise BuildFailed("no depthwise Conv node with static shapes and initializer weights to splice")
        tuned = self._tune(workload, sites, info, trials, cache_dir, spec, progress, db)
        chosen = {}
        for s in sites:
            t = tuned.get(s.workload.key())
            if not t or not t.get("verified") or not t.get("artifact"):
                continue
            if variant != "tvm-all" and t.get("verdict") != "faster":
                continue
            chosen[s.workload.key()] = t
        if not chosen:
            why = ("no tuned kernel was confirmed faster than onnxruntime's own nodes" if variant != "tvm-all"
                   else "no kernel passed verification")
            raise BuildFailed(f"{why} ({len(sites)} depthwise node(s), {trials} trials in all)")
        if variant.startswith("tvm-faster-"):
            k = int(variant.rsplit("-", 1)[1])
            if k >= len(chosen):
                raise BuildFailed(f"not built: {len(chosen)} kernel(s) confirmed faster, so it is hybrid=tvm-faster")
            uses = {key: sum(1 for s in sites if s.workload.key() == key) for key in chosen}
            saved = {key: uses[key] * (float(t.get("baseline_ns") or 0) - float(t.get("median_ns") or 0))
                     for key, t in chosen.items()}
            chosen = {key: chosen[key] for key in sorted(chosen, key=lambda x: -saved[x])[:k]}
        _, cross_cc = device_target(info)
        triple = None
        if info.arch in ("aarch64", "arm64") and cross_cc:
            triple = "aarch64-linux-gnu"
        try:
            lib = build_ortop(triple, cache_dir / "ortop")
        except ToolchainError as exc:
            raise BuildFailed(str(exc).splitlines()[0][:300]) from exc
        files = {k: f"k-{sha256_file(t['artifact'])[:24]}.so" for k, t in chosen.items()}
        key = hashlib.sha256(json.dumps([workload.model.sha256, workload.shape_key, lib.name,
                                         sorted(files.items())]).encode()).hexdigest()[:20]
        final = cache_dir / f"ort-tvm-{workload.model.path.stem}-{key}"
        model_out = final / "model.onnx"
        if not model_out.is_file():
            cache_dir.mkdir(parents=True, exist_ok=True)
            work = Path(tempfile.mkdtemp(prefix=".ort-tvm-", dir=cache_dir))
            try:
                shutil.copyfile(lib, work / lib.name)
                for k, name in files.items():
                    shutil.copyfile(chosen[k]["artifact"], work / name)
                splice(workload.model.path, sites, files, lib.name, work / "model.onnx")
                try:
                    work.rename(final)
                except OSError:  # built concurrently: theirs is the same
                    if not model_out.is_file():
                        raise
            finally:
                if work.exists():
                    shutil.rmtree(work, ignore_errors=True)
        return Prepared("ort", model_out, {**_session_params(cand), "custom_ops_library": lib.name})


SPACE = OrtTvmSpace()
