"""Balanced contiguous stage sizes: the tuner's starting partitions for any stage count.

A min-max linear partition (exact DP, vectorized over the split point): the stage count may
exceed the device count (interleaved or V-shaped placements), which is why the tuner carries
this small helper instead of the one-stage-per-device DP in `solvers/`.
"""
from __future__ import annotations

import numpy as np

from octopipe.errors import ConfigError


def balanced_sizes(weights: np.ndarray, n_stages: int) -> tuple[int, ...]:
    """Layers per stage minimizing the largest stage sum of `weights` (every stage non-empty)."""
    w = np.asarray(weights, dtype=np.float64)
    L = len(w)
    if not 1 <= n_stages <= L:
        raise ConfigError(f"cannot split {L} layers into {n_stages} non-empty stages; "
                          "choose fewer stages (pp × chunks ≤ layers)")
    ps = np.concatenate([[0.0], np.cumsum(w)])
    best = np.full((n_stages, L + 1), np.inf)
    arg = np.zeros((n_stages, L + 1), dtype=np.int64)
    best[0, 1:] = ps[1:]
    lo = np.arange(L + 1)[:, None]
    hi = np.arange(L + 1)[None, :]
    span = np.where(hi > lo, ps[hi] - ps[lo], np.inf)
    for s in range(1, n_stages):
        # cand[lo, hi] = max(best[s-1, lo], cost(lo, hi))
        cand = np.maximum(best[s - 1][:, None], span)
        # on ties take the latest split point (argmin over the reversed rows)
        rev = cand[::-1]
        idx = L - np.argmin(rev, axis=0)
        best[s] = cand[idx, np.arange(L + 1)]
        arg[s] = idx
    sizes = []
    j = L
    for s in range(n_stages - 1, 0, -1):
        i = int(arg[s, j])
        sizes.append(j - i)
        j = i
    sizes.append(j)
    return tuple(reversed(sizes))
