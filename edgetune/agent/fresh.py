"""Fresh inputs for timed iterations (device_agents/PROTOCOL.md, "Fresh inputs").

Every timed iteration runs on inputs the candidate has not seen. Input k of iteration t, flattened
to n elements, is spliced from two of the host's input sets: elements [0, cut) from set ``a = t mod S``
cyclically shifted by o1, elements [cut, n) from another set ``b`` shifted by o2, where o1, o2, cut and
b come from ``splitmix64`` of a per-job seed the host chose. That gives on the order of S² n³
different inputs (a memoizing candidate never hits, even for tiny inputs), keeps every value one
the host generated (valid token ids stay valid), and costs the agent one copy per input. The host
replays the same function to compute the references of the iterations it checks. Both agents implement
exactly this function; the conformance suite proves they agree (a mismatch fails verification).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

M64 = (1 << 64) - 1


def splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def params(seed: int, t: int, k: int, n: int, n_sets: int) -> tuple[int, int, int, int, int]:
    """(set a, shift o1, set b, shift o2, cut) of input k (n elements) at iteration t."""
    h1 = splitmix64((seed + (t << 16) + k) & M64)
    h2 = splitmix64(h1)
    h3 = splitmix64(h2)
    a = t % n_sets
    b = (a + 1 + (h3 >> 32) % (n_sets - 1)) % n_sets if n_sets > 1 else a
    return a, h1 % n if n else 0, b, h2 % n if n else 0, h3 % (n + 1)


def fresh_inputs(input_sets: Sequence[Sequence[np.ndarray]], seed: int, t: int) -> list[np.ndarray]:
    out = []
    for k in range(len(input_sets[0])):
        shape = input_sets[0][k].shape
        n = int(np.prod(shape, dtype=np.int64))
        a, o1, b, o2, cut = params(seed, t, k, n, len(input_sets))
        ra = np.roll(np.ascontiguousarray(input_sets[a][k]).reshape(-1), o1)
        rb = np.roll(np.ascontiguousarray(input_sets[b][k]).reshape(-1), o2)
        out.append(np.concatenate([ra[:cut], rb[cut:]]).reshape(shape))
    return out
