"""RRFP's tensor-parallel agreement, timed: which tasks need it and what one round costs.

Under ready-first dispatch the TP ranks of a device must issue identical collectives in identical
order, so before every task that runs TP collectives they all-gather one scalar (the task each
would pick) and run it only if all agree (RRFP, arXiv 2605.18750). The simulator charges
one round, `agreement_seconds`, before each such task (`needs_agreement`, which
`octopipe.runtime.worker` uses too): F of a stage whose layers run a TP collective in F, I of
a stage whose layers run one in the backward (read off
`octopipe.cost.collectives.tp_layer_collectives`) except the first stage, whose I is empty in
this runtime (its input has no gradient), W only where this runtime's W runs one
(`weight_collective_stages`: the first stage, and QK-norm attention; Megatron's W runs none),
and B (I and W in one pass) where either does. Under ready-first a task is ready
only once its input has arrived, so its round follows readiness and adds to the task (`charged`).
Strict dispatch needs no agreement (every TP rank follows the same row), and `runtime.worker`
agrees on nothing there, so strict durations carry no charge. Under a buffer cap (the default
`max_inflight="plan"` included) the runtime agrees on every task, and `charged` charges every task.

One round is a ring all-gather of one int64 per rank over the TP group's link:
`(tp - 1)·latency + (tp - 1)·8 / bandwidth` (`octopipe.cost.collectives.all_gather_seconds`).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from octopipe.cluster import Link
from octopipe.cost.collectives import all_gather_seconds, tp_layer_collectives
from octopipe.model.layer import LayerKind
from octopipe.model.spec import ModelSpec
from octopipe.plan import Partition
from octopipe.sim.durations import Durations, TpAgreement
from octopipe.sim.program import Program

PICK_BYTES = 8.0
"""Each TP rank's pick: one int64."""


def agreement_seconds(tp: int, link: Link) -> float:
    """One agreement round: an all-gather of one int64 per rank over `tp` ranks on `link`."""
    return all_gather_seconds(PICK_BYTES * tp, tp, link)


def collective_stages(model: ModelSpec, partition: Partition | Sequence[tuple[int, int]],
                      tp: int) -> tuple[np.ndarray, np.ndarray]:
    """[S] bools: whether stage s runs a TP collective in its forward, and in its backward (I)."""
    part = Partition.of(partition)
    fwd, bwd = np.zeros(len(part), dtype=bool), np.zeros(len(part), dtype=bool)
    for s, (lo, hi) in enumerate(part):
        for x in model.layers[lo:hi]:
            phases = {c.phase for c in tp_layer_collectives(x, 1, tp)}
            fwd[s] |= "f" in phases
            bwd[s] |= "i" in phases
    return fwd, bwd


def weight_collective_stages(model: ModelSpec, partition: Partition | Sequence[tuple[int, int]],
                             tp: int) -> np.ndarray:
    """[S] bools: whether stage s's W runs a TP collective in this runtime (Megatron's W runs
    none): the first stage's, when it has backward collectives (its input, token ids or pixels,
    has no gradient, so its I is empty and `runtime.compute` runs its whole backward in W), and a
    stage holding TP attention with QK-norm (the norm weights are shared by the heads, so their
    gradient is all-reduced over the TP ranks, in W; `octopipe.layers.tensor_parallel`)."""
    part = Partition.of(partition)
    out = np.zeros(len(part), dtype=bool)
    if tp <= 1:
        return out
    _, bwd = collective_stages(model, part, tp)
    for s, (lo, hi) in enumerate(part):
        out[s] = (s == 0 and bwd[s]) or any(x.kind is LayerKind.ATTENTION and x.qk_norm for x in model.layers[lo:hi])
    return out


def needs_agreement(kind, fwd, bwd, wgt=False):
    """RRFP's rule, the one definition the simulator and `runtime.worker` share: whether a task of
    kind code `kind` (`octopipe.sim.hints.KIND_CODE`: F 0, I 1, W 2, B 3) is agreed on first,
    on a stage whose tasks run TP collectives in F (`fwd`), I (`bwd`), W (`wgt`,
    `weight_collective_stages`): exactly the tasks with collectives; B runs I and W in one pass,
    so it has them where either has. Scalars or numpy arrays."""
    k = np.asarray(kind)
    return np.where(k == 0, fwd, np.where(k == 1, bwd, np.where(k == 2, wgt, np.where(k == 3, bwd | wgt, False))))


def input_collective_stages(model: ModelSpec, partition: Partition | Sequence[tuple[int, int]],
                            tp: int) -> np.ndarray:
    """[S] bools: whether stage s's I runs a TP collective in this runtime: a stage with backward
    collectives, except the first, whose input (token ids or pixels) has no gradient, so its I
    computes nothing and its whole backward runs in W (`runtime.compute.RealCompute`)."""
    _, bwd = collective_stages(model, partition, tp)
    return bwd & (np.arange(len(bwd)) > 0)


def agreement_stages(model: ModelSpec, partition: Partition | Sequence[tuple[int, int]],
                     tp: int) -> tuple[tuple[bool, bool, bool], ...]:
    """Per stage: whether its F, I and W run TP collectives (what the agreement keys on)."""
    fwd, _ = collective_stages(model, partition, tp)
    inp = input_collective_stages(model, partition, tp)
    wgt = weight_collective_stages(model, partition, tp)
    return tuple((bool(f), bool(b), bool(w)) for f, b, w in zip(fwd, inp, wgt))


def collective_tasks(program: Program, model: ModelSpec,
                     partition: Partition | Sequence[tuple[int, int]], tp: int) -> np.ndarray:
    """[n_compute] bools: the compute nodes that run TP collectives (and so need an agreement)."""
    fwd, inp, wgt = (np.array(x, dtype=bool) for x in zip(*agreement_stages(model, partition, tp)))
    s = program.c_stage
    return needs_agreement(program.c_kind, fwd[s], inp[s], wgt[s]).astype(bool)


def with_agreement(dur: Durations, tasks: np.ndarray, seconds: float) -> Durations:
    """`dur` with RRFP's agreement: `seconds` before each compute node where `tasks` is set."""
    return replace(dur, agreement=TpAgreement(float(seconds), np.asarray(tasks, dtype=bool)))


def tp_agreement(program: Program, dur: Durations, model: ModelSpec,
                 partition: Partition | Sequence[tuple[int, int]], tp: int, link: Link,
                 seconds: float | None = None) -> Durations:
    """`dur` with the agreement of `tp` ranks per device before every task with TP collectives:
    `seconds` per round, or one scalar all-gather on `link` (unchanged at tp = 1)."""
    if tp <= 1:
        return dur
    a = agreement_seconds(tp, link) if seconds is None else float(seconds)
    return with_agreement(dur, collective_tasks(program, model, partition, tp), a)


def charged(dur: Durations, ready_first: bool, every_task: bool = False) -> Durations:
    """The durations the ready-first engine runs: each agreed task's round added to its compute
    (every task's with `every_task`: under a buffer cap the TP ranks also agree on admissions,
    as `runtime.worker` does); the agreement is then spent (`agreement` None), so charging twice
    adds nothing. Strict durations are returned as they are (strict dispatch agrees on nothing)."""
    ag = dur.agreement
    if ag is None or not ready_first:
        return dur
    return replace(dur, compute=dur.compute + ag.seconds * (True if every_task else ag.tasks), agreement=None)
