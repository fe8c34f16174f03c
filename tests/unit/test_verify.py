import numpy as np

from edgetune.verify import array_sha256, verify

NAMES = ["y"]


def _refs(n=3, shape=(4, 5), seed=0):
    rng = np.random.default_rng(seed)
    return [[rng.standard_normal(shape).astype(np.float32)] for _ in range(n)]


def _run(outputs, refs, repeat=None, before=None, after=None, sent=None):
    sent = sent or ["a", "b", "c"]
    return verify(NAMES, refs, outputs, repeat if repeat is not None else [outputs[0][0].copy()], 0, sent,
                  before if before is not None else sent, after if after is not None else sent)


def test_exact_outputs_pass_with_errors_reported():
    refs = _refs()
    v = _run([[r[0].copy()] for r in refs], refs)
    assert v.ok, v.reason
    assert v.max_abs_err == 0 and v.max_rel_err == 0 and v.bitwise_deterministic


def test_small_error_within_fp32_tolerance_passes():
    refs = _refs()
    outs = [[r[0] * np.float32(1 + 2e-6)] for r in refs]
    v = _run(outs, refs, repeat=[outs[0][0].copy()])
    assert v.ok and 0 < v.max_rel_err < 1e-4


def test_wrong_numerics_fail():
    refs = _refs()
    outs = [[r[0] + np.float32(0.01) * np.abs(r[0]).max()] for r in refs]
    v = _run(outs, refs)
    assert not v.ok and "tolerance" in v.reason and v.max_rel_err > 1e-4


def test_poison_left_in_output_fails():
    refs = _refs()
    outs = [[r[0].copy()] for r in refs]
    outs[1][0][0, 0] = np.nan
    v = _run(outs, refs)
    assert not v.ok and "NaN" in v.reason


def test_shape_and_dtype_mismatch_fail():
    refs = _refs()
    assert "shape" in _run([[r[0][:2]] for r in refs], refs).reason
    assert "dtype" in _run([[r[0].astype(np.float64)] for r in refs], refs).reason


def test_nondeterminism_fails():
    refs = _refs()
    outs = [[r[0].copy()] for r in refs]
    rep = [outs[0][0] + np.float32(5e-5) * np.abs(outs[0][0]).max()]
    v = _run(outs, refs, repeat=rep)
    assert not v.ok and "non-deterministic" in v.reason


def test_modified_inputs_fail():
    refs = _refs()
    v = _run([[r[0].copy()] for r in refs], refs, after=["a", "x", "c"])
    assert not v.ok and "modified its inputs" in v.reason
    v = _run([[r[0].copy()] for r in refs], refs, before=["z", "b", "c"])
    assert not v.ok and "corrupted" in v.reason


def test_constant_output_is_insensitive():
    # references differ by less than the tolerance, so only the sensitivity check can catch this
    base = np.random.default_rng(5).standard_normal((4, 5)).astype(np.float32)
    refs = [[base], [base + np.float32(1e-7)], [base - np.float32(1e-7)]]
    outs = [[base.copy()] for _ in refs]
    v = _run(outs, refs)
    assert not v.ok and "insensitive" in v.reason


def test_integer_outputs_must_match_exactly():
    refs = [[np.array([1, 2, 3], dtype=np.int64)], [np.array([3, 2, 1], dtype=np.int64)]]
    outs = [[np.array([1, 2, 3], dtype=np.int64)], [np.array([3, 2, 2], dtype=np.int64)]]
    v = verify(NAMES, refs, outs, [outs[0][0]], 0, ["a"], ["a"], ["a"])
    assert not v.ok


def test_array_sha256_is_content_hash():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert array_sha256(a) == array_sha256(a.copy())
    assert array_sha256(a) != array_sha256(a + 1)
