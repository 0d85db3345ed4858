"""Moves on the three levers, aimed at the largest bubble cause.

Partition: shift one layer across a stage boundary; cut a stage in two or merge two.
Placement: move a stage to another device; swap two stages' devices.
Schedule: split backward on/off (1F1B-like vs zero-bubble), in-flight limit up/down or
memory-bound, priority order of F/I/W, tie-breaks, W deferral threshold; the stage count per
device (1 = 1F1B-like, more = interleaved or V-shaped) changes through cut/merge.

Each generator returns `(candidate, benefit)` pairs; the benefit is the OctoPipe authors' tuner's bubble
pressure heuristic (move compute towards devices that idle most and carry least), used to rank
moves before the estimator runs.
"""
from __future__ import annotations

import math

import numpy as np

from octopipe.plan import Partition
from octopipe.tune.attribution import Attribution
from octopipe.tune.balance import refine_balance
from octopipe.tune.candidate import KIND_RANKS, Candidate, Problem

INFLIGHT_STEPS = (0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 3.0, math.inf)
W_PRESSURES = (0.5, 0.8, 0.9, 1.0, 2.0)

Move = tuple[Candidate, float]


def pressure(attr: Attribution, load: np.ndarray) -> np.ndarray:
    """Per device: idle share minus a quarter of its relative static load (the OctoPipe authors' rule)."""
    T = attr.makespan if attr.makespan > 0 else 1.0
    top = load.max() if load.max() > 0 else 1.0
    return attr.idle / T - 0.25 * load / top


def _layer_work(problem: Problem) -> np.ndarray:
    return problem.layer_work()


def shift_layer(c: Candidate, problem: Problem, pr: np.ndarray) -> list[Move]:
    """Move one layer across each stage boundary, in either direction."""
    work = _layer_work(problem)
    out: list[Move] = []
    sizes, pl = list(c.sizes), c.placement
    lo = c.partition.bounds
    for b in range(len(sizes) - 1):
        da, db = pl[b], pl[b + 1]
        if sizes[b] > 1:        # last layer of stage b → stage b+1
            layer = int(lo[b + 1] - 1)
            new = sizes.copy()
            new[b] -= 1
            new[b + 1] += 1
            ben = (pr[db] - pr[da]) * work[layer, db]
            out.append((c.with_(partition=Partition(tuple(new))), float(ben)))
        if sizes[b + 1] > 1:    # first layer of stage b+1 → stage b
            layer = int(lo[b + 1])
            new = sizes.copy()
            new[b] += 1
            new[b + 1] -= 1
            ben = (pr[da] - pr[db]) * work[layer, da]
            out.append((c.with_(partition=Partition(tuple(new))), float(ben)))
    return out


def move_stage(c: Candidate, problem: Problem, pr: np.ndarray, devices: list[int] | None = None) -> list[Move]:
    """Stage s → device d, keeping every device busy and neighbours on other devices."""
    D = problem.n_devices
    work = _layer_work(problem)
    count = np.bincount(np.asarray(c.placement), minlength=D)
    pl = c.placement
    lo = c.partition.bounds
    out: list[Move] = []
    for s, src in enumerate(pl):
        if count[src] <= 1:
            continue
        for d in (devices if devices is not None else range(D)):
            if d == src or (s > 0 and pl[s - 1] == d) or (s + 1 < len(pl) and pl[s + 1] == d):
                continue
            new = list(pl)
            new[s] = d
            w = work[lo[s]:lo[s + 1], d].sum()
            out.append((c.with_(placement=tuple(new)), float((pr[d] - pr[src]) * w)))
    return out


def swap_stages(c: Candidate, problem: Problem, pr: np.ndarray, focus: set[int] | None = None) -> list[Move]:
    """Exchange the devices of two stages on different devices."""
    work = _layer_work(problem)
    pl = c.placement
    lo = c.partition.bounds
    cost = [work[lo[s]:lo[s + 1], pl[s]].sum() for s in range(len(pl))]
    out: list[Move] = []
    S = len(pl)
    for a in range(S):
        da = pl[a]
        left = pl[a - 1] if a > 0 else -1
        for b in range(a + 1, S):
            db = pl[b]
            if da == db or (focus is not None and da not in focus and db not in focus):
                continue
            # the swapped stages may not sit beside a stage of their new device
            if db == left or (b > a + 1 and db == pl[a + 1]) or (b + 1 < S and da == pl[b + 1]) \
                    or (b > a + 1 and da == pl[b - 1]):
                continue
            new = list(pl)
            new[a], new[b] = db, da
            ben = pr[da] * (cost[b] - cost[a]) + pr[db] * (cost[a] - cost[b])
            out.append((c.with_(placement=tuple(new)), float(ben)))
    return out


def cut_or_merge(c: Candidate, problem: Problem, pr: np.ndarray) -> list[Move]:
    """Cut a stage in two (the new half on the idlest allowed device) or merge neighbours."""
    D = problem.n_devices
    work = _layer_work(problem)
    pl, sizes = list(c.placement), list(c.sizes)
    S = len(sizes)
    lo = c.partition.bounds
    out: list[Move] = []
    order = np.argsort(-pr)
    for s in range(S):
        if sizes[s] >= 2:
            w = work[lo[s]:lo[s + 1], pl[s]]
            cut = int(np.clip(np.searchsorted(np.cumsum(w), w.sum() / 2) + 1, 1, sizes[s] - 1))
            for half in (0, 1):
                nxt = pl[s + 1] if s + 1 < S else None
                prv = pl[s - 1] if s > 0 else None
                for d in order[:2]:
                    d = int(d)
                    if half == 1:
                        if d in (pl[s], nxt):
                            continue
                        new_pl = pl[:s + 1] + [d] + pl[s + 1:]
                    else:
                        if d in (pl[s], prv):
                            continue
                        new_pl = pl[:s] + [d] + pl[s:]
                    new_sz = sizes[:s] + [cut, sizes[s] - cut] + sizes[s + 1:]
                    out.append((c.with_(partition=Partition(tuple(new_sz)), placement=tuple(new_pl)), 0.0))
                    break
        if s + 1 < S:
            for keep in (pl[s], pl[s + 1]):
                new_pl = pl[:s] + [keep] + pl[s + 2:]
                if len(set(new_pl)) < D:
                    continue
                new_sz = sizes[:s] + [sizes[s] + sizes[s + 1]] + sizes[s + 2:]
                out.append((c.with_(partition=Partition(tuple(new_sz)), placement=tuple(new_pl)), 0.0))
    return out


def rebalance(c: Candidate, problem: Problem) -> list[Move]:
    """Re-place stages to lower the largest static device load (a compound placement move)."""
    work = _layer_work(problem)
    pl = c.placement
    lo = c.partition.bounds
    sw = np.array([work[lo[s]:lo[s + 1], pl[s]].sum() for s in range(len(pl))])
    new = refine_balance(sw, pl, problem.n_devices)
    return [] if new == pl else [(c.with_(placement=new), 1.0)]


def policy_moves(c: Candidate) -> list[Move]:
    """Schedule-family and policy changes for the same partition and placement."""
    out: list[Candidate] = [c.with_(split_backward=not c.split_backward)]
    try:
        k = INFLIGHT_STEPS.index(c.inflight)
        for j in (k - 1, k + 1):
            if 0 <= j < len(INFLIGHT_STEPS):
                out.append(c.with_(inflight=INFLIGHT_STEPS[j]))
    except ValueError:
        out.extend(c.with_(inflight=x) for x in (1.0, math.inf))
    out.extend(c.with_(kind_rank=r) for r in KIND_RANKS if r != c.kind_rank)
    out.append(c.with_(f_tiebreak=1 - c.f_tiebreak))
    out.append(c.with_(b_tiebreak=1 - c.b_tiebreak))
    out.extend(c.with_(w_pressure=p) for p in W_PRESSURES if p != c.w_pressure)
    return [(x, 0.0) for x in out]


def warmup_moves(c: Candidate, n_devices: int) -> list[Move]:
    """Under a memory budget: one stage's in-flight limit one higher or lower (one forward more
    or less before its first backward), the per-device warm-up depth zero-bubble's automatic
    scheduler chooses; the budget still caps what the list scheduler may hold."""
    if math.isinf(c.inflight):
        return []
    S = c.n_stages
    base = tuple(c.warmup) if len(c.warmup) == S else (0,) * S
    lim = c.limits(n_devices)
    out: list[Move] = []
    for s in range(S):
        for step in (1, -1):
            if lim[s] + step < 1:
                continue
            new = list(base)
            new[s] += step
            out.append((c.with_(warmup=tuple(new) if any(new) else ()), 0.0))
    return out


def neighbours(c: Candidate, problem: Problem, attr: Attribution) -> list[tuple[Candidate, float, str]]:
    """Moves for `c`, the family matching the largest bubble cause listed first."""
    load = problem.device_load(c)
    pr = pressure(attr, load)
    cause, _ = attr.largest()
    busiest, idlest = int(np.argmax(load)), int(np.argmax(attr.idle))
    part = [(x, b, "shift layer") for x, b in shift_layer(c, problem, pr)]
    place = ([(x, b, "rebalance") for x, b in rebalance(c, problem)]
             + [(x, b, "move stage") for x, b in move_stage(c, problem, pr)]
             + [(x, b, "swap stages") for x, b in swap_stages(c, problem, pr, {busiest, idlest})])
    shape = [(x, b, "cut/merge") for x, b in cut_or_merge(c, problem, pr)]
    sched = [(x, b, "policy") for x, b in policy_moves(c)]
    if problem.act_budget is not None:
        sched += [(x, b, "warm-up depth") for x, b in warmup_moves(c, problem.n_devices)]
    if cause == "imbalance":
        groups = [place, part, shape, sched]
    elif cause == "memory":
        groups = [sched, place, part, shape]
    elif cause == "transfer":
        groups = [shape, place, part, sched]
    else:
        groups = [sched, shape, part, place]
    out: list[tuple[Candidate, float, str]] = []
    seen = {c}
    for g in groups:
        g.sort(key=lambda t: -t[1])
        for x, b, tag in g:
            if x not in seen:
                seen.add(x)
                out.append((x, b, tag))
    return out


def perturb(c: Candidate, problem: Problem, rng: np.random.Generator, strength: int) -> Candidate:
    """A kick: `strength` random moves (used to leave a local optimum)."""
    pr = np.zeros(problem.n_devices)
    for _ in range(strength):
        pick = rng.integers(4)
        if pick == 0:
            opts = shift_layer(c, problem, pr)
        elif pick == 1:
            opts = swap_stages(c, problem, pr)
        elif pick == 2:
            opts = move_stage(c, problem, pr)
        else:
            opts = policy_moves(c)
        if opts:
            c = opts[int(rng.integers(len(opts)))][0]
    return c
