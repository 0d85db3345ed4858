"""Run a plan on the runtime and put the measured iteration time beside the simulator's.

Real mode: the simulator gets per-layer costs calibrated in situ (`insitu.calibrate`: a separate
calibration run of the real runtime on the same ranks fits F, I, W, B per layer) and a cluster
whose link is the measured loopback; the prediction from the offline `cost=profiled` times (each
layer alone in one process) is kept beside it. A third figure, the replay, re-simulates with each
stage's median F, I, W, B times observed in the measured iterations themselves: it checks the
simulator's model of the schedule (dependencies, transfers, dispatch) apart from how well the cost
inputs predicted the compute. Emulated mode: modelled costs are scaled to sleepable durations (and
message sizes to loopback-friendly ones), and the simulator gets exactly the scaled table, so the
comparison isolates what the runtime adds: dispatch, threads, transfers.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from octopipe.cluster import Cluster
from octopipe.cost.table import CostTable
from octopipe.model.spec import ModelSpec
from octopipe.plan import Plan
from octopipe.runtime.launch import ExecutionResult, execute
from octopipe.runtime.stage import max_rel_err, reference_run


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


def kind_per_stage(plan: Plan, costs: CostTable, cluster: Cluster) -> list[int]:
    """CostTable column of the device holding each stage (by device-kind name)."""
    cols = []
    for d in plan.placement:
        name = cluster.kind_of(d).name
        cols.append(costs.kinds.index(name) if name in costs.kinds else 0)
    return cols


def emulation(plan: Plan, costs: CostTable, cluster: Cluster, step_s: float,
              max_message_bytes: float) -> tuple[CostTable, dict, dict]:
    """The scaled cost table, per-stage (f, i, w) sleeps and per-stage message elements."""
    kinds = kind_per_stage(plan, costs, cluster)
    sc = costs.stage_costs(plan.partition, kinds)
    time_scale = step_s / max(float(np.mean(sc["f"])), 1e-12)
    biggest = max(float(sc["out_bytes"].max()), 1.0)
    byte_scale = min(1.0, max_message_bytes / biggest)
    scaled = CostTable(costs.layer_names, costs.kinds, costs.f * time_scale, costs.i * time_scale,
                       costs.w * time_scale, costs.act_bytes, costs.static_bytes,
                       np.maximum(np.round(costs.out_bytes * byte_scale / 4), 1) * 4, costs.params,
                       w_act_bytes=costs.w_act_bytes, flops=costs.flops,
                       tokens_per_microbatch=costs.tokens_per_microbatch)
    durations = {s: (sc["f"][s] * time_scale, sc["i"][s] * time_scale, sc["w"][s] * time_scale)
                 for s in range(len(plan.partition))}
    elems = {s: int(scaled.out_bytes[hi - 1] // 4) for s, (lo, hi) in enumerate(plan.partition)}
    return scaled, durations, elems


def replay_costs(events: list, plan: Plan, costs: CostTable, iterations: list[int]) -> CostTable:
    """A cost table whose stage sums are the median F, I, W each stage took in `iterations` of the
    runtime trace `events` (a stage that only ran B gets I = B, W = 0; where both ran, I and W are
    kept, the simulator's B being I + W); each stage's time sits on its first layer."""
    from octopipe.runtime.insitu import stage_times
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
    from octopipe.sim import simulate
    return float(simulate(plan, costs, cluster, policy=dispatch, semantics="eager").makespan)


def launch(model: ModelSpec | None, plan: Plan, costs: CostTable, sim_cluster: Cluster, *,
           compute: str = "real", dispatch: str = "ready_first", iterations: int = 3, warmup: int = 1,
           seed: int = 0, lr: float = 0.0, step_s: float = 0.01, max_message_bytes: float = 262144,
           timeout_s: float = 300, stall_s: float = 30, cpus: tuple[int, ...] | None = None,
           backend: str = "gloo", transport: str = "auto", device: str = "auto") -> ExecutionResult:
    """One launch of `plan` (`warmup` + `iterations` iterations); emulated mode sleeps `costs`
    scaled as `emulation` scales them; `cpus[rank]` pins each rank to a core."""
    kw = dict(dispatch=dispatch, compute=compute, iterations=warmup + iterations, seed=seed, lr=lr,
              timeout_s=timeout_s, stall_s=stall_s, cpus=cpus, backend=backend, transport=transport,
              device=device)
    if compute == "emulated":
        _, durations, elems = emulation(plan, costs, sim_cluster, step_s, max_message_bytes)
        kw.update(durations=durations, message_elems=elems)
    return execute(model if compute == "real" else None, plan.partition, plan.table, **kw)


def summarise(model: ModelSpec | None, plan: Plan, results: list[ExecutionResult], costs: CostTable,
              sim_cluster: Cluster, *, calibration=None, compute: str = "real",
              dispatch: str = "ready_first", iterations: int = 3, warmup: int = 1, seed: int = 0,
              lr: float = 0.0, grad_check: bool = True, step_s: float = 0.01,
              max_message_bytes: float = 262144) -> Comparison:
    """The Comparison of one plan from one or more launches of it: measured = the median of every
    launch's measured iterations; simulated = from `calibration` when given (real mode), else
    from `costs`; the profiled figure and the replay beside it."""
    first = results[0]
    measured_its = list(range(warmup, warmup + iterations))
    samples = [t for r in results for t in r.iteration_s[warmup:]]
    sim_costs = costs
    if compute == "emulated":
        sim_costs = emulation(plan, costs, sim_cluster, step_s, max_message_bytes)[0]
    sim_plan = replace(plan, table=first.table) if first.table is not None else plan
    err = None
    if compute == "real" and grad_check:
        ref = reference_run(model, plan.table.n_microbatches, seed, warmup + iterations, lr)
        err = max_rel_err(first.grads, ref.grads)
        err = max(err, max(abs(a - b) / abs(b) for a, b in zip(first.losses, ref.losses)))
    events = [ev for r in results for ev in r.events]
    replay = simulated(sim_plan, replay_costs(events, sim_plan, sim_costs, measured_its), sim_cluster, dispatch)
    base = simulated(sim_plan, sim_costs, sim_cluster, dispatch)
    if calibration is not None and compute == "real":
        predicted = calibration.predict(sim_plan, costs, sim_cluster, dispatch)
        return Comparison(plan.table.name, float(np.median(samples)), predicted, replay, err,
                          first.losses, first, base, samples)
    return Comparison(plan.table.name, float(np.median(samples)), base, replay, err, first.losses,
                      first, None, samples)


def compare(model: ModelSpec | None, plan: Plan, costs: CostTable, sim_cluster: Cluster, *,
            calibration=None, compute: str = "real", dispatch: str = "ready_first", iterations: int = 3,
            warmup: int = 1, seed: int = 0, lr: float = 0.0, grad_check: bool = True,
            step_s: float = 0.01, max_message_bytes: float = 262144, timeout_s: float = 300,
            stall_s: float = 30) -> Comparison:
    """Execute `plan` once (`warmup` + `iterations` iterations) and simulate it: from the
    in-situ `calibration` (an `insitu.Calibration`, real mode) when given, else from `costs`."""
    result = launch(model, plan, costs, sim_cluster, compute=compute, dispatch=dispatch,
                    iterations=iterations, warmup=warmup, seed=seed, lr=lr, step_s=step_s,
                    max_message_bytes=max_message_bytes, timeout_s=timeout_s, stall_s=stall_s)
    return summarise(model, plan, [result], costs, sim_cluster, calibration=calibration, compute=compute,
                     dispatch=dispatch, iterations=iterations, warmup=warmup, seed=seed, lr=lr,
                     grad_check=grad_check, step_s=step_s, max_message_bytes=max_message_bytes)
