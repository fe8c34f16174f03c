#!/usr/bin/env python3
"""The zoo's CUDA column (issue 10), for one short run on a lent GPU machine.

    .venv/bin/python tools/gpu/zoo_cuda.py prepare .gpu-zoo [--size small] [MODEL ...]   # here
    python3 tools/gpu/zoo_cuda.py run .gpu-zoo $OUT                                        # on the GPU machine
    .venv/bin/python tools/gpu/zoo_cuda.py verify .gpu-zoo OUTDIR [--markdown docs/zoo-cuda.md]  # here

``prepare`` builds the zoo models (small by default: the carried folder must stay small) and writes
seeded inputs (3 sets per model at its nominal shape, N(0,1) with 2% 16x outliers, token ids in
range) and a manifest. ``run`` needs only numpy and onnxruntime with the CUDA provider on the GPU
machine: per model, one session on ``CUDAExecutionProvider`` (TF32 off: an fp32 model is checked at
fp32 tolerance), the provider each node ran on (one profiled run), outputs of every input set and a
repeat of set 0, and the median latency over a short budget with the CPU provider's default timed
the same way, interleaved. ``--provider`` names another provider (``CPUExecutionProvider`` checks
the plumbing without a GPU). ``verify`` computes the references HERE, with ``onnx.reference`` on a
float64 copy of each model (the GPU machine never sees them), and writes the column: pass with the
norm error, or the failure mode, and "fell back" when nodes ran outside the provider.

TVM CUDA for whole models is not prepared: TVM 0.27 keeps CUDA source in an exported library and
compiles it when loaded (NVRTC), which the slim runtime on the GPU machine does not have. Kernels
are the exception, precompiled with nvcc here: tools/gpu/build_cuda_kernels.py.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

SETS = 3
BUDGET_S = 2.0


def prepare(out: Path, size: str, names: list[str]) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    import models.zoo as zoo
    from edgetune.modelfile import load_model
    from edgetune.workload import build_workload
    from edgetune.zoo_bench import nominal_points

    out.mkdir(parents=True, exist_ok=True)
    manifest = {"schema": "edgetune.zoo-cuda/1", "size": size, "models": []}
    for n in names or zoo.available():
        path = zoo.build(n, size, out / "models")
        m = load_model(path)
        for p in nominal_points(n, size):
            wl = build_workload(m, p["dims"], n_seeded=SETS, seed=20261201)
            tag = f"{n}-{p['label'].replace(' ', '_').replace('=', '').replace(',', '_')}"
            files = []
            for i, s in enumerate(wl.input_sets):
                row = []
                for spec, a in zip(m.inputs, s):
                    f = f"inputs/{tag}-{i}-{spec.name}.npy"
                    (out / f).parent.mkdir(exist_ok=True)
                    np.save(out / f, a, allow_pickle=False)
                    row.append(f)
                files.append(row)
            manifest["models"].append({"name": n, "point": p["label"], "tag": tag, "model": f"models/{path.name}",
                                       "sha256": zoo.sha256(path), "inputs": [s.name for s in m.inputs],
                                       "outputs": [s.name for s in m.outputs], "input_files": files})
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2))
    print(f"prepared {len(manifest['models'])} model points in {out}")


def _placement(sess_factory, feeds) -> dict:
    sess = sess_factory(profile=True)
    sess.run(None, feeds)
    path = sess.end_profiling()
    try:
        events = json.loads(Path(path).read_text())
    finally:
        os.unlink(path)
    nodes = {}
    for ev in events:
        args = ev.get("args") or {}
        if ev.get("cat") == "Node" and args.get("provider"):
            name = ev.get("name", "")
            for suffix in ("_kernel_time", "_fence_before", "_fence_after"):
                name = name[: -len(suffix)] if name.endswith(suffix) else name
            nodes[name] = args["provider"]
    counts: dict[str, int] = {}
    for p in nodes.values():
        counts[p] = counts.get(p, 0) + 1
    return counts


def run(src: Path, out: Path, provider: str) -> None:
    import onnxruntime as ort

    out.mkdir(parents=True, exist_ok=True)
    manifest = json.loads((src / "manifest.json").read_text())
    have = ort.get_available_providers()
    results = {"onnxruntime": ort.__version__, "provider": provider, "available": have, "models": []}
    opts = {"use_tf32": "0"} if provider == "CUDAExecutionProvider" else {}
    for e in manifest["models"]:
        r = {"tag": e["tag"]}
        results["models"].append(r)
        if provider not in have:
            r["status"] = "n/a"
            r["reason"] = f"{provider} not in this onnxruntime ({', '.join(have)})"
            continue

        def make(profile=False, prov=provider, o=opts):
            so = ort.SessionOptions()
            so.log_severity_level = 3
            if profile:
                so.enable_profiling = True
                so.profile_file_prefix = str(out / f"prof-{e['tag']}")
            return ort.InferenceSession(str(src / e["model"]), so, providers=[(prov, o)] if o else [prov])

        try:
            sess = make()
            sets = [{n: np.load(src / f) for n, f in zip(e["inputs"], row)} for row in e["input_files"]]
            outs = []
            for i, feeds in enumerate(sets + [sets[0]]):
                got = sess.run(None, feeds)
                name = "repeat" if i == len(sets) else str(i)
                outs.append([f"{e['tag']}-out{name}-{k}.npy" for k in range(len(got))])
                for f, a in zip(outs[-1], got):
                    np.save(out / f, np.ascontiguousarray(a), allow_pickle=False)
            r["outputs"], r["placement"] = outs, _placement(make, sets[0])
            base = make(prov="CPUExecutionProvider", o={})
            times: dict[str, list[float]] = {provider: [], "CPUExecutionProvider default": []}
            for s_ in (sess, base):
                s_.run(None, sets[0])  # warm-up
            t_end = time.perf_counter() + BUDGET_S
            k = 0
            while time.perf_counter() < t_end or k < 6:  # A B, B A, ...: interleaved
                pair = [(provider, sess), ("CPUExecutionProvider default", base)]
                for label, s_ in (pair if k % 2 == 0 else pair[::-1]):
                    t0 = time.perf_counter_ns()
                    s_.run(None, sets[k % len(sets)])
                    times[label].append((time.perf_counter_ns() - t0) / 1e6)
                k += 1
            r["median_ms"] = {label: float(np.median(v)) for label, v in times.items()}
            r["status"] = "ran"
        except Exception as exc:  # the column names it; the others go on
            r["status"] = "error"
            r["reason"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ''}"
    (out / "results.json").write_text(json.dumps(results, indent=2))
    print(json.dumps({"provider": provider, "available": have,
                      "ran": sum(1 for m in results["models"] if m.get("status") == "ran")}))


def verify(src: Path, outdir: Path, markdown: Path | None) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from edgetune.verify import compare, tolerance_for
    from edgetune.zoo import Float64Reference

    manifest = json.loads((src / "manifest.json").read_text())
    res = json.loads((outdir / "results.json").read_text())
    by_tag = {m["tag"]: m for m in res["models"]}
    prov = res["provider"].replace("ExecutionProvider", "")
    rows = [f"| model | point | onnxruntime {res['onnxruntime']} {prov} | nodes on {prov} | median ms {prov} | "
            f"median ms CPU default |", "|---|---|---|---|---|---|"]
    bad = 0
    refs_cache: dict[str, Float64Reference] = {}
    for e in manifest["models"]:
        r = by_tag.get(e["tag"], {"status": "missing", "reason": "no result"})
        cell, where, med = "", "—", ("—", "—")
        if r.get("status") != "ran":
            cell = f"{r.get('status')}: {r.get('reason', '')}"
            bad += r.get("status") != "n/a"
        else:
            ref = refs_cache.setdefault(e["model"], Float64Reference(src / e["model"]))
            sets = [[np.load(src / f) for f in row] for row in e["input_files"]]
            worst, failure = 0.0, ""
            for i, (row, files) in enumerate(zip(sets + [sets[0]], r["outputs"])):
                want = ref(row)
                got = [np.load(outdir / f) for f in files]
                for name, g, w in zip(e["outputs"], got, want):
                    tol = tolerance_for(str(g.dtype))
                    st = compare(g, w.astype(g.dtype) if g.dtype.kind != "f" else w, tol)
                    worst = max(worst, st.norm_rel)
                    if st.excess > 1.0 or st.norm_rel > tol.norm:
                        failure = failure or (f"wrong-output ({name}: norm error {st.norm_rel:.2g})"
                                              if st.norm_rel > 1e-2 else f"imprecise ({name}: {st.norm_rel:.2g})")
            rep = [np.load(outdir / f) for f in r["outputs"][-1]]
            first = [np.load(outdir / f) for f in r["outputs"][0]]
            if not all(np.array_equal(a, b) for a, b in zip(rep, first)):
                failure = failure or "non-deterministic (set 0 twice)"
            cell = failure or f"pass ({worst:.1e})"
            bad += bool(failure)
            pl = r.get("placement") or {}
            total = sum(pl.values())
            mine = pl.get(res["provider"], 0)
            where = (f"{mine} of {total}" + ("" if mine == total else " — fell back: " + ", ".join(
                f"{k.replace('ExecutionProvider', '')} {v}" for k, v in pl.items() if k != res["provider"])))
            med = tuple(f"{r['median_ms'][k]:.3f}" for k in (res["provider"], "CPUExecutionProvider default"))
        rows.append(f"| {e['name']} | {e['point']} | {cell} | {where} | {med[0]} | {med[1]} |")
    text = "\n".join(rows)
    print(text)
    if markdown:
        markdown.write_text(text + "\n")
    return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("dir", type=Path)
    p.add_argument("models", nargs="*")
    p.add_argument("--size", default="small", choices=["small", "full"])
    r = sub.add_parser("run")
    r.add_argument("dir", type=Path)
    r.add_argument("out", type=Path)
    r.add_argument("--provider", default="CUDAExecutionProvider")
    v = sub.add_parser("verify")
    v.add_argument("dir", type=Path)
    v.add_argument("out", type=Path)
    v.add_argument("--markdown", type=Path)
    a = ap.parse_args()
    if a.cmd == "prepare":
        prepare(a.dir, a.size, a.models)
        return 0
    if a.cmd == "run":
        run(a.dir, a.out, a.provider)
        return 0
    return verify(a.dir, a.out, a.markdown)


if __name__ == "__main__":
    sys.exit(main())
