"""Balanced placements: stages to devices by LPT, then local moves and swaps on device loads.

(Balanced stages themselves come from `octopipe.plan.Partition.balanced`, the project's one
min-max linear-partition DP.)
"""
from __future__ import annotations

import numpy as np

from octopipe.errors import ConfigError


def lpt_placement(stage_work: np.ndarray, n_devices: int) -> tuple[int, ...]:
    """Stages to devices by longest-processing-time first (the OctoPipe authors' `balanced_transpose`).

    Heaviest stage first, each to the least-loaded device that does not hold a neighbouring
    stage (so consecutive stages stay on different devices when the count allows it).
    """
    w = np.asarray(stage_work, dtype=np.float64)
    S = len(w)
    if n_devices > S:
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


def _spread(w: np.ndarray, pl: list[int], n_devices: int, max_steps: int) -> list[int]:
    """Steepest descent on the sum of squared device loads over all moves and swaps
    (vectorized), keeping neighbours on different devices and every device busy."""
    S = len(pl)
    if S < 3:
        return pl
    for _ in range(max_steps):
        p = np.asarray(pl)
        load = np.bincount(p, weights=w, minlength=n_devices)
        count = np.bincount(p, minlength=n_devices)
        prev = np.concatenate([[-1], p[:-1]])
        nxt = np.concatenate([p[1:], [-1]])
        la = load[p]
        # swaps s <-> t: change of sum of squares = 2 d (l_t - l_s + d), d = w_s - w_t
        d = w[:, None] - w[None, :]
        delta = 2 * d * (la[None, :] - la[:, None] + d)
        ok = (p[:, None] != p[None, :])
        ok &= (p[None, :] != prev[:, None]) & (p[None, :] != nxt[:, None])
        ok &= (p[:, None] != prev[None, :]) & (p[:, None] != nxt[None, :])
        idx = np.arange(S)
        ok &= np.abs(idx[:, None] - idx[None, :]) > 1
        swap = np.where(ok, delta, np.inf)
        # moves s -> dev: change = 2 w_s (l_dev - l_s + w_s)
        mv = 2 * w[:, None] * (load[None, :] - la[:, None] + w[:, None])
        okm = (p[:, None] != np.arange(n_devices)[None, :]) & (count[p] > 1)[:, None]
        okm &= (np.arange(n_devices)[None, :] != prev[:, None]) & (np.arange(n_devices)[None, :] != nxt[:, None])
        move = np.where(okm, mv, np.inf)
        i_s = np.unravel_index(np.argmin(swap), swap.shape)
        i_m = np.unravel_index(np.argmin(move), move.shape)
        gain = min(swap[i_s], move[i_m])
        if not gain < -1e-18 * max(1.0, float((load ** 2).sum())):
            break
        if swap[i_s] <= move[i_m]:
            a, b = int(i_s[0]), int(i_s[1])
            pl[a], pl[b] = pl[b], pl[a]
        else:
            pl[int(i_m[0])] = int(i_m[1])
    return pl


def refine_balance(stage_work: np.ndarray, placement: tuple[int, ...], n_devices: int,
                   max_steps: int = 200) -> tuple[int, ...]:
    """Lower the device loads' spread, then the largest load, by moving or swapping stages.

    First a descent on the sum of squared loads over every move and swap; then each step takes
    the best move or swap that involves the most loaded device and strictly lowers the larger
    of the two loads it touches. Neighbouring stages stay on different devices and every device
    keeps a stage. Static loads only: the estimator judges the pipeline effects.
    """
    w = np.asarray(stage_work, dtype=np.float64)
    pl = _spread(w, list(placement), n_devices, max_steps)
    S = len(pl)
    load = np.bincount(pl, weights=w, minlength=n_devices)
    count = np.bincount(pl, minlength=n_devices)

    def ok(s: int, d: int, skip: int = -1) -> bool:
        return all(pl[t] != d for t in (s - 1, s + 1) if 0 <= t < S and t != skip)

    for _ in range(max_steps):
        top = int(np.argmax(load))
        peak = load[top]
        best = None                     # (new pair max, kind, a, b)
        mine = [s for s in range(S) if pl[s] == top]
        for s in mine:
            for d in range(n_devices):
                if d == top:
                    continue
                if count[top] > 1 and ok(s, d):
                    m = max(load[top] - w[s], load[d] + w[s])
                    if m < peak - 1e-15 and (best is None or m < best[0]):
                        best = (m, "move", s, d)
                for t in range(S):
                    if pl[t] != d or w[t] >= w[s]:
                        continue
                    if not (ok(s, d, skip=t) and ok(t, top, skip=s)):
                        continue
                    delta = w[s] - w[t]
                    m = max(load[top] - delta, load[d] + delta)
                    if m < peak - 1e-15 and (best is None or m < best[0]):
                        best = (m, "swap", s, t)
        if best is None:
            break
        _, kind, a, b = best
        if kind == "move":
            load[top] -= w[a]
            load[b] += w[a]
            count[top] -= 1
            count[b] += 1
            pl[a] = b
        else:
            d = pl[b]
            delta = w[a] - w[b]
            load[top] -= delta
            load[d] += delta
            pl[a], pl[b] = d, top
    return tuple(pl)
