"""How an agent plans a job's timed run from its warm-up (device_agents/PROTOCOL.md, run loop step
5), on the local device through the real protocol: the estimate is the warm-up's median, so one
stall cannot shrink the timed run to calls a cheat computes honestly (the conformance cheat `stall`
is caught on every transport: tests/farm/test_conformance.py), and a model slower than the whole
warm-up is warmed up twice, not five times."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgetune.agent.host import AgentClient
from edgetune.devices.inventory import Inventory
from tests.conformance import suite

SLOW = '''import time
import onnxruntime as ort


def load(model_path, params):
    sess = ort.InferenceSession(model_path, providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]

    def run(inputs):
        time.sleep(%(sleep)s)
        return sess.run(None, dict(zip(names, inputs)))
    return run
'''


@pytest.fixture
def client(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGETUNE_HOME", str(tmp_path / "home"))
    inv = Inventory(tmp_path / "devices.toml")
    inv.add("dev", "local", workdir=str(tmp_path / "wd"))
    c = AgentClient(inv.get("dev"))
    yield c
    c.close()


def _run(client, tmp_path: Path, adapter: Path, budget_ms: float):
    mlp = suite.build_mlp(tmp_path / "mlp.onnx")
    return suite.run_case(client, suite.mlp_case(mlp), "adapter", adapter, model=mlp, budget_ms=budget_ms)


def test_a_model_slower_than_the_warm_up_is_warmed_up_twice(client, tmp_path):
    slow = tmp_path / "slow.py"
    slow.write_text(SLOW % {"sleep": "0.012"})  # every call 12 ms: longer than the 5 ms warm-up
    verdict, res = _run(client, tmp_path, slow, budget_ms=30.0)
    assert verdict.ok, verdict.reason
    assert res.first_timed_iter == 2  # two: one alone cannot tell a slow model from a stall
    assert len(res.samples_ns) == suite.MIN_ITERS  # 30 ms / 12 ms < the case's minimum of 20


def test_a_stall_in_the_first_warm_up_call_does_not_shrink_the_timed_run(client, tmp_path):
    # the cheat: a 30 ms stall in its first warm-up call, right for 12 calls, then stale outputs; run at
    # the tuner's own minimum of 3 timed calls (suite.CASE_MIN_ITERS)
    verdict, res = _run(client, tmp_path, suite.ADAPTERS / "stall.py", budget_ms=30.0)
    assert res.first_timed_iter == 5  # the stall alone spent the 5 ms warm-up: four more, then the median
    assert len(res.samples_ns) > 3 + 12  # planned from the median call, not the 30 ms stall
    assert not verdict.ok and verdict.code in ("stale-output", "wrong-when-timed"), verdict.reason
