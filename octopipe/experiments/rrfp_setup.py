"""`experiment=rrfp`'s set-ups: the workloads (language, multimodal) split to balanced stages,
their modelled costs on the loopback cluster, and the runtime configuration of each level."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from octopipe.cluster import Link
from octopipe.config.cost import AnalyticCost
from octopipe.config.experiment import RrfpExperiment
from octopipe.config.presets import preset
from octopipe.config.runtime import RuntimeConfig
from octopipe.cost.analytic import analytic_costs
from octopipe.cost.table import CostTable
from octopipe.model.build import build_model
from octopipe.model.pieces import split_model
from octopipe.model.spec import ModelSpec
from octopipe.plan import Partition, Plan
from octopipe.runtime.job import Job
from octopipe.runtime.machine import local_cluster
from octopipe.schedule.library import build_schedule
from octopipe.tune.splitting import model_splitter

LINK = Link("loopback", 5e8, 1e-4)


SEED = 0


@dataclass(frozen=True)
class Level:
    """One variability point: compute jitter CV, straggler case or not."""

    cv: float
    straggler: bool


@dataclass(frozen=True)
class Setup:
    """One workload on one compute mode: model, costs, partition, tables and the base config."""

    workload: str
    compute: str
    tp: int
    model: ModelSpec
    costs: CostTable
    plans: dict                     # "1f1b" | "zbh1" -> Plan
    config: RuntimeConfig

    def job(self, schedule: str, config: RuntimeConfig) -> Job:
        n = self.plans[schedule].table.n_devices
        return Job(self.plans[schedule], self.model, config, seed=SEED, costs=self.costs,
                   cluster=local_cluster(n, LINK))


def quick(ex: RrfpExperiment) -> RrfpExperiment:
    """The small grid of `experiment.quick`."""
    return replace(ex, jitter_cvs=(0.0, 0.5), real_jitter_cvs=(0.5,), straggler_prob=0.0, hints=("bfw",),
                   real_hints=("bfw",), tp_jitter_cvs=(0.5,), tp_microbatches=4, tp_emulate_step_s=ex.emulate_step_s,
                   emulated_ranks=min(ex.emulated_ranks, 4), emulated_microbatches=4, real_microbatches=4,
                   iterations=1, warmup=0, monte_carlo=3, real_rounds=min(ex.real_rounds, 2))


def levels(ex: RrfpExperiment, compute: str = "emulated", tp: int = 1) -> list[Level]:
    cvs = ex.real_jitter_cvs if compute == "real" else ex.tp_jitter_cvs if tp > 1 else ex.jitter_cvs
    out = [Level(float(c), False) for c in cvs]
    if ex.straggler_prob > 0 and compute == "emulated" and tp == 1:
        out.append(Level(float(ex.straggler_cv), True))
    return out


def setup_model(ex: RrfpExperiment, workload: str) -> ModelSpec:
    return build_model(preset("model", ex.language if workload == "language" else ex.multimodal))


def split_layers(model: ModelSpec, costs_of: Callable[[ModelSpec], CostTable], n: int,
                 share: float) -> ModelSpec:
    """`model` with its heavy layers cut into pieces (`octopipe.model.pieces`: the head by
    vocabulary, MLPs by FFN width) as the planner's split_layers lever chooses them
    (`octopipe.tune.splitting`): of whole layers and pieces capped at 1, 1/2 and 1/4 of `share` x a
    mean stage, the fewest pieces whose bound is within 1% of the lowest; the bound here is the
    largest stage of the balanced partition this experiment runs. Both workloads get the same
    rule: a partition bound by one stage leaves dispatch order little to win."""
    splitter = model_splitter(model, costs_of)
    work = layer_work(costs_of(model))
    scored = []
    for counts in splitter.options(work, n, share):
        w = layer_work(splitter.costs_for(counts)) if counts else work
        scored.append((stage_max(w, n), sum(counts.values()), counts))
    best = min(b for b, _, _ in scored)
    _, _, counts = min((x for x in scored if x[0] <= best * 1.01), key=lambda x: x[1])
    return split_model(model, counts) if counts else model


def layer_work(costs: CostTable) -> np.ndarray:
    """Each layer's F + I + W seconds (what the partition balances)."""
    return costs.f[:, 0] + costs.i[:, 0] + costs.w[:, 0]


def stage_sums(work: np.ndarray, part: Partition) -> np.ndarray:
    """Each stage's sum of `work` (per layer) under `part`."""
    return np.array([work[lo:hi].sum() for lo, hi in part.ranges])


def stage_max(work: np.ndarray, n: int) -> float:
    """The largest stage sum of `work`'s balanced partition on `n` stages."""
    return float(stage_sums(work, Partition.balanced(work, n)).max())


def stage_balance(s: Setup) -> float:
    """The largest stage's F + I + W over the mean stage's, in `s`'s partition."""
    st = stage_sums(layer_work(s.costs), s.plans["1f1b"].partition)
    return float(st.max() / st.mean())


def setup(ex: RrfpExperiment, workload: str, compute: str, tp: int = 1) -> Setup:
    """Model, analytic costs, a partition balanced on them and the 1F1B / ZB-H1 plans (with
    `tp` TP ranks per pipeline rank: emulated_ranks / tp pipeline ranks, costed at cost.tp = tp:
    work divided by tp, TP collectives timed on the loopback link and added to F and I)."""
    whole = setup_model(ex, workload)
    n = ex.emulated_ranks // tp if compute == "emulated" else ex.real_ranks
    m = ex.emulated_microbatches if compute == "emulated" else ex.real_microbatches
    cost = AnalyticCost(tp=tp)

    def costs_of(m: ModelSpec) -> CostTable:
        return analytic_costs(cost, m, local_cluster(n, LINK))
    model = split_layers(whole, costs_of, n, ex.split_share)
    costs = costs_of(model)
    part = Partition.balanced(layer_work(costs), n)
    plans = {s: Plan(part, build_schedule(s, n, m), model=model.name) for s in ("1f1b", "zbh1")}
    mm = workload == "multimodal"
    config = RuntimeConfig(
        compute=compute, iterations=ex.iterations, warmup=ex.warmup, emulate_step_s=ex.emulate_step_s,
        max_message_bytes=16384, timeout_s=600.0, stall_s=60.0, pin="false", calibrate=False,
        grad_check=False, max_inflight=ex.max_inflight,
        seq_len_cv=ex.multimodal_seq_len_cv if mm else ex.language_seq_len_cv,
        images_max=ex.multimodal_images_max if mm else 0, tp=tp)
    return Setup(workload, compute, tp, model, costs, plans, config)


def level_config(base: RuntimeConfig, ex: RrfpExperiment, level: Level) -> RuntimeConfig:
    return replace(base, jitter_cv=level.cv, straggler_prob=ex.straggler_prob if level.straggler else 0.0,
                   straggler_factor=ex.straggler_factor)


def policy_config(config: RuntimeConfig, hint: str | None) -> RuntimeConfig:
    """Strict (hint None, no cap) or ready-first under `hint`."""
    if hint is None:
        return replace(config, dispatch="strict", max_inflight=None)
    return replace(config, dispatch="ready_first", hint=hint)


def schedule_of(hint: str | None) -> str:
    return "zbh1" if hint == "bfw" else "1f1b"


def tp_scaled(s: Setup, ex: RrfpExperiment) -> Setup:
    """An emulated TP setup at its own step and micro-batches (`experiment.tp_emulate_step_s`,
    `tp_microbatches`; same partition): an agreement round among 8 processes on a few CPU cores
    is a large share of a short task, where RRFP's GPUs spend well under 1% of one; the longer
    step keeps it a few percent (figures in docs/runtime.md). Others unchanged."""
    if s.tp <= 1 or s.compute != "emulated":
        return s
    n, part = s.plans["1f1b"].table.n_devices, s.plans["1f1b"].partition
    plans = {sch: Plan(part, build_schedule(sch, n, ex.tp_microbatches), model=s.model.name) for sch in s.plans}
    return replace(s, plans=plans, config=replace(s.config, emulate_step_s=ex.tp_emulate_step_s))
