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


def lpt_placement(stage_work: np.ndarray, n_devices: int) -> tuple[int, ...]:
    """Stages to devices by longest-processing-time first (the published `balanced_transpose`).

    Heaviest stage first, each to the least-loaded device that does not hold a neighbouring
    stage (so consecutive stages stay on different devices when the count allows it).
    """
    w = np.asarray(stage_work, dtype=np.float64)
    S = len(w)
    if S < n_devices:
        raise ConfigError(f"{S} stages cannot occupy {n_devices} devices; use at least one stage per device")
    place = [-1] * S
    load = np.zeros(n_devices)
    count = np.zeros(n_devices, dtype=np.int64)
    for s in sorted(range(S), key=lambda k: (-w[k], k)):
        banned = {place[t] for t in (s - 1, s + 1) if 0 <= t < S}
        empty = [d for d in range(n_devices) if count[d] == 0 and d not in banned]
        remaining = sum(1 for p in place if p < 0)
        if empty and remaining <= int((count == 0).sum()):
            opts = empty            # every device must end up with a stage
        else:
            opts = [d for d in range(n_devices) if d not in banned] or list(range(n_devices))
        d = min(opts, key=lambda k: (load[k], k))
        place[s] = d
        load[d] += w[s]
        count[d] += 1
    return tuple(place)
