"""Backends ``tvm-relax`` (a Relax module in the TVM runtime's VM) and ``tvm-kernel`` (a TVM-exported
kernel through the device's TVM runtime), on the CPU or a CUDA GPU."""

import os
import sys


def import_tvm():
    """``import tvm`` without PyTorch: tvm-ffi and tvm.relax import torch where it is installed (for
    torch tensors, which no TVM job hands them), about 2 s of a 3.5 s import on the reference host, paid by every TVM
    job (each runs in a fresh process). A process that has torch already keeps it."""
    if "torch" in sys.modules:
        import tvm

        return tvm
    sys.modules["torch"] = None  # "import torch" raises ImportError, which tvm-ffi takes as "not installed"
    try:
        import tvm
    finally:
        if "torch" in sys.modules and sys.modules["torch"] is None:
            del sys.modules["torch"]  # a later import torch (none in a TVM job) finds it again
    return tvm


def _tvm_device(tvm, params):
    """(name, TVM device) of ``params.device`` ("cpu" default, or "cuda"); raises when the device's
    TVM runtime cannot reach it."""
    device = params.get("device", "cpu")
    if device not in ("cpu", "cuda"):
        raise ValueError("params.device must be cpu or cuda")
    dev = tvm.runtime.device(device, 0)
    if not dev.exist and device == "cuda":
        why = _tvm_cuda_runtime(tvm)
        dev = tvm.runtime.device(device, 0)
        if not dev.exist:
            raise RuntimeError("this device's TVM runtime has no cuda device: %s" % why)
    if not dev.exist:
        raise RuntimeError("this device's TVM runtime has no %s device" % device)
    return device, dev


def _nvidia_wheel_libs(name):
    """NAME (a CUDA library's soname) where NVIDIA's wheels put it: site-packages/nvidia/cu13/lib
    (CUDA 13's wheels), nvidia/*/lib (CUDA 12's), on the interpreter's path."""
    import glob

    found = []
    for d in sys.path:
        if d and os.path.isdir(os.path.join(d, "nvidia")):
            found += sorted(glob.glob(os.path.join(d, "nvidia", "*", "lib", name)))
    return found


def _tvm_cuda_runtime(tvm):
    """Load TVM's CUDA runtime (tvm/lib/libtvm_runtime_cuda.so), which `import tvm` skips without a
    word when libcudart.so.13 is not on the loader's path (NVIDIA's wheels keep it in site-packages):
    libcudart from there first. Returns what the loader said when it still cannot load."""
    import ctypes

    for path in _nvidia_wheel_libs("libcudart.so.13")[:1]:
        try:
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        except OSError:
            pass
    lib = os.path.join(os.path.dirname(os.path.abspath(tvm.__file__)), "lib", "libtvm_runtime_cuda.so")
    if not os.path.exists(lib):
        return "this TVM has no CUDA runtime (%s is not installed)" % os.path.basename(lib)
    try:
        ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)
    except OSError as exc:
        return "its CUDA runtime did not load (%s)" % str(exc)[:300]
    return "its CUDA runtime loaded and found no GPU"


def _tvm_tensor(tvm, a, dev):
    if hasattr(tvm.runtime, "tensor"):
        return tvm.runtime.tensor(a, dev)
    return tvm.nd.array(a, dev)


def _tvm_upload(tvm, tensors, arrays, dev):
    """``arrays`` in the runtime's tensors at fixed addresses: new ones the first time (tensors None),
    copied into the same ones after; returns them."""
    if tensors is None:
        return [_tvm_tensor(tvm, a, dev) for a in arrays]
    for t, a in zip(tensors, arrays):
        t.copyfrom(a)
    return tensors


class TvmRelaxBackend:
    """A Relax module exported by edgetune.build.tvm_relax, run in the TVM runtime's VM;
    ``params.device`` "cuda": the model built for the GPU, its inputs uploaded before each timed run
    (stage), the timed run ending with the device synchronized, outputs read back after it."""

    def __init__(self, model_path, params, input_names, outputs):
        import numpy as np

        tvm = import_tvm()
        from tvm import relax

        if "num_threads" in params:
            os.environ["TVM_NUM_THREADS"] = str(params["num_threads"])
        self.np = np
        self.tvm = tvm
        device, dev = _tvm_device(tvm, params)
        self.gpu = device == "cuda"
        if self.gpu:
            self.input_check = "agent copy (uploaded to the cuda before each run)"
        self.dev = dev
        lib = tvm.runtime.load_module(model_path)
        self.vm = relax.VirtualMachine(lib, dev)
        self.fn = self.vm["main"]
        self._cache_key = None
        self._args = None
        self._last = None

    input_check = "agent copy (the VM's tensors are copied from the agent's buffers)"

    def poison(self):
        pass  # the VM allocates outputs itself

    def stage(self, inputs):
        if not self.gpu:
            return  # (the CPU: copied in the timed run, as the VM's own inputs would be)
        self._args = _tvm_upload(self.tvm, self._args, inputs, self.dev)
        self.dev.sync()

    def run(self, inputs):
        if self.gpu:
            self._last = self.fn(*self._args)
            self.dev.sync()  # the device's work is done when the run's time ends
            return
        # every run: the agent changes inputs in place
        self._args = _tvm_upload(self.tvm, self._args if self._cache_key is inputs else None, inputs, self.dev)
        self._cache_key = inputs
        self._last = self.fn(*self._args)

    def results(self):
        out = self._last
        items = list(out) if isinstance(out, (list, tuple)) or type(out).__name__ in ("Array", "ArrayObj") else [out]
        return [self.np.array(o.numpy()) for o in items]


class TvmKernelBackend:
    """A TVM-exported kernel (edgetune tune-kernels' artifacts: entry ``main``, inputs then outputs)
    through the device's TVM runtime, on ``params.device`` "cpu" or "cuda" (edgetune tune-kernels
    --gpu). Its tensors are the runtime's own at fixed addresses: each new input is copied in before
    the timed run (stage), outputs are poisoned where they live and read back after it; on a GPU,
    2 x 128 MiB are copied on the device before each run (no run finds its data in L2) and the
    timed run ends with the device synchronized."""

    FLUSH_BYTES = 128 << 20

    def __init__(self, model_path, params, input_names, outputs):
        import numpy as np

        tvm = import_tvm()
        if "num_threads" in params:
            os.environ["TVM_NUM_THREADS"] = str(params["num_threads"])
        self.np, self.tvm = np, tvm
        device, self.dev = _tvm_device(tvm, params)
        lib = tvm.runtime.load_module(model_path)
        self.fn = lib[params.get("entry", "main")]
        self._lib = lib
        self.outputs = outputs
        self.outs = [_tvm_tensor(tvm, np.full(o["shape"], np.nan, o["dtype"]), self.dev) for o in outputs]
        self.ins = None
        self._flush = None
        if device == "cuda":
            half = np.zeros(self.FLUSH_BYTES // 4, np.float32)
            self._flush = (_tvm_tensor(tvm, half, self.dev), _tvm_tensor(tvm, half, self.dev))
        self.input_check = ("agent copy (uploaded to the %s before each run)" % device)

    def stage(self, inputs):
        self.ins = _tvm_upload(self.tvm, self.ins, inputs, self.dev)
        if self._flush is not None:
            self._flush[0].copyto(self._flush[1])
        self.dev.sync()

    def poison(self):
        for t, o in zip(self.outs, self.outputs):
            if self.np.dtype(o["dtype"]).kind == "f":
                t.copyfrom(self.np.full(o["shape"], self.np.nan, o["dtype"]))
        self.dev.sync()

    def run(self, inputs):
        self.fn(*self.ins, *self.outs)
        self.dev.sync()  # the device's work is done when the run's time ends

    def results(self):
        return [self.np.array(t.numpy()) for t in self.outs]

    def live(self):
        return self.results()
