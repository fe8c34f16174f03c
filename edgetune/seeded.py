"""The one seeded-input generator (DESIGN.md §5), for models and kernels alike.

Inputs are never zeros or ones: floats are N(0, 1) with a share of entries blown up, so a
candidate that drops, duplicates or mis-orders terms cannot hide inside the tolerance. Two
profiles set how large the outliers are, and why:

- ``KERNEL``: 1% of entries x100. A single kernel's output is a sum of products of its inputs;
  a wrong term then moves an output far beyond the float32 tolerance.
- ``MODEL``: 2% of entries x16. A whole network (softmax, layer norm, sigmoid) saturates on x100
  inputs, and a saturated output hides errors instead of showing them; x16 keeps activations in
  the range a network is built for while still exercising its tails.

Integers: small values of both signs; int32/int64 inputs of a model are usually indices (token
ids), so they stay small and non-negative; booleans are fair coins.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgetune.errors import UserInputError


@dataclass(frozen=True)
class Profile:
    outlier_share: float  # share of float entries scaled by outlier_scale
    outlier_scale: float
    int_high: int  # integers are drawn from [low, int_high)
    index_ints: bool  # int32/int64 are indices: drawn from [0, int_high)


KERNEL = Profile(outlier_share=0.01, outlier_scale=100.0, int_high=8, index_ints=False)
MODEL = Profile(outlier_share=0.02, outlier_scale=16.0, int_high=16, index_ints=True)


def seeded_array(dtype: str | np.dtype, shape: tuple[int, ...], rng: np.random.Generator,
                 profile: Profile = MODEL, int_range: tuple[int, int] | None = None) -> np.ndarray:
    """One seeded input of ``dtype`` and ``shape`` (C-contiguous), drawn from ``rng``.
    ``int_range``: [low, high) for integers instead of the profile's (an index input's valid range)."""
    dt = np.dtype(dtype)
    if dt.kind == "f":
        x = rng.standard_normal(shape)
        big = rng.random(shape) < profile.outlier_share
        return np.ascontiguousarray(np.where(big, x * profile.outlier_scale, x).astype(dt))
    if dt.kind == "b":
        return np.ascontiguousarray(rng.random(shape) < 0.5)
    if dt.kind in "iu" and int_range is not None:
        return np.ascontiguousarray(rng.integers(int_range[0], int_range[1], size=shape).astype(dt))
    if dt.kind in "iu":
        lo = 0 if dt.kind == "u" or (profile.index_ints and dt.itemsize >= 4) else -8
        return np.ascontiguousarray(rng.integers(lo, profile.int_high, size=shape).astype(dt))
    raise UserInputError(f"cannot generate inputs of dtype {dt}")
