"""`compute=emulated`: what each stage sleeps and sends, from modelled costs.

Modelled times are scaled so the mean stage F lasts `runtime.emulate_step_s` and message sizes so
the largest fits `runtime.max_message_bytes` (bigger loopback messages cost CPU time the emulation
does not model); the simulator gets exactly the scaled table, so a comparison isolates what the
runtime adds: dispatch, threads, transfers.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from octopipe.cost.stage_costs import StageCosts
from octopipe.cost.table import CostTable
from octopipe.errors import ScheduleError
from octopipe.runtime.job import Job


@dataclass(frozen=True)
class Emulation:
    """The scaled cost table, each stage's (f, i, w) sleep seconds and its message elements."""

    costs: CostTable = field(repr=False)
    durations: dict[int, tuple[float, float, float]]
    message_elems: dict[int, int]


def emulation(job: Job) -> Emulation:
    """`job.costs` scaled for `job.plan` as the module docstring says."""
    plan, costs = job.plan, job.costs
    if costs is None:
        raise ScheduleError("compute=emulated needs the modelled costs of the plan's layers; give the job costs")
    n = plan.table.n_devices
    columns = costs.columns_for(job.cluster, n) if job.cluster is not None else (0,) * n
    sc = StageCosts.bind(costs, plan.partition, plan.placement, columns)
    time_scale = job.config.emulate_step_s / max(float(np.mean(sc.f)), 1e-12)
    biggest = max(float(sc.out_bytes.max()), 1.0)
    byte_scale = min(1.0, job.config.max_message_bytes / biggest)
    scaled = CostTable(costs.layer_names, costs.kinds, costs.f * time_scale, costs.i * time_scale,
                       costs.w * time_scale, costs.act_bytes, costs.static_bytes,
                       np.maximum(np.round(costs.out_bytes * byte_scale / 4), 1) * 4, costs.params,
                       w_act_bytes=costs.w_act_bytes, flops=costs.flops,
                       tokens_per_microbatch=costs.tokens_per_microbatch)
    durations = {s: (sc.f[s] * time_scale, sc.i[s] * time_scale, sc.w[s] * time_scale)
                 for s in range(len(plan.partition))}
    elems = {s: int(scaled.out_bytes[hi - 1] // 4) for s, (lo, hi) in enumerate(plan.partition)}
    return Emulation(scaled, durations, elems)
