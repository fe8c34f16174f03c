"""An independent float64 reference for fused tasks: the unscheduled TIR, interpreted in numpy.

``tir_reference(func, inputs, in_specs, out_specs)`` runs an unscheduled PrimFunc (blocks in
perfect loop nests, as TE and Relax legalization produce them) on numpy float64 arrays, with no
TVM compilation or execution, so it is independent of the schedules, lowering and code generation
under test (it shares their ONNX import and legalization). A construct it does not cover raises
``TirNotInterpretable``; the task then falls back to TVM's unscheduled build, and says so
(edgetune.kernels.workloads.TirWorkload.reference_kind).
"""

from __future__ import annotations

import itertools
from typing import Sequence

import numpy as np

TIR_REFERENCE_KIND = ("numpy float64 interpretation of the unscheduled TIR (independent of TVM's schedules, "
                      "lowering and code generation; shares its ONNX import and legalization)")
TVM_REFERENCE_KIND = "tvm-unscheduled (not independent)"


class TirNotInterpretable(Exception):
    """The PrimFunc uses a construct the float64 interpreter does not cover (or reads out of bounds)."""


_TIR_CHUNK = 1 << 22  # elements of one evaluated iteration-space chunk (bounds the interpreter's memory)

_UNARY = {
    "exp": np.exp, "exp2": np.exp2, "exp10": lambda x: np.power(10.0, x), "log": np.log, "log2": np.log2,
    "log10": np.log10, "log1p": np.log1p, "expm1": np.expm1, "sqrt": np.sqrt,
    "rsqrt": lambda x: 1.0 / np.sqrt(x), "tanh": np.tanh, "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
    "fabs": np.abs, "floor": np.floor, "ceil": np.ceil, "trunc": np.trunc, "nearbyint": np.rint,
    "round": lambda x: np.where(np.asarray(x) >= 0, np.floor(np.asarray(x) + 0.5), np.ceil(np.asarray(x) - 0.5)),
    "sin": np.sin, "cos": np.cos, "tan": np.tan, "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan,
    "sinh": np.sinh, "cosh": np.cosh, "asinh": np.arcsinh, "acosh": np.arccosh, "atanh": np.arctanh,
    "isnan": np.isnan, "isinf": np.isinf, "isfinite": np.isfinite,
}
_BINARY = {"pow": np.power, "fmod": np.fmod, "copysign": np.copysign, "atan2": np.arctan2, "hypot": np.hypot}


def _erf(x):
    try:
        from scipy.special import erf
    except ImportError:  # pragma: no cover - scipy is usually present with TVM
        import math

        return np.vectorize(math.erf, otypes=[np.float64])(x)
    return erf(x)


def _np_dtype(dtype: str):
    dtype = str(dtype)
    if dtype.startswith(("float", "bfloat")):
        return np.float64
    if dtype == "bool":
        return np.bool_
    if dtype.startswith(("int", "uint")):
        return np.int64
    raise TirNotInterpretable(f"dtype {dtype}")


def _key(obj) -> int:
    return hash(obj)  # TVM objects hash by identity


def _truncdiv(a, b):
    q = np.floor_divide(a, b)
    return q + ((np.mod(a, b) != 0) & ((np.asarray(a) < 0) ^ (np.asarray(b) < 0)))


class _TirInterpreter:
    """Runs an unscheduled PrimFunc (blocks in perfect loop nests, as TE/legalization produce them)
    on numpy float64 arrays: each block is evaluated over its whole iteration space at once, in
    chunks; reductions (``init`` + ``C = C op expr``) become numpy reductions."""

    def __init__(self, func) -> None:
        self.func = func

    # ------------------------------------------------------------------ statements
    def run(self, inputs: Sequence[np.ndarray], in_specs, out_specs) -> list[np.ndarray]:
        params = list(self.func.params)
        if len(params) != len(in_specs) + len(out_specs) or len(inputs) != len(in_specs):
            raise TirNotInterpretable("parameters do not match the task's inputs and outputs")
        self.bufs: dict[int, np.ndarray] = {}
        for p, x, s in zip(params, inputs, in_specs):
            self.bufs[_key(p)] = np.asarray(x).astype(_np_dtype(s.dtype))
        outs = []
        for p, s in zip(params[len(in_specs):], out_specs):
            a = np.full(s.shape, np.nan) if _np_dtype(s.dtype) is np.float64 else np.zeros(s.shape, _np_dtype(s.dtype))
            self.bufs[_key(p)] = a
            outs.append(a)
        self.exec(self.func.body, [])
        return outs

    def alloc(self, buffers) -> None:
        for b in buffers:
            dt = _np_dtype(b.dtype)
            shape = tuple(int(d) for d in b.shape)
            self.bufs[_key(b)] = np.full(shape, np.nan) if dt is np.float64 else np.zeros(shape, dt)

    def exec(self, stmt, loops) -> None:
        kind = type(stmt).__name__
        if kind == "SeqStmt":
            for s in stmt.seq:
                self.exec(s, loops)
        elif kind == "For":
            step = getattr(stmt, "step", None)
            if step is not None and int(step) != 1:
                raise TirNotInterpretable("loop step != 1")
            self.exec(stmt.body, loops + [stmt])
        elif kind == "SBlockRealize":
            self.block(stmt, loops)
        else:
            raise TirNotInterpretable(f"statement {kind}")

    def block(self, realize, loops) -> None:
        blk = realize.block
        if list(blk.match_buffers):
            raise TirNotInterpretable("match_buffer")
        pred = realize.predicate
        if not (type(pred).__name__ == "IntImm" and int(pred.value) == 1):
            raise TirNotInterpretable("block predicate")
        self.alloc(blk.alloc_buffers)
        ivs = list(blk.iter_vars)
        if not ivs:  # the root block, or a scalar block: run its body once
            if type(blk.body).__name__ == "BufferStore" and blk.init is None:
                self.store_spatial(blk.body, [])
                return
            if loops or blk.init is not None:
                raise TirNotInterpretable("a block without iteration variables inside loops")
            self.exec(blk.body, [])
            return
        used = set()
        for iv, val in zip(ivs, realize.iter_values):
            match = [lp for lp in loops if lp.loop_var.same_as(val)]
            if not match:
                raise TirNotInterpretable("a block binding that is not a plain loop variable")
            lp = match[0]
            if int(lp.min) != int(iv.dom.min) or int(lp.extent) != int(iv.dom.extent):
                raise TirNotInterpretable("a block binding that does not cover its iteration domain")
            used.add(_key(lp.loop_var))
            if int(iv.iter_type) not in (0, 2):
                raise TirNotInterpretable(f"iteration type {int(iv.iter_type)}")
        if any(_key(lp.loop_var) not in used and int(lp.extent) != 1 for lp in loops):
            raise TirNotInterpretable("a loop around a block that is not one of its iteration variables")
        store = blk.body
        if type(store).__name__ != "BufferStore":
            raise TirNotInterpretable(f"block body {type(store).__name__}")
        reduce_axes = [i for i, iv in enumerate(ivs) if int(iv.iter_type) == 2]
        if not reduce_axes:
            if blk.init is not None:
                raise TirNotInterpretable("init in a block without reduction")
            self.store_spatial(store, ivs)
        else:
            self.store_reduction(blk, store, ivs, reduce_axes)

    # ------------------------------------------------------------------ iteration space
    @staticmethod
    def chunks(ivs):
        extents = [int(iv.dom.extent) for iv in ivs]
        mins = [int(iv.dom.min) for iv in ivs]
        sizes = [1] * len(ivs)
        budget = _TIR_CHUNK
        for i in reversed(range(len(ivs))):
            sizes[i] = max(1, min(extents[i], budget))
            budget = max(1, budget // sizes[i])
        ranges = [range(0, e, s) for e, s in zip(extents, sizes)]
        for starts in itertools.product(*ranges):
            env, shape = {}, []
            for i, (iv, st) in enumerate(zip(ivs, starts)):
                n = min(sizes[i], extents[i] - st)
                sh = [1] * len(ivs)
                sh[i] = n
                env[_key(iv.var)] = np.arange(mins[i] + st, mins[i] + st + n, dtype=np.int64).reshape(sh)
                shape.append(n)
            yield starts, env, tuple(shape)

    def store_spatial(self, store, ivs) -> None:
        buf = self.buffer(store.buffer)
        for _, env, shape in self.chunks(ivs) if ivs else [((), {}, ())]:
            value = np.broadcast_to(np.asarray(self.eval(store.value, env, None), np.float64
                                               if buf.dtype == np.float64 else buf.dtype), shape)
            idx = self.indices(store.indices, env, None, buf.shape, shape)
            buf[idx] = value

    def store_reduction(self, blk, store, ivs, reduce_axes) -> None:
        buf = self.buffer(store.buffer)
        spatial = [i for i in range(len(ivs)) if i not in reduce_axes]
        # the store indexes the output with the spatial iteration variables, each once
        order = []
        for ix in store.indices:
            hit = [i for i in spatial if ivs[i].var.same_as(ix)]
            if not hit or hit[0] in order:
                raise TirNotInterpretable("a reduction stored at other than its spatial iteration variables")
            order.append(hit[0])
        if sorted(order) != spatial:
            raise TirNotInterpretable("a reduction whose store does not use every spatial variable")
        ufunc, rhs = self.reducer(store)
        init = blk.init
        if init is None or type(init).__name__ != "BufferStore" or not init.buffer.same_as(store.buffer) or \
                len(init.indices) != len(store.indices) or \
                not all(a.same_as(b) for a, b in zip(init.indices, store.indices)):
            raise TirNotInterpretable("a reduction without a matching init")
        for starts, env, shape in self.chunks(ivs):
            sp_shape = tuple(shape[i] for i in spatial)
            # index arrays of the output, in the order the store uses the spatial variables
            idx = []
            for i in order:
                a = env[_key(ivs[i].var)].reshape(-1)
                sh = [1] * len(spatial)
                sh[spatial.index(i)] = a.size
                idx.append(a.reshape(sh))
            idx = tuple(np.broadcast_to(a, sp_shape) for a in idx)
            if all(starts[i] == 0 for i in reduce_axes):  # first visit of these outputs: init
                v0 = np.broadcast_to(np.asarray(self.eval(init.value, env, None), buf.dtype), shape)
                buf[idx] = v0[tuple(0 if i in reduce_axes else slice(None) for i in range(len(ivs)))]
            vals = np.broadcast_to(np.asarray(self.eval(rhs, env, None)), shape)
            part = ufunc.reduce(vals, axis=tuple(reduce_axes))
            buf[idx] = ufunc(buf[idx], part)

    def reducer(self, store):
        """(numpy ufunc, the combined expression) of ``C[i] = C[i] op expr``."""
        v = store.value
        ops = {"Add": np.add, "Mul": np.multiply, "Max": np.maximum, "Min": np.minimum}
        name = type(v).__name__
        if name not in ops:
            raise TirNotInterpretable(f"reduction combiner {name}")

        def is_self(e):
            return type(e).__name__ == "TensorLoad" and e.source.same_as(store.buffer) and \
                len(e.indices) == len(store.indices) and all(a.same_as(b) for a, b in zip(e.indices, store.indices))

        if is_self(v.a) and not self.reads(v.b, store.buffer):
            return ops[name], v.b
        if is_self(v.b) and not self.reads(v.a, store.buffer):
            return ops[name], v.a
        raise TirNotInterpretable("a reduction update that is not C = C op expr")

    def reads(self, e, buffer) -> bool:
        found = []

        def visit(x):
            if type(x).__name__ == "TensorLoad" and x.source.same_as(buffer):
                found.append(x)
            for attr in ("a", "b", "value", "condition", "true_value", "false_value", "body"):
                if hasattr(x, attr) and type(getattr(x, attr)).__module__.startswith("tvm"):
                    visit(getattr(x, attr))
            for attr in ("args", "indices"):
                for y in getattr(x, attr, ()) or ():
                    visit(y)

        visit(e)
        return bool(found)

    # ------------------------------------------------------------------ expressions
    def buffer(self, b) -> np.ndarray:
        try:
            return self.bufs[_key(b)]
        except KeyError:
            raise TirNotInterpretable(f"buffer {getattr(b, 'name', b)} not allocated") from None

    def indices(self, exprs, env, mask, bshape, shape=None):
        idx = []
        for d, e in enumerate(exprs):
            v = np.asarray(self.eval(e, env, mask))
            if v.dtype.kind not in "iub":
                raise TirNotInterpretable("a non-integer index")
            v = v.astype(np.int64)
            n = bshape[d]
            bad = (v < 0) | (v >= n)
            if np.any(bad if mask is None else (bad & mask)):
                raise TirNotInterpretable("an out-of-bounds read or write")
            idx.append(np.clip(v, 0, n - 1))
        if shape is not None:
            idx = [np.broadcast_to(i, shape) for i in idx]
        return tuple(idx)

    def eval(self, e, env, mask):
        name = type(e).__name__
        if name == "IntImm":
            return bool(e.value) if str(e.ty.dtype) == "bool" else int(e.value)
        if name == "FloatImm":
            return float(e.value)
        if name == "Var":
            try:
                return env[_key(e)]
            except KeyError:
                raise TirNotInterpretable(f"free variable {e}") from None
        if name == "TensorLoad":
            buf = self.buffer(e.source)
            return buf[self.indices(e.indices, env, mask, buf.shape)]
        if name in ("Add", "Sub", "Mul", "Div", "Mod", "FloorDiv", "FloorMod", "Min", "Max", "EQ", "NE", "LT",
                    "LE", "GT", "GE", "And", "Or"):
            a, b = self.eval(e.a, env, mask), self.eval(e.b, env, mask)
            return self.binary(name, a, b)
        if name == "Not":
            return np.logical_not(self.eval(e.a, env, mask))
        if name == "Select":
            return self.select(e.condition, e.true_value, e.false_value, env, mask)
        if name == "Cast":
            return self.cast(self.eval(e.value, env, mask), str(e.ty.dtype))
        if name == "Let":
            env2 = dict(env)
            env2[_key(e.var)] = self.eval(e.value, env, mask)
            return self.eval(e.body, env2, mask)
        if name == "Call":
            return self.call(e, env, mask)
        raise TirNotInterpretable(f"expression {name}")

    @staticmethod
    def binary(name, a, b):
        ints = np.asarray(a).dtype.kind in "iub" and np.asarray(b).dtype.kind in "iub"
        if name == "Add":
            return np.add(a, b)
        if name == "Sub":
            return np.subtract(a, b)
        if name == "Mul":
            return np.multiply(a, b)
        if name == "Div":
            return _truncdiv(a, b) if ints else np.divide(a, b)
        if name == "Mod":
            return np.subtract(a, np.multiply(b, _truncdiv(a, b))) if ints else np.fmod(a, b)
        if name == "FloorDiv":
            return np.floor_divide(a, b) if ints else np.floor(np.divide(a, b))
        if name == "FloorMod":
            return np.mod(a, b)
        if name == "Min":
            return np.minimum(a, b)
        if name == "Max":
            return np.maximum(a, b)
        return {"EQ": np.equal, "NE": np.not_equal, "LT": np.less, "LE": np.less_equal, "GT": np.greater,
                "GE": np.greater_equal, "And": np.logical_and, "Or": np.logical_or}[name](a, b)

    def select(self, cond, t, f, env, mask):
        c = np.asarray(self.eval(cond, env, mask), bool)
        m_t = c if mask is None else (mask & c)
        m_f = ~c if mask is None else (mask & ~c)
        return np.where(c, self.eval(t, env, m_t), self.eval(f, env, m_f))

    @staticmethod
    def cast(v, dtype: str):
        dt = _np_dtype(dtype)
        v = np.asarray(v)
        if dt is np.int64 and v.dtype.kind == "f":
            return np.trunc(v).astype(np.int64)
        return v.astype(dt)

    def call(self, e, env, mask):
        op = str(e.op.name) if hasattr(e.op, "name") else str(e.op)
        short = op.split(".", 1)[1] if "." in op else op
        args = list(e.args)
        if short == "if_then_else":
            return self.select(args[0], args[1], args[2], env, mask)
        if short == "erf":
            return _erf(np.asarray(self.eval(args[0], env, mask), np.float64))
        if short in _UNARY and len(args) == 1:
            return _UNARY[short](np.asarray(self.eval(args[0], env, mask), np.float64))
        if short in _BINARY and len(args) == 2:
            return _BINARY[short](np.asarray(self.eval(args[0], env, mask), np.float64),
                                  np.asarray(self.eval(args[1], env, mask), np.float64))
        if short in ("max_value", "min_value"):
            dt = str(e.ty.dtype)
            info = np.finfo(dt) if dt.startswith("float") else np.iinfo(dt)
            return float(info.max if short == "max_value" else info.min)
        raise TirNotInterpretable(f"intrinsic {op}")


def tir_reference(func, inputs: Sequence[np.ndarray], in_specs, out_specs) -> list[np.ndarray]:
    """Float64 outputs of the unscheduled PrimFunc ``func`` on ``inputs``, computed by numpy (no
    TVM compilation or execution). Raises TirNotInterpretable for constructs it does not cover."""
    return _TirInterpreter(func).run(inputs, in_specs, out_specs)
