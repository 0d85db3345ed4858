"""What a rank's memory is simulated from under real compute: each layer's bytes as the runtime keeps them.

The analytic cost model prices activations for bf16 training kernels (flash attention, fused
scans); the runtime's CPU layers run fp32 with plain kernels and keep what autograd saves for
them, several times more (a Mamba scan's per-step states, the attention scores). So the simulator
gets the bytes the runtime's own meter (`octopipe.runtime.memory.SavedMeter`) counts:
`layer_bytes` runs one micro-batch through `RealCompute` with every layer a stage of its own and
reads the meter around each action (F: what autograd saves plus the output the stage keeps; I: the
intermediate gradients kept for W, on top of a graph that torch's split backward retains until W).
`memory_costs` turns them into a CostTable's memory columns for one plan: a stage also keeps its
input (received from another rank); a table with split backwards holds more after I than after F
until W (a negative free at I); the stage holding the embedding has no input gradient (its I keeps
nothing); parameters and gradients are the static bytes (mode=execute has no optimizer state).
`memory_figures` puts each rank's measured bytes beside the simulator's peak (docs/runtime.md).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch

from octopipe.cluster import Cluster
from octopipe.cost.table import CostTable
from octopipe.measure.insitu import Calibration
from octopipe.measure.measured_vs_simulated import replay_costs
from octopipe.plan import Plan
from octopipe.runtime.compute import RealCompute
from octopipe.runtime.job import Job
from octopipe.runtime.launch import ExecutionResult
from octopipe.runtime.memory import memory_comparison, tensor_bytes
from octopipe.runtime.stage import as_blocks
from octopipe.schedule.action import ActionKind
from octopipe.schedule.table import ScheduleTable
from octopipe.sim import simulate
from octopipe.sim.simulator import Policy, ReadyFirst

MEMORY_KEYS = ("memory_measured_bytes", "memory_simulated_bytes", "memory_max_rel_err", "memory_simulated_replay_bytes",
               "memory_simulated_executed_bytes", "memory_executed_max_rel_err")


@dataclass(frozen=True, eq=False)
class LayerBytes:
    """Per layer, for one micro-batch: `forward` bytes F keeps until the backward (saved tensors and
    the layer's output, each storage once, counted on the layer that first keeps it); `after_input`
    bytes kept from I until W (`forward` plus I's intermediate gradients); `output` bytes of the
    layer's output; `state` bytes of its parameters and their gradients."""

    forward: np.ndarray
    after_input: np.ndarray
    output: np.ndarray
    state: np.ndarray


def layer_bytes(model, seed: int = 0, device: torch.device | None = None, batches=None) -> LayerBytes:
    """Measure `LayerBytes` of `model` (a ModelSpec, or a block list with its `batches` source) on
    `device`: one micro-batch through every layer's F, then every I in reverse, then every W, the
    meter read around each."""
    device = device or torch.device("cpu")
    n = as_blocks(model).n_blocks
    compute = RealCompute(model, tuple((j, j + 1) for j in range(n)), tuple((0, j) for j in range(n)),
                          1, seed, device)
    compute.batches = batches or compute.batches
    compute.start_iteration(0)
    meter = compute.meter
    fwd, inp, out = np.zeros(n), np.zeros(n), np.zeros(n)
    x = None
    for j in range(n):
        before = meter.live
        x = compute.forward(j, 0, x)
        fwd[j], out[j] = meter.live - before, x.numel() * x.element_size()
    grad = None
    for j in reversed(range(n)):
        before = meter.live
        grad = compute.backward_input(j, 0, grad)
        inp[j] = meter.live - before
    for j in reversed(range(n)):
        compute.backward_weight(j, 0)
    params = [list(compute.copies[(0, j)].parameters()) for j in range(n)]
    state = np.array([tensor_bytes([*ps, *(p.grad for p in ps)]) for ps in params], dtype=np.float64)
    return LayerBytes(fwd, fwd + inp, out, state)


def memory_costs(costs: CostTable, measured: LayerBytes, table: ScheduleTable,
                 partition: Sequence[tuple[int, int]]) -> CostTable:
    """`costs` with the memory columns of `measured` for `table` on `partition` (see the module):
    act_bytes what F keeps, w_act_bytes what a micro-batch holds after I (more: I's free is
    negative, memory grows when it ends, and the simulator's peak, taken as each action starts,
    sees it at the row's next action), static_bytes the parameters and gradients."""
    kinds = {a.kind for row in table.rows for a in row if a is not None}
    split = bool({ActionKind.I, ActionKind.W} & kinds)
    fwd, after = measured.forward.copy(), measured.after_input.copy()
    for s, (lo, hi) in enumerate(partition):
        if lo == 0:
            after[lo:hi] = fwd[lo:hi]           # no input gradient: I keeps nothing
        elif table.placement[s] != table.placement[s - 1]:
            fwd[lo] += measured.output[lo - 1]  # the input received from another rank
            after[lo] += measured.output[lo - 1]
    return replace(costs, act_bytes=fwd, w_act_bytes=after if split else np.zeros_like(fwd),
                   static_bytes=measured.state.copy(), _prefix={})


def measured_bytes(events: Sequence[Sequence[dict]], iterations: Sequence[int]) -> list[float]:
    """Per rank, the median over `iterations` of its iteration's peak of saved activations and
    kept stage tensors plus its parameter and gradient bytes (the workers' per-iteration events)."""
    its = set(iterations)
    return [float(np.median([e["saved_peak_bytes"] + e["state_bytes"] for e in rank
                             if e.get("it") in its and "saved_peak_bytes" in e]))
            for rank in events]


def executed_table(table: ScheduleTable, events: Sequence[Sequence[dict]], it: int) -> ScheduleTable | None:
    """`table` as the ranks ran iteration `it`: each row's actions in the order they started
    (ready-first dispatch may reorder a row); None when a row's actions are not all recorded."""
    rows = []
    for d, row in enumerate(table.rows):
        acts = [a for a in row if a is not None]
        start = {e["action"]: e["start"] for e in events[d] if e.get("it") == it and "action" in e} \
            if d < len(events) else {}
        if any(str(a) not in start for a in acts):
            return None
        rows.append(tuple(sorted(acts, key=lambda a: start[str(a)])))
    return replace(table, rows=tuple(rows))


def executed_bytes(plan: Plan, costs: CostTable, cluster: Cluster, events: Sequence[Sequence[dict]],
                   iterations: Sequence[int]) -> list[float] | None:
    """Per device, the median over `iterations` of the simulator's peak for the order the ranks
    ran each (`executed_table`, strict: a row's peak depends on its order alone), or None when an
    iteration's order is not recorded. Beside the measured bytes it checks the memory model (what
    each action keeps and frees) apart from the dispatch's timing."""
    peaks = []
    for it in iterations:
        table = executed_table(plan.table, events, it)
        if table is None:
            return None
        peaks.append(simulate(replace(plan, table=table), costs, cluster, semantics="eager").peak_memory)
    return [float(x) for x in np.median(np.array(peaks), axis=0)]


def simulated_bytes(plan: Plan, costs: CostTable, cluster: Cluster, dispatch: Policy,
                    calibration: Calibration | None) -> list[float]:
    """The simulator's peak bytes per device for `plan` on `costs` (with `memory_costs`' columns),
    timed as the iteration is predicted: from `calibration` where there is one, else `costs`."""
    if calibration is None:
        res = simulate(plan, costs, cluster, policy=dispatch, semantics="eager")
    else:
        res = calibration.simulated(plan, costs, cluster, dispatch)
    return [float(x) for x in res.peak_memory]


def rank_layer_bytes(job: Job, model, device: str) -> LayerBytes | None:
    """`layer_bytes` of `model` on the ranks' `device` where they run whole layers without
    recomputation (real compute, no tensor parallelism); else None."""
    if job.config.compute != "real" or job.config.tp > 1 or job.recompute:
        return None
    return layer_bytes(model, job.seed, torch.device(device))


def _policy(job: Job) -> Policy:
    """The dispatch the ranks ran: strict, or ready-first with their hint and cap on live
    micro-batches."""
    config = job.config
    return "strict" if config.dispatch == "strict" else ReadyFirst(config.hint, config.max_inflight)


def memory_figures(job: Job, res: ExecutionResult, calibration: Calibration | None,
                   measured: LayerBytes | None) -> dict:
    """summary.json's memory figures of one launch of `job`: each rank's measured bytes
    (`measured_bytes` of the metered iterations: the warm-up ones, else all) beside the
    simulator's peak for the plan as it ran (its dispatch and cap), priced with the layers'
    `measured` bytes and timed as the iteration is predicted (`simulated_bytes`), and timed by
    the stage times of the measured iterations themselves (the replay), and on the order the ranks
    ran the metered iterations (`executed_bytes`); null without `measured`."""
    if measured is None:
        return dict.fromkeys(MEMORY_KEYS)
    plan = replace(job.plan, table=res.table) if res.table is not None else job.plan
    costs = memory_costs(job.costs, measured, plan.table, plan.partition)
    its = list(job.measured)
    policy = _policy(job)
    replay = simulate(plan, replay_costs(res.events, plan, costs, its), job.cluster, policy=policy, semantics="eager")
    ranks = measured_bytes(res.events, job.metered)
    executed = executed_bytes(plan, costs, job.cluster, res.events, list(job.metered))
    return {**memory_comparison(ranks, simulated_bytes(plan, costs, job.cluster, policy, calibration)),
            "memory_simulated_replay_bytes": [float(x) for x in replay.peak_memory],
            "memory_simulated_executed_bytes": executed,
            "memory_executed_max_rel_err": None if executed is None else
            memory_comparison(ranks, executed)["memory_max_rel_err"]}
