"""The worker's job (device_agents/python/edgetune_agent/job.py): what it decides from the request
alone, before anything runs."""

from __future__ import annotations

import sys
from pathlib import Path

AGENT_PACKAGE = Path(__file__).resolve().parents[2] / "device_agents" / "python"


def _job_module():
    if str(AGENT_PACKAGE) not in sys.path:
        sys.path.insert(0, str(AGENT_PACKAGE))
    from edgetune_agent import job

    return job


def test_the_late_write_wait_keeps_its_50_ms_floor_for_code_and_accelerators_only():
    """A runtime configuration on the CPU runs only the runtime's code: its late-write wait is
    3 x its median call, at least 2 ms. Code a candidate brings (an adapter, a custom-op library,
    a TVM build), or an accelerator's queue, can leave work running past the call: 50 ms at least."""
    job = _job_module()
    cpu_runtimes = [{"backend": "ort", "params": {}},
                    {"backend": "ort", "params": {"execution_provider": "CPUExecutionProvider", "intra_op_num_threads": 1}},
                    {"backend": "openvino", "params": {"precision": "bf16"}},
                    {"backend": "openvino", "params": {"device": "CPU"}},
                    {"backend": "tflite", "params": {"num_threads": 2}},
                    {"backend": "torch", "params": {"device": "cpu"}}]
    for req in cpu_runtimes:
        assert job.late_wait_floor(req) == 0.002, req
    code_or_accelerator = [{"backend": "ort", "params": {"adapter": "/x/a.py"}},
                           {"backend": "ort", "params": {"custom_ops_library": "/x/libops.so"}},
                           {"backend": "tvm", "params": {}},
                           {"backend": "ort", "params": {"execution_provider": "CUDAExecutionProvider"}},
                           {"backend": "torch", "params": {"device": "cuda"}},
                           {"backend": "openvino", "params": {"device": "GPU"}}]
    for req in code_or_accelerator:
        assert job.late_wait_floor(req) == 0.05, req
