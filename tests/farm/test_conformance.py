"""The protocol's conformance suite on every agent and every transport of the farm: local, ssh
(a real sshd), the adb phone (real adb server + adbd emulator, no Python there) and the qemu aarch64
board. Each cheating or buggy candidate must be caught under its own named reason; the correct ones
must be verified with outputs of timed iterations checked."""

from __future__ import annotations

import shutil
import sys

import numpy as np
import pytest

from edgetune.agent.host import AgentClient
from edgetune.devices.inventory import Inventory
from edgetune.kernels.device_measure import device_peak_gflops
from tests.conformance import suite
from tests.conftest import require


pytestmark = pytest.mark.usefixtures("private_edgetune_home")


@pytest.fixture(scope="module")
def kernels_x86(tmp_path_factory):
    return suite.build_kernels(tmp_path_factory.mktemp("k-x86"), "gcc")


@pytest.fixture(scope="module")
def kernels_aarch64(tmp_path_factory):
    require(shutil.which("aarch64-linux-gnu-gcc") is not None,
            "aarch64-linux-gnu-gcc (apt-get install gcc-aarch64-linux-gnu)")
    return suite.build_kernels(tmp_path_factory.mktemp("k-a64"), "aarch64-linux-gnu-gcc")


def _client(request, tmp_path_factory, transport: str, native: bool) -> AgentClient:
    inv = Inventory(tmp_path_factory.mktemp("inv") / "devices.toml")
    wd = str(tmp_path_factory.mktemp("wd"))
    if transport == "local":
        inv.add("dev", "local", native=native, workdir=wd)
    elif transport == "ssh":
        f = request.getfixturevalue("ssh_farm")
        inv.add("dev", f"ssh://{f['user']}@{f['host']}:{f['port']}", key=f["key"], known_hosts=f["known_hosts"],
                python=sys.executable, native=native, workdir=wd)
    elif transport == "adb":
        farm = request.getfixturevalue("adb_farm")
        inv.add("dev", f"adb://{farm.phone.serial}@{farm.adb_host}:{farm.adb_port}",
                workdir="/data/local/tmp/edgetune-conformance")
    elif transport == "qemu":
        b = request.getfixturevalue("qemu_board")
        inv.add("dev", f"ssh://{b['user']}@{b['host']}:{b['port']}", key=b["key"], known_hosts=b["known_hosts"],
                workdir=f"{b['home']}/edgetune-conformance")
    return AgentClient(inv.get("dev"))


def _check(results: dict[str, tuple], cases: dict[str, tuple[str, ...]]) -> None:
    wrong = {name: (v.code, v.reason, len(res.samples_ns), res.first_timed_iter,
                    [c.iteration for c in res.timed_checks], res.probe_repeat_ns, res.probe_distinct_ns)
             for name, (v, res) in results.items() if v.code not in cases[name]}
    assert not wrong, f"caught under the wrong name or not at all: {wrong}"
    for name, (v, res) in results.items():
        if cases[name] == ("ok",):
            assert v.ok and v.timed_checked >= 1, (name, v.reason)
        else:
            assert not v.ok, name  # never verified


@pytest.mark.parametrize("transport", ["local", "ssh"])
def test_python_agent_catches_every_cheating_adapter(request, tmp_path_factory, transport, mlp):
    client = _client(request, tmp_path_factory, transport, native=False)
    try:
        assert client.provision().agent == "python"
        case = suite.mlp_case(mlp)
        peak = device_peak_gflops(client, client.provision())
        assert peak, "the roofline check needs the device's peak"
        results = {name: suite.run_case(client, case, "adapter", suite.ADAPTERS / f"{name}.py", model=mlp,
                                        timeout_s=8.0 if name == "hang" else 30.0, peak_gflops=peak)
                   for name in suite.ADAPTER_CASES}
    finally:
        client.close()
    _check(results, suite.ADAPTER_CASES)
    # a lazily computed result pays for its work inside the timed call (it sleeps 20 ms when converted)
    _, lazy = results["lazy"]
    assert float(np.median(lazy.samples_ns)) >= 20e6


@pytest.mark.parametrize("transport", ["local", "ssh", "adb", "qemu"])
def test_native_agent_catches_every_cheating_kernel(request, tmp_path_factory, transport):
    kernels = request.getfixturevalue("kernels_aarch64" if transport == "qemu" else "kernels_x86")
    client = _client(request, tmp_path_factory, transport, native=True)
    slow = transport == "qemu"
    try:
        info = client.provision()
        assert info.agent == "native"
        assert info.emulated == (transport == "qemu")
        case = suite.gemm_case()
        peak = device_peak_gflops(client, info)
        # emulated, every call is slow: a larger budget so the cheats' timed calls come after they turn
        results = {v: suite.run_case(client, case, "tvm-kernel", kernels[v],
                                     timeout_s=(10.0 if slow else 6.0) if v == "HANG" else 120.0,
                                     budget_ms=300.0 if slow else 30.0, peak_gflops=peak)
                   for v in suite.KERNEL_CASES}
    finally:
        client.close()
    # emulated timings are not the hardware's: the TEST04 probe is not judged there, and a memoizing
    # kernel (honest on the fresh inputs every timed iteration gets) is verified with honest timings
    _check(results, {**suite.KERNEL_CASES, "MEMOIZE": ("ok",)} if slow else suite.KERNEL_CASES)


def test_native_agent_ort_model_is_verified_on_timed_iterations(tmp_path_factory, request, mlp):
    client = _client(request, tmp_path_factory, "local", native=True)
    try:
        v, res = suite.run_case(client, suite.mlp_case(mlp), "ort", mlp)
    finally:
        client.close()
    assert v.ok and v.timed_checked >= 1, v.reason
    assert res.probe_repeat_ns and res.probe_distinct_ns and res.input_check == "runtime buffers"
