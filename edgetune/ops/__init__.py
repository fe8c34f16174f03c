"""The spec-string operators, one module each, every host-side form of an operator in its module:
its workload (TE PrimFunc and float64 reference, ``edgetune.ops.base.OpWorkload``), its ONNX
graph, its one-op TFLite form and its numpy adapter, gathered in one ``Op`` record
(``edgetune.ops.base.Op``). ``OPS[name]`` looks an operator up; ``edgetune.ops.forms`` builds the
baseline forms from those records. The PyTorch form is the Python agent's own
(device_agents/python/edgetune_agent/backends/torch.py).

* ``gemm``, ``batch_matmul``: matmuls (float32, or float16 operands with float32 accumulation);
* ``conv2d_nchw``, ``conv2d_nhwc``, ``depthwise_conv2d_nchw`` (sharing ``conv``), and
  ``dwconv2d_fused`` (a model's depthwise Conv with its bias and activation: the hybrid
  onnxruntime + TVM candidates' kernels);
* ``softmax``, ``layernorm``, ``attention``: last-axis reductions (row-major float32).

Fused tasks extracted from a model are not operators: edgetune.kernels.workloads.TirWorkload.
"""

from __future__ import annotations

from typing import Any

from edgetune.ops.attention import OP as ATTENTION
from edgetune.ops.base import Op
from edgetune.ops.batch_matmul import OP as BATCH_MATMUL
from edgetune.ops.conv2d_nchw import OP as CONV2D_NCHW
from edgetune.ops.conv2d_nhwc import OP as CONV2D_NHWC
from edgetune.ops.depthwise_conv2d_nchw import OP as DEPTHWISE_CONV2D_NCHW
from edgetune.ops.dwconv2d_fused import OP as DWCONV2D_FUSED
from edgetune.ops.gemm import OP as GEMM
from edgetune.ops.layernorm import OP as LAYERNORM
from edgetune.ops.softmax import OP as SOFTMAX

OPS: dict[str, Op] = {op.name: op for op in (GEMM, BATCH_MATMUL, CONV2D_NCHW, CONV2D_NHWC, DEPTHWISE_CONV2D_NCHW,
                                             DWCONV2D_FUSED, SOFTMAX, LAYERNORM, ATTENTION)}
# other names a spec may use for an operator
ALIASES = {"matmul": "gemm", "conv2d": "conv2d_nchw", "depthwise_conv2d": "depthwise_conv2d_nchw",
           "dwconv2d": "depthwise_conv2d_nchw", "bmm": "batch_matmul", "layer_norm": "layernorm",
           "layernormalization": "layernorm", "sdpa": "attention"}


def op_of(w: Any) -> Op | None:
    """The Op of workload ``w`` (None for a fused task: it has no ``op``)."""
    return OPS.get(getattr(w, "op", None) or "")
