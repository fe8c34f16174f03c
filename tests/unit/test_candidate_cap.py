"""--max-candidates caps a space for quick runs, but never drops a whole precision a user would
hand-pick: the first candidate of each form (precision, quantization) is always kept."""

from __future__ import annotations

from edgetune.agent.host import AgentInfo
from edgetune.candidate import Candidate
from edgetune.space.litert import VARIANTS
from edgetune.space.openvino import SPACE as OPENVINO
from edgetune.tune_config import cap_candidates, form
from edgetune.modelfile import load_model


def _info(caps):
    return AgentInfo(agent="python", agent_version="t", arch="x86_64", python="3",
                     runtimes={"onnxruntime": "x", "openvino": "2026", "openvino_devices": ["CPU"],
                               "openvino_cpu_capabilities": caps, "openvino_cpu_default_precision": ["bf16"]},
                     fingerprint={"cores": 4})


def test_a_cap_keeps_every_precision_of_openvino_and_its_baselines(tiny_model):
    cands = OPENVINO.candidates(load_model(tiny_model), _info(["FP32", "BF16", "INT8"]))
    forms = {form(c) for c in cands if not c.baseline}
    assert {("int8", "nncf"), ("int8", "nncf-mixed"), ("bf16", None)} <= forms  # (the space has them to lose)
    for n in (1, 2, 3):
        capped = cap_candidates(cands, n)
        assert [c for c in capped if c.baseline] == [c for c in cands if c.baseline]
        rest = [c for c in capped if not c.baseline]
        assert {form(c) for c in rest} == forms, n  # int8 by NNCF survives every cap
        assert len(rest) <= n + len(forms) - 1  # the spread of n, plus a first of each form it missed
        assert rest == [c for c in cands if c in rest]  # the space's order, no duplicates
        assert len(set(rest)) == len(rest)


def test_a_cap_of_one_form_spreads_over_the_space_as_before():
    cands = [Candidate.make("ort", {"threads": t}, baseline=(t == 0)) for t in range(11)]
    capped = cap_candidates(cands, 2)
    assert [c.param_dict["threads"] for c in capped] == [0, 1, 6]  # baseline, then every 5th of 10
    assert cap_candidates(cands, 0) == cands[:1]  # a cap of 0: the baselines alone


def test_a_cap_on_litert_keeps_fp16_and_both_int8_forms():
    cands = [Candidate.make("litert", {"config": "default", "precision": "fp32"}, baseline=True)]
    for (precision, quant) in VARIANTS:
        for threads in (1, 2, 4):
            cands.append(Candidate.make("litert", {"precision": precision, "num_threads": threads,
                                                   **({"quant": quant} if quant else {})}))
    capped = cap_candidates(cands, 2)
    assert {form(c) for c in capped if not c.baseline} == set(VARIANTS)
