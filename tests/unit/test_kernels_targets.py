"""targets/*.toml loading, feature refinement from /proc/cpuinfo text, fp32 peak."""

from __future__ import annotations

import pytest

from tests.conftest import require_module

from edgetune.errors import UserInputError
from edgetune.kernels.targets import cpuinfo_features, list_targets, load_target, refine_from_cpuinfo

X86_CPUINFO = """processor\t: 0
model name\t: Intel(R) Xeon(R) Processor
cpu MHz\t\t: 2300.000
flags\t\t: fpu sse4_1 sse4_2 avx avx2 fma avx512f avx512bw avx512vl avx512_vnni
processor\t: 1
model name\t: Intel(R) Xeon(R) Processor
cpu MHz\t\t: 2300.000
flags\t\t: fpu sse4_1 sse4_2 avx avx2 fma avx512f avx512bw avx512vl avx512_vnni
"""

A64_CPUINFO = "".join(
    f"processor\t: {i}\nBogoMIPS\t: 108.00\nFeatures\t: fp asimd evtstrm aes crc32 atomics fphp asimdhp asimddp i8mm sve\n"
    "CPU implementer\t: 0x41\nCPU part\t: 0xd0b\n\n"
    for i in range(8)
)


def test_all_bundled_targets_load_and_are_valid_tvm_targets():
    names = list_targets()
    assert {"host-x86_64", "linux-aarch64", "android-arm64", "cuda-sm80", "cuda-sm90"} <= set(names)
    tvm = require_module("tvm")
    for name in names:
        t = load_target(name)
        assert t.name == name and t.arch and t.triple
        tvm.target.Target(t.tvm_target)  # raises on an invalid table
    assert load_target("linux-aarch64").cross_cc == "aarch64-linux-gnu-gcc"
    assert load_target("cuda-sm90").is_gpu and load_target("cuda-sm90").fp32_peak_gflops() > 10_000


def test_unknown_target_names_the_known_ones():
    with pytest.raises(UserInputError, match="linux-aarch64"):
        load_target("pdp11")


def test_x86_refinement_and_peak():
    t = refine_from_cpuinfo(load_target("host-x86_64"), X86_CPUINFO)
    assert t.tvm_target["mattr"] == ["+sse4.2", "+avx", "+avx2", "+fma", "+avx512f", "+avx512bw", "+avx512vl", "+avx512vnni"]
    assert t.cores == 2 and t.tvm_target["num-cores"] == 2
    # no cpufreq (an x86 guest): "cpu MHz" is the clock of the moment, turbo runs above it, so the
    # peak is a bound at the fastest x86 boost clock; with cpufreq's maximum it is the device's own
    assert t.clock_is_bound and t.fp32_peak_gflops() == pytest.approx(2 * 6.2 * 32 * 2)
    own = refine_from_cpuinfo(load_target("host-x86_64"), X86_CPUINFO, max_freq_khz=3_500_000)
    assert not own.clock_is_bound and own.fp32_peak_gflops() == pytest.approx(2 * 3.5 * 32 * 2)
    no512 = refine_from_cpuinfo(load_target("host-x86_64"), X86_CPUINFO.replace(" avx512f", ""))
    assert no512.fma_lanes_per_cycle == 16
    # int8 candidates are held to the int8 peak: VNNI does 4 int8 MACs per fp32 FMA, AMX-INT8 32
    assert t.int8_peak_gops() == pytest.approx(4 * t.fp32_peak_gflops())
    amx = refine_from_cpuinfo(load_target("host-x86_64"), X86_CPUINFO.replace(" avx512_vnni", " avx512_vnni amx_int8"))
    assert amx.int8_peak_gops() == pytest.approx(32 * amx.fp32_peak_gflops())
    plain = refine_from_cpuinfo(load_target("host-x86_64"), X86_CPUINFO.replace(" avx512_vnni", ""))
    assert plain.int8_peak_gops() == pytest.approx(2 * plain.fp32_peak_gflops())


def test_aarch64_refinement_and_peak():
    t = refine_from_cpuinfo(load_target("linux-aarch64"), A64_CPUINFO, max_freq_khz=2_400_000)
    assert t.tvm_target["mattr"] == ["+neon", "+fullfp16", "+dotprod", "+i8mm", "+sve"]
    assert t.tvm_target["mtriple"] == "aarch64-linux-gnu"
    assert t.cores == 8
    assert t.fp32_peak_gflops() == pytest.approx(8 * 2.4 * 8 * 2)
    assert t.int8_peak_gops() == pytest.approx(8 * t.fp32_peak_gflops())  # i8mm
    assert cpuinfo_features("Features\t: fp asimd\n", "aarch64") == ["+neon"]
    # no frequency known -> no peak claimed
    assert refine_from_cpuinfo(load_target("linux-aarch64"), A64_CPUINFO).fp32_peak_gflops() is None
