"""Backend ``torch``: PyTorch's own forms of edgetune's operators (eager ATen, torch.compile), the
baselines of ``tune-kernels`` and ``judge``."""

import json
import os
import platform

from ..common import work_dir


def _keep_freed_memory():
    """glibc only: freed memory stays with the process (no trimming of the heap's top, no mmap for
    big blocks). PyTorch's CPU operators allocate and free their temporaries on every call; with
    glibc's defaults each call can take them back from the OS page by page, depending on the heap's
    state: a 3x3 depthwise convolution (C=144, 56x56) ran at 1.77 ms with 1,290 page faults per call,
    173 us with none once this was set (measured). A deployment tunes its allocator so; the baseline
    is not held to the default."""
    import ctypes

    if platform.libc_ver()[0] != "glibc":
        return
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD
        libc.mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD (glibc's largest on 64-bit)
    except (OSError, AttributeError):
        pass


TORCH_OPS = ("gemm", "batch_matmul", "conv2d_nchw", "depthwise_conv2d_nchw", "conv2d_nhwc", "softmax", "layernorm",
             "attention")


def torch_program(torch, device, op, P):
    """PyTorch's form of operator ``op`` (edgetune's operator kinds, parameters ``P``):
    forward(xs, outs) -> [tensor], writing into the preallocated ``outs`` where ATen has an out=
    form (``outs`` None under torch.compile: its own buffers). Layouts are the operator's own."""
    F = torch.nn.functional
    if op == "gemm":
        def forward(xs, outs):
            return [torch.mm(xs[0], xs[1], out=outs[0]) if outs is not None else torch.mm(xs[0], xs[1])]
    elif op == "batch_matmul":
        def forward(xs, outs):
            b = xs[1].transpose(1, 2) if P["TB"] else xs[1]
            return [torch.bmm(xs[0], b, out=outs[0]) if outs is not None else torch.bmm(xs[0], b)]
    elif op in ("conv2d_nchw", "depthwise_conv2d_nchw"):
        groups = int(P["C"]) if op == "depthwise_conv2d_nchw" else 1

        def forward(xs, outs):
            return [F.conv2d(xs[0], xs[1], stride=int(P["stride"]), padding=int(P["pad"]), groups=groups)]
    elif op == "conv2d_nhwc":
        def forward(xs, outs):
            # NHWC activations are NCHW in channels_last, HWIO weights OIHW; the output NHWC again
            x = xs[0].permute(0, 3, 1, 2)
            w = xs[1].permute(3, 2, 0, 1).contiguous(memory_format=torch.channels_last)
            return [F.conv2d(x, w, stride=int(P["stride"]), padding=int(P["pad"])).permute(0, 2, 3, 1)]
    elif op == "softmax":
        def forward(xs, outs):
            return [torch.softmax(xs[0], dim=-1)]
    elif op == "layernorm":
        def forward(xs, outs):
            return [F.layer_norm(xs[0], (xs[0].shape[-1],), xs[1], xs[2], eps=float(P["eps"]))]
    elif op == "attention":
        s, l_ = int(P["S"]), int(P["L"])
        # causal: query i sees key j <= i + (L - S) (SDPA's own is_causal is that when S == L)
        keep = (torch.arange(l_, device=device)[None, :] <= torch.arange(s, device=device)[:, None] + (l_ - s)) \
            if P["causal"] and s != l_ else None

        def forward(xs, outs):
            q, k, v = xs
            if keep is not None:
                return [F.scaled_dot_product_attention(q, k, v, attn_mask=keep)]
            return [F.scaled_dot_product_attention(q, k, v, is_causal=bool(P["causal"]))]
    else:
        raise ValueError("no torch form of operator %r" % (op,))
    return forward


class TorchBackend:
    """PyTorch on the device (the host's baseline forms: eager ATen — cuBLAS/cuDNN on a GPU,
    oneDNN/BLAS on a CPU — and torch.compile). The artifact is JSON naming the operator and its
    parameters (``torch_program``: the job brings no code). ``params``: ``device`` "cpu" | "cuda",
    ``compile`` "" | "default" | a torch.compile mode, ``num_threads``. A float32 operator is held
    to float32 (TF32 off); float16 matmuls return float16 with float32 accumulation.

    On the CPU the inputs are the agent's own buffers (shared memory, no copy); on a GPU they are
    tensors at fixed addresses, each new input copied in before the timed run (stage) with 2 x 128
    MiB copied on the device after it (no run finds its data in L2), and the timed run ends with
    the device synchronized. Outputs are poisoned where they live, read back after the run."""

    FLUSH_BYTES = 128 << 20

    def __init__(self, model_path, params, input_names, outputs):
        import numpy as np
        import torch

        self.np, self.torch = np, torch
        device = params.get("device", "cpu")
        if device not in ("cpu", "cuda"):
            raise ValueError("params.device must be cpu or cuda")
        if device == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("this device's PyTorch %s has no CUDA device" % torch.__version__)
        self.gpu = device == "cuda"
        if "num_threads" in params:
            torch.set_num_threads(int(params["num_threads"]))
        if not self.gpu:
            _keep_freed_memory()
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
        with open(model_path, "rb") as f:
            spec = json.loads(f.read().decode("utf-8"))
        if not isinstance(spec, dict) or spec.get("op") not in TORCH_OPS or not isinstance(spec.get("params"), dict):
            raise ValueError("the torch artifact must name an operator (%s) and its params" % ", ".join(TORCH_OPS))
        self.dev = torch.device(device)
        forward = torch_program(torch, self.dev, spec["op"], spec["params"])
        mode = params.get("compile") or ""
        if mode:
            import torch._inductor.config as inductor_config

            # compiled in this process (no pool of compile workers against the job's process bound);
            # inductor's and Triton's caches live in the agent's work dir, across jobs (a cold
            # compile takes seconds)
            inductor_config.compile_threads = 1
            w = work_dir()
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(w, "cache", "torchinductor")
            os.environ["TRITON_CACHE_DIR"] = os.path.join(w, "cache", "triton")
            compiled = torch.compile(lambda *xs: forward(xs, None), mode=None if mode == "default" else mode,
                                     dynamic=False, fullgraph=True)
            self.fn = lambda xs, outs: compiled(*xs)
        else:
            self.fn = forward
        dt = {"float32": torch.float32, "float16": torch.float16}
        # (compiled: inductor's own output buffers, no preallocated ones)
        self.outs = [] if mode else [torch.full(o["shape"], float("nan"), dtype=dt[o["dtype"]], device=self.dev)
                                     for o in outputs]
        self.ins = None
        self._key = None
        self._last = None
        self._flush = None
        if self.gpu:
            self._flush = (torch.zeros(self.FLUSH_BYTES // 4, device=self.dev),
                           torch.zeros(self.FLUSH_BYTES // 4, device=self.dev))
            self.input_check = "agent copy (uploaded to the cuda before each run)"

    input_check = "runtime buffers"  # on the CPU, torch reads the agent's arrays themselves (from_numpy)

    def stage(self, inputs):
        torch = self.torch
        if not self.gpu:
            if self._key is not inputs:  # the agent rewrites these buffers in place
                self.ins = [torch.from_numpy(a) for a in inputs]
                self._key = inputs
            return
        if self.ins is None:
            self.ins = [torch.empty_like(torch.from_numpy(a), device=self.dev) for a in inputs]
        for t, a in zip(self.ins, inputs):
            t.copy_(torch.from_numpy(a))
        self._flush[1].copy_(self._flush[0])
        torch.cuda.synchronize()

    def poison(self):
        # the preallocated outputs, and whatever the last run returned (a form that hands back the
        # same buffer without computing shows NaN)
        for t in self.outs + list(self._last or ()):
            if t.is_floating_point():
                t.fill_(float("nan"))
        if self.gpu:
            self.torch.cuda.synchronize()

    def run(self, inputs):  # (the agent stages every run's inputs first)
        # the last run's own output tensors go first (an op without an out= form allocates anew):
        # held across the call, each call would take fresh pages from the OS (4.9 ms instead of
        # 1.8 ms for a 1.8 MB output, measured); the preallocated outputs stay where they are
        self._last = None
        out = self.fn(self.ins, self.outs)
        self._last = list(out) if isinstance(out, (list, tuple)) else [out]
        if self.gpu:
            self.torch.cuda.synchronize()  # the device's work is done when the run's time ends

    def results(self):
        return [t.detach().cpu().numpy().copy() for t in self._last]

    def live(self):
        if self.gpu:
            return self.results()
        return [t.detach().numpy() for t in self._last]
