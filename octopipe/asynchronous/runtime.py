"""Asynchronous training on the torch.distributed runtime: each rank's weight stash and update
policy, and the single-process replay it is checked against.

`WeightStash` is handed to `RealCompute` (runtime/compute.py's `weights` hook). Each stage's
weights live as numbered versions; a forward of (stage, micro-batch) runs the module at the
version the schedule assigns it (`AsyncSchedule.reads`) through fresh leaf tensors that share
that version's storage (the weight stash costs no copy); its backward returns the parameter
gradients to the stash, which applies plain SGD (w <- w - lr·g on the micro-batch's loss) after
every backward (PD, vsync) or once per window with the window's mean (2BW), or whatever
`update` it is given (the trainer's AdamW, `octopipe.train.stream`). Nothing is ever flushed
and no stashed version is changed in place, so in-flight micro-batches keep their versions.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.func import functional_call

from octopipe.asynchronous.tables import AsyncSchedule, Rule
from octopipe.errors import ScheduleError
from octopipe.layers.batch import microbatch
from octopipe.model.spec import ModelSpec
from octopipe.runtime.stage import StageModule
from octopipe.schedule.action import Action, F


class WeightStash:
    """Versions, per-micro-batch leaves and the update rule of the stages one rank holds."""

    def __init__(self, sched: AsyncSchedule, lr: float) -> None:
        if lr <= 0:
            raise ScheduleError(f"runtime.lr must be positive for asynchronous training, got {lr}")
        self.rule, self.window, self.lr = sched.rule, sched.window, float(lr)
        self.reads = {(a.stage, a.microbatch): v for a, v in sched.reads().items() if a.kind is F}
        self._left = Counter((s, v) for (s, _), v in self.reads.items())   # reads still to come
        self.versions: dict[int, dict[int, dict[str, torch.Tensor]]] = {}
        self.current: dict[int, int] = {}
        self.leaves: dict[tuple[int, int], dict[str, torch.Tensor]] = {}
        self.acc: dict[int, dict[str, torch.Tensor]] = {}
        self.pending: Counter = Counter()
        self.update: Callable | None = None    # (stage, current, summed grads, count) -> new version

    def sgd(self, stage: int, cur: dict[str, torch.Tensor], acc: dict[str, torch.Tensor],
            count: int) -> dict[str, torch.Tensor]:
        """The default update: w <- w - lr · (mean of the accumulated gradients)."""
        scale = self.lr / count
        return {n: cur[n] - scale * acc[n] for n in cur}

    def bind(self, stage: int, module: torch.nn.Module) -> None:
        """Version 0 of `stage`: the module's initial parameters."""
        self.versions[stage] = {0: {n: p.detach().clone() for n, p in module.named_parameters()}}
        self.current[stage] = 0

    def forward_params(self, stage: int, mb: int) -> dict[str, torch.Tensor]:
        v = self.reads[(stage, mb)]
        have = self.versions[stage]
        if v not in have:
            raise ScheduleError(f"{stage}F{mb} reads version {v} of stage {stage}, which this rank "
                                f"has not made yet (current {self.current[stage]}): run "
                                f"asynchronous schedules with runtime.dispatch=strict")
        leaves = {n: t.detach().requires_grad_(True) for n, t in have[v].items()}
        self.leaves[(stage, mb)] = leaves
        self._left[(stage, v)] -= 1
        return leaves

    def params(self, stage: int, mb: int) -> list[torch.Tensor]:
        """The leaves of (stage, mb), in the module's parameter order."""
        return list(self.leaves[(stage, mb)].values())

    def backward_done(self, stage: int, mb: int, grads) -> None:
        """Take the parameter gradients of (stage, mb); update when the rule says so."""
        leaves = self.leaves.pop((stage, mb))
        acc = self.acc.setdefault(stage, {})
        for (n, t), g in zip(leaves.items(), grads):
            g = torch.zeros_like(t) if g is None else g.detach()
            acc[n] = g if n not in acc else acc[n] + g
        self.pending[stage] += 1
        if self.rule is Rule.TWO_BW and self.pending[stage] < self.window:
            return
        cur = self.versions[stage][self.current[stage]]
        new = (self.update or self.sgd)(stage, cur, acc, self.pending[stage])
        self.current[stage] += 1
        self.versions[stage][self.current[stage]] = new
        self.acc[stage], self.pending[stage] = {}, 0
        for v in [v for v in self.versions[stage] if v < self.current[stage] and self._left[(stage, v)] <= 0]:
            del self.versions[stage][v]

    def state(self) -> dict[str, torch.Tensor]:
        """The current weights of every stage bound here, by parameter name."""
        return {n: t.detach().cpu().clone() for s in sorted(self.current)
                for n, t in self.versions[s][self.current[s]].items()}


@dataclass(frozen=True)
class Replay:
    """The single-process replay: the loss of every micro-batch and the final weights."""

    losses: dict[int, float]
    weights: dict[str, torch.Tensor]


def replay(model: ModelSpec, partition, sched: AsyncSchedule, lr: float, seed: int = 0) -> Replay:
    """The same version assignment in one process: micro-batch k's forward and backward run
    through every stage at the versions its forwards read (the stale mixed model), and each
    stage's updates are applied in the table's time order, as `WeightStash` applies them."""
    mods = [StageModule(model, lo, hi, seed=seed) for lo, hi in partition]
    sgd = WeightStash(sched, lr).sgd
    return replay_stream(mods, sched, lambda k: microbatch(model, seed, 0, k), sgd)


def replay_stream(mods, sched: AsyncSchedule, batch_of: Callable[[int], dict],
                  update: Callable) -> Replay:
    """`sched` replayed on the stage modules `mods` (version 0: their parameters), micro-batch
    k's data `batch_of(k)`, each stage's update `update(stage, current, summed grads, count)`
    (as `WeightStash.update`); versions no later read needs are dropped as the stash drops
    them."""
    versions = [{0: {n: p.detach().clone() for n, p in m.named_parameters()}} for m in mods]
    current = [0] * len(mods)
    reads = sched.reads()
    left = Counter((a.stage, v) for a, v in reads.items() if a.kind is F)
    grads: dict[int, list[dict[str, torch.Tensor]]] = {}
    losses: dict[int, float] = {}
    acc: list[dict[str, torch.Tensor]] = [{} for _ in mods]
    count = [0] * len(mods)
    for e in sched.events:
        a = e.action
        if a.kind is F or (a.kind.value == "I"):
            continue
        k, s = a.microbatch, a.stage
        if k not in grads:
            grads[k], losses[k] = _mixed_grads(mods, versions, reads, batch_of(k), k)
            for j in range(len(mods)):
                left[(j, reads[Action(j, F, k)])] -= 1
        g = grads[k][s]
        acc[s] = {n: g[n] if n not in acc[s] else acc[s][n] + g[n] for n in g}
        count[s] += 1
        if s == 0:
            del grads[k]
        if e.update < 0:
            continue
        versions[s][current[s] + 1] = update(s, versions[s][current[s]], acc[s], count[s])
        current[s] += 1
        acc[s], count[s] = {}, 0
        for v in [v for v in versions[s] if v < current[s] and left[(s, v)] <= 0]:
            del versions[s][v]
    weights = {n: t.clone() for s, vs in enumerate(versions) for n, t in vs[current[s]].items()}
    return Replay(losses, weights)


def _mixed_grads(mods, versions, reads, batch: dict, k: int):
    """Loss and per-stage parameter gradients of micro-batch k at its stale mixed model."""
    leaves = [{n: t.detach().requires_grad_(True)
               for n, t in versions[s][reads[Action(s, F, k)]].items()} for s in range(len(mods))]
    h = None
    for s, m in enumerate(mods):
        h = functional_call(m, leaves[s], (h, batch))
    flat = [t for lv in leaves for t in lv.values()]
    gs = torch.autograd.grad(h, flat, allow_unused=True)
    out, i = [], 0
    for lv in leaves:
        out.append({n: (gs[i + j] if gs[i + j] is not None else torch.zeros_like(t))
                    for j, (n, t) in enumerate(lv.items())})
        i += len(lv)
    return out, float(h.detach())


__all__ = ["Replay", "WeightStash", "replay", "replay_stream"]
