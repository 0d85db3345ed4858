"""Run a plan on the runtime and put the measured iteration time beside the simulator's.

Real mode: the simulator gets per-layer costs calibrated in situ (`insitu.calibrate`: a separate
calibration run of the real runtime on the same ranks fits F, I, W, B per layer) and a cluster
whose link is the measured loopback; the prediction from the offline `cost=profiled` times (each
layer alone in one process) is kept beside it. A third figure, the replay, re-simulates with each
stage's median F, I, W, B times observed in the measured iterations themselves: it checks the
simulator's model of the schedule (dependencies, transfers, dispatch) apart from how well the cost
inputs predicted the compute. Emulated mode: modelled costs are scaled to sleepable durations (and
message sizes to loopback-friendly ones), and the simulator gets exactly the scaled table, so the
comparison isolates what the runtime adds: dispatch, threads, transfers (`runtime.emulation`).
`measure_fidelity` and `summarise` take the `Job` that is (or was) launched.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from octopipe.cluster import Cluster
from octopipe.cost.table import CostTable
from octopipe.measure.insitu import Calibration, stage_times
from octopipe.plan import Plan
from octopipe.runtime.emulation import emulation
from octopipe.runtime.job import Job
from octopipe.runtime.launch import ExecutionResult, execute
from octopipe.runtime.stage import max_rel_err, reference_run
from octopipe.sim import simulate


@dataclass
class Comparison:
    schedule: str
    measured_iteration_s: float             # median of the measured iterations of every launch
    simulated_iteration_s: float            # from the calibrated costs (real mode) or the cost table given
    simulated_replay_s: float | None        # from the per-stage times measured in the same iterations
    grad_check_max_rel_err: float | None
    losses: list[float]
    result: ExecutionResult = field(repr=False)
    simulated_profiled_s: float | None = None   # real mode with a calibration: from cost=profiled
    measured_samples_s: list[float] = field(default_factory=list)

    @property
    def fidelity_error(self) -> float:
        """|measured - simulated| / measured."""
        return abs(self.measured_iteration_s - self.simulated_iteration_s) / self.measured_iteration_s

    @property
    def fidelity_error_replay(self) -> float | None:
        if self.simulated_replay_s is None:
            return None
        return abs(self.measured_iteration_s - self.simulated_replay_s) / self.measured_iteration_s

    @property
    def fidelity_error_profiled(self) -> float | None:
        if self.simulated_profiled_s is None:
            return None
        return abs(self.measured_iteration_s - self.simulated_profiled_s) / self.measured_iteration_s

    def summary(self) -> dict:
        return {"schedule": self.schedule, "measured_iteration_s": self.measured_iteration_s,
                "simulated_iteration_s": self.simulated_iteration_s,
                "fidelity_error": self.fidelity_error,
                "simulated_profiled_iteration_s": self.simulated_profiled_s,
                "fidelity_error_profiled": self.fidelity_error_profiled,
                "simulated_replay_iteration_s": self.simulated_replay_s,
                "fidelity_error_replay": self.fidelity_error_replay,
                "grad_check_max_rel_err": self.grad_check_max_rel_err,
                "loss": self.losses[-1] if self.losses else None,
                "measured_iterations_s": self.measured_samples_s or self.result.iteration_s}


def replay_costs(events: list, plan: Plan, costs: CostTable, iterations: list[int]) -> CostTable:
    """A cost table whose stage sums are the median F, I, W each stage took in `iterations` of the
    runtime trace `events` (a stage that only ran B gets I = B, W = 0; where both ran, I and W are
    kept, the simulator's B being I + W); each stage's time sits on its first layer."""
    obs = stage_times(events, len(plan.partition), iterations)
    n = costs.n_layers
    arrays = {k: np.zeros((n, len(costs.kinds))) for k in "fiw"}
    for s, (lo, _) in enumerate(plan.partition):
        mean = obs.get(s, {})
        arrays["f"][lo, :] = mean.get("F", 0.0)
        if "I" in mean:
            arrays["i"][lo, :], arrays["w"][lo, :] = mean["I"], mean.get("W", 0.0)
        elif "B" in mean:
            arrays["i"][lo, :] = mean["B"]
    return CostTable(costs.layer_names, costs.kinds, arrays["f"], arrays["i"], arrays["w"],
                     costs.act_bytes, costs.static_bytes, costs.out_bytes, costs.params,
                     w_act_bytes=costs.w_act_bytes, flops=costs.flops,
                     tokens_per_microbatch=costs.tokens_per_microbatch)


def simulated(plan: Plan, costs: CostTable, cluster: Cluster, dispatch: str) -> float:
    """The simulated iteration time of `plan` (eager sends, the runtime's dispatch policy)."""
    return float(simulate(plan, costs, cluster, policy=dispatch, semantics="eager").makespan)


def summarise(job: Job, results: list[ExecutionResult], calibration: Calibration | None = None) -> Comparison:
    """The Comparison of `job` from one or more launches of it: measured = the median of every
    launch's measured iterations; simulated = from `calibration` when given (real mode), else
    from the job's costs; the profiled figure and the replay beside it; the gradient check
    (`runtime.grad_check`, real mode) against the single-process reference."""
    config, plan = job.config, job.plan
    first = results[0]
    samples = [t for r in results for t in r.iteration_s[config.warmup:]]
    sim_costs = emulation(job).costs if config.compute == "emulated" else job.costs
    sim_plan = replace(plan, table=first.table) if first.table is not None else plan
    err = None
    if config.compute == "real" and config.grad_check:
        ref = reference_run(job.model, plan.table.n_microbatches, job.seed, job.total_iterations, config.lr)
        err = max_rel_err(first.grads, ref.grads)
        err = max(err, max(abs(a - b) / abs(b) for a, b in zip(first.losses, ref.losses)))
    events = [ev for r in results for ev in r.events]
    replay = simulated(sim_plan, replay_costs(events, sim_plan, sim_costs, list(job.measured)), job.cluster,
                       config.dispatch)
    base = simulated(sim_plan, sim_costs, job.cluster, config.dispatch)
    if calibration is not None and config.compute == "real":
        predicted = calibration.predict(sim_plan, job.costs, job.cluster, config.dispatch)
        return Comparison(plan.table.name, float(np.median(samples)), predicted, replay, err,
                          first.losses, first, base, samples)
    return Comparison(plan.table.name, float(np.median(samples)), base, replay, err, first.losses,
                      first, None, samples)


def measure_fidelity(job: Job, calibration: Calibration | None = None) -> Comparison:
    """Execute `job` once and simulate it: from the in-situ `calibration` (real mode) when
    given, else from the job's costs."""
    return summarise(job, [execute(job)], calibration)
