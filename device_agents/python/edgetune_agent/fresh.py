"""Fresh inputs (PROTOCOL.md "Fresh inputs"): the inputs of iteration t, spliced from the host's input
sets, written in place into the work buffers. The host replays the same function
(edgetune/agent/fresh.py) to compute the references of the iterations it checks."""

M64 = (1 << 64) - 1


def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def fresh_params(seed, t, k, n, n_sets):
    """PROTOCOL.md "Fresh inputs": (set a, shift o1, set b, shift o2, cut) of input k at iteration t."""
    h1 = splitmix64((seed + (t << 16) + k) & M64)
    h2 = splitmix64(h1)
    h3 = splitmix64(h2)
    a = t % n_sets
    b = (a + 1 + (h3 >> 32) % (n_sets - 1)) % n_sets if n_sets > 1 else a
    return a, h1 % n if n else 0, b, h2 % n if n else 0, h3 % (n + 1)


def _copy_rolled(dst, src, o, lo, hi):
    """dst[i] = src[(i - o) mod n] for lo <= i < hi (np.roll(src, o)[lo:hi]), as at most two copies."""
    n = src.size
    if lo >= hi:
        return
    s0 = (lo - o) % n
    first = min(hi - lo, n - s0)
    dst[lo:lo + first] = src[s0:s0 + first]
    if first < hi - lo:
        dst[lo + first:hi] = src[:hi - lo - first]


def fill_fresh(work, sets, seed, t):
    """Inputs of iteration t, written in place into the work buffers the backend reads."""
    for k, w in enumerate(work):
        wf = w.reshape(-1)
        n = wf.size
        a, o1, b, o2, cut = fresh_params(seed, t, k, n, len(sets))
        _copy_rolled(wf, sets[a][k].reshape(-1), o1, 0, cut)
        _copy_rolled(wf, sets[b][k].reshape(-1), o2, cut, n)


def fill_set(work, base):
    for w, b in zip(work, base):
        w[...] = b
