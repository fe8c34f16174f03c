"""The one seeded-input generator: models and kernels draw from it, each with its profile."""

from __future__ import annotations

import math

import numpy as np
import pytest

from edgetune.errors import UserInputError
from edgetune.ops.base import TensorSpec, random_inputs
from edgetune.seeded import KERNEL, MODEL, seeded_array


@pytest.mark.parametrize("profile", [KERNEL, MODEL])
def test_floats_have_negatives_and_the_profiles_outliers(profile):
    x = seeded_array("float32", (400, 500), np.random.default_rng(3), profile)
    assert x.dtype == np.float32 and x.flags.c_contiguous
    assert (x < 0).mean() == pytest.approx(0.5, abs=0.01)
    big = np.abs(x) > 6  # N(0,1) alone almost never gets there (p = 2e-9); a scaled entry, with
    p_scaled = 1 - math.erf(6 / profile.outlier_scale / math.sqrt(2))  # P(|N(0,1)| * scale > 6)
    assert big.mean() == pytest.approx(profile.outlier_share * p_scaled, rel=0.1)
    assert np.abs(x).max() <= 6 * profile.outlier_scale


def test_integers_by_profile_and_range():
    rng = np.random.default_rng(1)
    ids = seeded_array("int64", (10_000,), rng, MODEL)  # model int64: token ids, non-negative
    assert ids.min() == 0 and ids.max() == MODEL.int_high - 1
    small = seeded_array("int8", (10_000,), rng, MODEL)
    assert small.min() == -8 and small.max() == 15
    k = seeded_array("int32", (10_000,), rng, KERNEL)
    assert k.min() == -8 and k.max() == 7
    r = seeded_array("int32", (10_000,), rng, KERNEL, int_range=(0, 3))
    assert set(np.unique(r)) == {0, 1, 2}
    b = seeded_array("bool", (10_000,), rng, MODEL)
    assert b.dtype == bool and 0.45 < b.mean() < 0.55
    with pytest.raises(UserInputError):
        seeded_array("complex64", (2,), rng, MODEL)


def test_same_seed_same_inputs_and_kernels_use_the_kernel_profile():
    specs = [TensorSpec("A", (64, 32)), TensorSpec("B", (32, 16))]
    a, b = random_inputs(specs, 7), random_inputs(specs, 7)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    rng = np.random.default_rng(7)
    assert np.array_equal(a[0], seeded_array("float32", (64, 32), rng, KERNEL))
    assert not np.array_equal(random_inputs(specs, 8)[0], a[0])
