"""Which heavy layers the search splits into pieces: the options of a `LayerSplitter` scored by
their bounds, ties broken by their best starting point, and candidates carried onto the split."""
from __future__ import annotations

import math
from dataclasses import replace

from octopipe.plan import Partition
from octopipe.tune.bounds import layer_bound
from octopipe.tune.candidate import Candidate, Problem
from octopipe.tune.search import (
    iter_seed_candidates,
)
from octopipe.tune.splitting import LayerSplitter, map_sizes, packed_max


def split_problem(whole: Problem, splitter: LayerSplitter, counts: dict) -> Problem:
    """`whole` with its layers split by `counts` (itself when nothing splits)."""
    if not counts:
        return whole
    return Problem.build(splitter.costs_for(counts), whole.cluster, whole.n_devices,
                         whole.n_microbatches, whole.semantics, whole.act_budget, whole.contention)


def choose_split(whole: Problem, splitter: LayerSplitter, max_share: float, max_chunks: int,
                   gain: float = 0.01) -> tuple[Problem, dict, list[dict]]:
    """The split worth searching, of `splitter.options`, and how each option scored.

    A split's bound is the larger of its layer bound (the heaviest piece with the fill before it
    and the drain after it) and its pieces packed onto the devices (LPT), so both kinds of gap
    count: an LM head heavier than a device's share, and 26 equal MoE layers on 8 devices, where
    one device must take 4 (23% over the share; thirds: 2.6%). Options within `gain` of the
    lowest bound tie on it; the bound does not see the fill and drain of a deep pipeline, which
    smaller pieces shorten (more, smaller chunks per device), so a tie goes to the option whose
    best starting point (`iter_seed_candidates`, split backward, estimated) is shortest, then to
    the fewest pieces. The estimates are a fixed set per option: the same choice at any load."""
    D, M = whole.n_devices, whole.n_microbatches
    work = whole.layer_work().min(axis=1)
    scored = []
    for counts in splitter.options(work, D, max_share):
        pb = split_problem(whole, splitter, counts)
        bound = max(layer_bound(pb), M * packed_max(pb.layer_work().min(axis=1), D))
        scored.append((bound, sum(counts.values()), pb, counts))
    best = min(b for b, _, _, _ in scored)
    near = [j for j, x in enumerate(scored) if x[0] <= best * (1 + gain)]
    seeds = {j: best_seed_estimate(scored[j][2], max_chunks) for j in near} if len(near) > 1 else {}
    pick = min(near, key=lambda j: (seeds.get(j, 0.0), scored[j][1]))
    info = [{"pieces": n, "bound_s": b, **({"best_start_s": seeds[j]} if j in seeds else {})}
            for j, (b, n, _, _) in enumerate(scored)]
    return scored[pick][2], scored[pick][3], info


def best_seed_estimate(problem: Problem, max_chunks: int) -> float:
    """The shortest estimate among `problem`'s split-backward starting points."""
    best = math.inf
    for c in iter_seed_candidates(problem, max_chunks):
        if c.split_backward:
            v = problem.estimate_makespan(c, best)
            if v < best:                # NaN: stopped early, above `best`
                best = v
    return best


def on_split_layers(cand: Candidate, counts: dict) -> Candidate:
    """A candidate over the original layers as the same stages over the split model."""
    return replace(cand, partition=Partition(map_sizes(cand.sizes, counts))) if counts else cand
