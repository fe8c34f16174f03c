"""Kernel targets: targets/*.toml, refined by what the device reports, and fp32 peak.

``load_target("linux-aarch64")`` reads targets/linux-aarch64.toml. ``refine_from_cpuinfo`` turns
the device's /proc/cpuinfo text into LLVM features (x86 ``flags``: avx2 -> +avx2, avx512f ->
+avx512f, ...; aarch64 ``Features``: asimd -> +neon, asimddp -> +dotprod, sve -> +sve, i8mm ->
+i8mm, ...) and the core count, and returns a target whose ``tvm_target`` carries them.
``fp32_peak_gflops`` = cores x GHz x FMA lanes per cycle x 2 where the lanes are known.
"""

from __future__ import annotations

import copy
import functools
import re
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from edgetune.errors import UserInputError
from edgetune.shipped import targets_dir

TARGETS_DIR = targets_dir()

# cpuinfo flag -> LLVM feature
X86_FEATURES = {
    "sse4_2": "+sse4.2", "avx": "+avx", "avx2": "+avx2", "fma": "+fma", "f16c": "+f16c",
    "avx512f": "+avx512f", "avx512bw": "+avx512bw", "avx512dq": "+avx512dq", "avx512cd": "+avx512cd",
    "avx512vl": "+avx512vl", "avx512_vnni": "+avx512vnni", "avx512_bf16": "+avx512bf16",
    "avx_vnni": "+avxvnni", "amx_tile": "+amx-tile", "amx_bf16": "+amx-bf16", "amx_int8": "+amx-int8",
}
AARCH64_FEATURES = {
    "asimd": "+neon", "fphp": "+fullfp16", "asimdhp": "+fullfp16", "asimddp": "+dotprod",
    "sve": "+sve", "sve2": "+sve2", "i8mm": "+i8mm", "bf16": "+bf16", "sme": "+sme",
}


@dataclass(frozen=True)
class KernelTarget:
    """One target kind: what to compile for and how fast it could possibly go."""

    name: str
    arch: str
    triple: str
    tvm_target: dict[str, Any]
    cross_cc: str | None = None
    features: tuple[str, ...] = ()
    runtimes: tuple[str, ...] = ()
    fma_lanes_per_cycle: int | None = None  # fp32 lanes of FMA retired per cycle per core
    fp32_gflops: float | None = None  # stated peak (GPUs)
    tensor_gflops: float | None = None  # stated dense fp16/bf16 tensor-core peak (GPUs): their fastest
    peak_notes: str = ""
    cores: int | None = None
    max_freq_ghz: float | None = None
    source: str = ""
    # the clock is a bound, not the device's own (an x86 guest without cpufreq: X86_MAX_BOOST_GHZ)
    clock_is_bound: bool = False

    @property
    def is_gpu(self) -> bool:
        return self.tvm_target.get("kind") in ("cuda", "rocm", "vulkan", "opencl", "metal")

    def fp32_peak_gflops(self) -> float | None:
        """cores x GHz x lanes x 2 (an FMA is two flops); None when a factor is unknown."""
        if self.fp32_gflops is not None:
            return self.fp32_gflops
        if not (self.cores and self.max_freq_ghz and self.fma_lanes_per_cycle):
            return None
        return self.cores * self.max_freq_ghz * self.fma_lanes_per_cycle * 2

    def int8_peak_gops(self) -> float | None:
        """An upper bound on int8 multiply-add throughput (ops/s, 2 per MAC), for the roofline of
        int8 candidates: the fp32 peak times the most int8 MACs an instruction set does per fp32 FMA
        (AMX-INT8 32x, ARM i8mm 8x, VNNI / dot-product 4x, plain SIMD 2x). Generous on purpose: an
        impossible timing must be impossible, not merely unusual."""
        fp32 = self.fp32_peak_gflops()
        if fp32 is None:
            return None
        f = set(self.features)
        mult = (32 if "+amx-int8" in f else 8 if "+i8mm" in f
                else 4 if f & {"+avx512vnni", "+avxvnni", "+dotprod"} else 2)
        return fp32 * mult

    def with_tvm_target(self, **attrs: Any) -> "KernelTarget":
        tt = copy.deepcopy(self.tvm_target)
        tt.update(attrs)
        return replace(self, tvm_target=tt)


def device_sm(fingerprint) -> str | None:
    """The SM ("sm_90") of the first NVIDIA GPU an agent's fingerprint lists (nvidia-smi), or None."""
    gpus = fingerprint.get("gpus") if isinstance(fingerprint, dict) else None
    return next((g.get("sm") for g in gpus or [] if isinstance(g, dict) and g.get("sm")), None)


def cuda_target_name(sm: str | None) -> str | None:
    """The target file for SM ``sm`` ("cuda-sm90" for "sm_90") when targets/ has one, else None."""
    name = "cuda-" + sm.replace("_", "") if sm else ""
    return name if name and (TARGETS_DIR / f"{name}.toml").exists() else None


@functools.lru_cache(maxsize=None)  # read once per SM: it is asked for every GPU candidate's verdict
def gpu_peak_gflops(sm: str | None) -> float | None:
    """The fastest a GPU of SM version ``sm`` ("sm_90") can compute, of the targets that name it:
    the stated dense tensor-core peak, else the fp32 peak; None for an SM no target states. The
    roofline of an onnxruntime GPU candidate, whatever precision its kernels pick: an impossible
    timing must be impossible, not merely unusual."""
    if not sm:
        return None
    peaks = [t.tensor_gflops or t.fp32_gflops for t in map(load_target, list_targets())
             if t.is_gpu and sm in t.features and (t.tensor_gflops or t.fp32_gflops)]
    return max(peaks) if peaks else None


def list_targets(directory: Path | None = None) -> list[str]:
    return sorted(p.stem for p in (directory or TARGETS_DIR).glob("*.toml"))


def load_target(name_or_path: str | Path, directory: Path | None = None) -> KernelTarget:
    path = Path(name_or_path)
    if not path.suffix == ".toml":
        path = (directory or TARGETS_DIR) / f"{name_or_path}.toml"
    if not path.is_file():
        raise UserInputError(f"unknown target {str(name_or_path)!r}; known: {', '.join(list_targets(directory))}")
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise UserInputError(f"{path}: not valid TOML: {exc}") from exc
    missing = [k for k in ("name", "arch", "triple", "tvm_target") if k not in data]
    if missing:
        raise UserInputError(f"{path}: missing field(s) {', '.join(missing)}")
    peak = data.get("peak", {})
    tvm_target = dict(data["tvm_target"])
    return KernelTarget(
        name=data["name"], arch=data["arch"], triple=data["triple"], tvm_target=tvm_target,
        cross_cc=data.get("cross_cc") or None, features=tuple(data.get("features", ())),
        runtimes=tuple(data.get("runtimes", ())), fma_lanes_per_cycle=peak.get("fma_lanes_per_cycle"),
        fp32_gflops=peak.get("fp32_gflops"), tensor_gflops=peak.get("tensor_gflops"), peak_notes=peak.get("notes", ""),
        cores=tvm_target.get("num-cores"), source=str(path),
    )


def _first(pattern: str, text: str) -> str | None:
    m = re.search(pattern, text, re.MULTILINE)
    return m.group(1).strip() if m else None


def cpuinfo_features(cpuinfo: str, arch: str) -> list[str]:
    """LLVM features named by the first processor's flags/Features line."""
    if arch == "x86_64":
        flags = (_first(r"^flags\s*:\s*(.*)$", cpuinfo) or "").split()
        table = X86_FEATURES
    else:
        flags = (_first(r"^Features\s*:\s*(.*)$", cpuinfo) or "").split()
        table = AARCH64_FEATURES
    out: list[str] = []
    for flag in flags:
        feat = table.get(flag)
        if feat and feat not in out:
            out.append(feat)
    return out


def cpuinfo_cores(cpuinfo: str) -> int | None:
    n = len(re.findall(r"^processor\s*:", cpuinfo, re.MULTILINE))
    return n or None


X86_MAX_BOOST_GHZ = 6.2  # the fastest boost clock of a shipped x86 CPU (Core i9-14900KS)


def refine_from_cpuinfo(
    target: KernelTarget,
    cpuinfo: str,
    *,
    cores: int | None = None,
    max_freq_khz: int | None = None,
    mcpu: str | None = None,
) -> KernelTarget:
    """The target as this device really is: its ISA features, core count and clock.

    ``max_freq_khz`` comes from cpufreq (the agent's fingerprint); x86 guests without cpufreq have
    only the cpuinfo "cpu MHz" line, the clock of the moment: their peak is a bound, at
    ``X86_MAX_BOOST_GHZ`` (``clock_is_bound``). FMA lanes per cycle: AVX-512 -> 32 (two FMA ports
    assumed), AVX2+FMA -> 16; on aarch64 the TOML's value stays (it depends on the core, not flags),
    with SVE at 128-bit vectors treated like NEON.
    """
    if target.is_gpu:
        return target
    feats = cpuinfo_features(cpuinfo, target.arch)
    n = cores or cpuinfo_cores(cpuinfo) or target.cores
    ghz = max_freq_khz / 1e6 if max_freq_khz else None
    bound = False
    if ghz is None and target.arch == "x86_64":
        # "cpu MHz" is the clock of the moment (in a guest, often the nominal one), and turbo runs
        # above it: on an AMD EPYC guest it said 2.6 GHz while onnxruntime's GEMM ran 1.6x faster
        # than that clock's peak. The roofline must be a bound a correct kernel cannot break, so
        # the peak is taken at the fastest boost clock an x86 CPU has shipped with.
        mhz = _first(r"^cpu MHz\s*:\s*([0-9.]+)", cpuinfo)
        if mhz:
            ghz, bound = max(float(mhz) / 1000, X86_MAX_BOOST_GHZ), True
    lanes = target.fma_lanes_per_cycle
    if target.arch == "x86_64":
        if "+avx512f" in feats:
            lanes = 32
        elif "+avx2" in feats and "+fma" in feats:
            lanes = 16
        elif feats:
            lanes = 8  # SSE: 4 lanes x (mul + add) ports, no FMA
    tt = copy.deepcopy(target.tvm_target)
    if feats:
        tt["mattr"] = feats
    if n:
        tt["num-cores"] = int(n)
    if mcpu:
        tt["mcpu"] = mcpu
    return replace(target, tvm_target=tt, features=tuple(feats) or target.features, cores=n,
                   max_freq_ghz=ghz or target.max_freq_ghz, fma_lanes_per_cycle=lanes, clock_is_bound=bound)


def host_target(cpuinfo_path: str = "/proc/cpuinfo", mcpu: bool = True) -> KernelTarget:
    """This machine as a kernel target (x86-64 or aarch64 Linux), refined from its cpuinfo; with
    ``mcpu``, LLVM's name for this CPU in the TVM target (TVM is imported for it: ~1 s, which the
    peak figures alone do not need)."""
    import os
    import platform

    arch = {"amd64": "x86_64", "arm64": "aarch64"}.get(platform.machine().lower(), platform.machine().lower())
    base = load_target("host-x86_64" if arch == "x86_64" else "linux-aarch64")
    try:
        text = Path(cpuinfo_path).read_text()
    except OSError:
        text = ""
    freq = None
    try:
        freq = int(Path("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cpu = None
    if mcpu:
        try:
            import tvm

            cpu = str(tvm.target.codegen.llvm_get_system_cpu())
        except Exception:  # noqa: BLE001 - TVM is optional for reading targets
            pass
    refined = refine_from_cpuinfo(base, text, cores=cores, max_freq_khz=freq, mcpu=cpu)
    if arch == "aarch64":
        tt = dict(refined.tvm_target)
        tt.pop("mtriple", None)  # native build
        refined = replace(refined, tvm_target=tt, cross_cc=None)
    return refined
