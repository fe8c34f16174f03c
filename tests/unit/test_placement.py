"""Where an onnxruntime candidate's nodes ran (issue 11): an accelerator provider may take only part
of the graph and onnxruntime puts the rest on its CPU provider without a word. The Python agent
reports the placement from one profiled run; the host labels a candidate that fell back."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgetune.agent import validate
from edgetune.agent.host import AgentClient, Job
from edgetune.devices.inventory import DeviceSpec
from edgetune.results import _worst_placement, placement_label, placement_share
from edgetune.space import Prepared
from edgetune.tune import wants_placement
from edgetune.verify import verify_job
from tests.conformance import suite


def test_the_python_agent_reports_where_every_node_ran(tmp_path):
    mlp = suite.build_mlp(tmp_path / "mlp.onnx")
    case = suite.mlp_case(mlp)
    client = AgentClient(DeviceSpec("dev", "local", {"workdir": str(tmp_path / "wd")}))
    try:
        job = Job(backend="ort", artifact=mlp, params={"execution_provider": "CPUExecutionProvider"},
                  input_names=case.input_names, input_sets=case.input_sets, output_specs=case.output_specs,
                  budget_ms=10.0, warmup_ms=2.0, min_iters=5, timeout_s=60.0, placement=True)
        res = client.run_job(job)
        assert res.ok, res.reason
        p = res.placement
        assert p["intended"] == "CPUExecutionProvider" and set(p["nodes"]) == {"CPUExecutionProvider"}
        assert p["nodes"]["CPUExecutionProvider"] >= 1 and placement_share(p) == 1.0
        assert placement_label(p).startswith("all ") and placement_label(p).endswith(" nodes on CPU")
        # the profiled run is not the measured one: the job is verified as ever
        v = verify_job(res, case.input_sets, case.references, case.reference_fn, case.output_names)
        assert v.ok, v.reason
        # not asked for: not reported
        job.placement = False
        assert client.run_job(job).placement is None
    finally:
        client.close()


def test_a_candidate_that_fell_back_is_labelled_with_its_share():
    full = {"intended": "XnnpackExecutionProvider", "nodes": {"XnnpackExecutionProvider": 5}}
    part = {"intended": "XnnpackExecutionProvider", "nodes": {"XnnpackExecutionProvider": 2, "CPUExecutionProvider": 3}}
    assert placement_share(part) == pytest.approx(0.4)
    assert placement_label(part) == "fell back: 2 of 5 nodes on Xnnpack (CPU 3)"
    assert placement_label({"error": "RuntimeError: no profile"}) == "placement unknown: RuntimeError: no profile"

    class Rec:
        def __init__(self, p):
            self.verdict = {"placement": p}

    assert _worst_placement([Rec(full), Rec(part), Rec(full)]) == part  # the worst record speaks for it
    mlp_path = Path(__file__)
    assert wants_placement(Prepared("ort", mlp_path, {"execution_provider": "XnnpackExecutionProvider"}))
    assert not wants_placement(Prepared("ort", mlp_path, {"execution_provider": "CPUExecutionProvider"}))
    assert not wants_placement(Prepared("ort", mlp_path, {}))
    assert not wants_placement(Prepared("tflite", mlp_path, {"execution_provider": "X"}))


@pytest.mark.parametrize("bad", [[], {"nodes": []}, {"intended": "X", "nodes": {f"p{i}": 1 for i in range(65)}},
                                 {"intended": "X", "nodes": {"X": -1}}, {"intended": 3, "nodes": {}}])
def test_a_forged_placement_is_a_protocol_violation(bad):
    with pytest.raises(validate.Invalid):
        validate._placement(bad)
