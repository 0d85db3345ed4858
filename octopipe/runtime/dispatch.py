"""The ready-first dispatcher's settings for a job, resolved once before any process starts.

`Arbitration` carries the hint, the buffer caps (`octopipe.sim.hints`: micro-batches live per
rank, by default each rank's own row's need, modelled activation bytes at admission, with each
(stage, kind)'s allocation and release)
and the jitter model (`octopipe.sim.variability`); `check_arbitration` refuses settings that
could deadlock or cannot be honoured, naming the field.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from octopipe.config.runtime import RuntimeConfig
from octopipe.cost.stage_costs import StageCosts
from octopipe.errors import ScheduleError
from octopipe.model.spec import ModelSpec
from octopipe.model.user_module import UserBlocks
from octopipe.runtime.hf_tensor_parallel import hf_tp_problem
from octopipe.runtime.job import Job
from octopipe.runtime.stage import SpecBlocks
from octopipe.runtime.tensor_parallel import check_grid
from octopipe.schedule.table import ScheduleTable
from octopipe.sim.durations import bind
from octopipe.sim.hints import HINTS, PLAN, cap_problem, row_caps
from octopipe.sim.program import compile_table
from octopipe.sim.variability import Variability, image_share


@dataclass(frozen=True)
class Arbitration:
    """What a rank's dispatcher needs beyond its row (see the module docstring)."""

    hint: str = "table"
    max_inflight: tuple[int, ...] | None = None      # per rank (`octopipe.sim.hints.row_caps`)
    memory_cap: float | None = None
    memory: dict = field(default_factory=dict)       # (stage, kind code) -> (alloc, free) bytes
    variability: Variability | None = None
    delay_base_s: float = 0.0                        # seconds of one mean stage F (send delays)

    def cap(self, rank: int) -> int | None:
        """The most micro-batches `rank` may hold live (None: no cap)."""
        return None if self.max_inflight is None else self.max_inflight[rank]


def plain(config: RuntimeConfig) -> RuntimeConfig:
    """`config` without hint, variability or caps beyond the default (each rank its own row's
    need): what calibration, reference and training runs use."""
    return replace(config, hint="table", max_inflight=PLAN, memory_cap=None, jitter_cv=0.0,
                   straggler_prob=0.0, slow_rank=-1, transfer_delay=0.0, seq_len_cv=0.0, images_max=0)


def variability_of(config: RuntimeConfig, job: Job) -> Variability:
    """The jitter model `config` asks for, bound to `job`'s stages (vision shares, floor)."""
    model = job.model.model if isinstance(job.model, SpecBlocks) else job.model
    return variability_for(config, model, job.costs, job.plan.partition, 1.0 if config.compute == "real" else 0.0)


def variability_for(config: RuntimeConfig, model, costs, partition, floor: float = 0.0) -> Variability:
    """The jitter model of `config`'s variability fields for a plan's `partition` of `model`
    (`costs` per layer give the vision shares; None or another layer count: equal layers); the
    one place the runtime, the robust tuner and experiment=robust build it."""
    share: tuple[float, ...] = ()
    if config.images_max > 1 and isinstance(model, ModelSpec):
        n = model.n_layers
        f = costs.f[:, 0] if costs is not None and costs.n_layers == n else np.ones(n)
        share = image_share(model, f, partition)
    return Variability(cv=config.jitter_cv, straggler_prob=config.straggler_prob,
                       straggler_factor=config.straggler_factor, slow_rank=config.slow_rank,
                       slow_rank_factor=config.slow_rank_factor, transfer_delay=config.transfer_delay,
                       seq_len_cv=config.seq_len_cv, images_max=config.images_max,
                       samples=model.micro_batch_size if model is not None else 1,
                       vision_share=share, floor=floor)


def _memory(job: Job, table: ScheduleTable) -> dict:
    if job.costs is None or job.cluster is None:
        raise ScheduleError("runtime.memory_cap needs the modelled costs and cluster of the job "
                            "(activation bytes per stage); give the job costs and a cluster")
    prog = compile_table(table)
    dur = bind(prog, job.plan.partition, job.costs, job.cluster)
    return {(int(s), int(k)): (float(a), float(f)) for s, k, a, f in
            zip(prog.c_stage, prog.c_kind, dur.alloc, dur.free)}


def _base_s(job: Job, emulated: dict) -> float:
    if emulated:
        return float(np.mean([v[0] for v in emulated.values()]))
    if job.costs is None:
        return 1e-3
    n = job.plan.table.n_devices
    columns = job.costs.columns_for(job.cluster, n) if job.cluster is not None else (0,) * n
    return float(np.mean(StageCosts.bind(job.costs, job.plan.partition, job.plan.placement, columns).f))


def check_arbitration(job: Job, table: ScheduleTable, transport: str) -> None:
    """Refuse a hint, cap or jitter setting of `job.config` the runtime cannot honour."""
    config = job.config
    if config.hint not in HINTS:
        raise ScheduleError(f"runtime.hint={config.hint!r} is unknown; use one of {', '.join(HINTS)}")
    if isinstance(config.max_inflight, int) and config.max_inflight < 1:
        raise ScheduleError(f"runtime.max_inflight={config.max_inflight} must be >= 1 (or null)")
    if config.memory_cap is not None and config.memory_cap <= 0:
        raise ScheduleError(f"runtime.memory_cap={config.memory_cap} must be > 0 (or null)")
    if config.slow_rank >= table.n_devices:
        raise ScheduleError(f"runtime.slow_rank={config.slow_rank} is not a rank of this "
                            f"{table.n_devices}-rank table; use -1..{table.n_devices - 1}")
    variability_of(config, job)
    if config.tp > 1:
        check_grid(job.model if config.compute == "real" and isinstance(job.model, ModelSpec) else None, config.tp,
                   table.n_devices)
        if config.compute == "real" and not isinstance(job.model, ModelSpec):
            problem = hf_tp_problem(job.model, config.tp) if isinstance(job.model, UserBlocks) else "not a model"
            if problem is not None:
                raise ScheduleError(f"runtime.tp={config.tp} splits a ModelSpec's layers or a model=hf decoder's; "
                                    f"{problem}: use runtime.tp=1")
        if config.compute == "real" and job.weights is not None:
            raise ScheduleError(f"runtime.tp={config.tp} runs synchronous training only; an asynchronous "
                                "weight policy needs runtime.tp=1")
        if any(len({pl[s] for pl in table.all_placements()}) > 1 for s in range(table.n_stages)):
            raise ScheduleError(f"runtime.tp={config.tp} needs a schedule without replicated (Chimera) "
                                "stages; choose another schedule or runtime.tp=1")
    gated = isinstance(config.max_inflight, int) or config.memory_cap is not None
    if gated and config.dispatch != "ready_first":
        raise ScheduleError("runtime.max_inflight / runtime.memory_cap bound ready_first dispatch; "
                            "set runtime.dispatch=ready_first (strict follows the row's own bound)")
    if not gated:
        return
    rows = [table.actions(d) for d in range(table.n_devices)]
    problem = cap_problem(rows, config.max_inflight, config.memory_cap is not None, transport == "ordered")
    if problem is not None:
        raise ScheduleError(f"runtime.{problem}")
    if config.memory_cap is not None:
        biggest = max(a for a, _ in _memory(job, table).values())
        if biggest > config.memory_cap:
            raise ScheduleError(f"runtime.memory_cap={config.memory_cap:g} is below one forward's "
                                f"activations ({biggest:g} bytes): no micro-batch could start; raise it")


def arbitration(job: Job, table: ScheduleTable, emulated: dict) -> Arbitration:
    """`job`'s arbitration for `table` (its compute-only table); `emulated`: stage -> (f, i, w)
    sleeps under compute=emulated, else empty."""
    config = job.config
    var = variability_of(config, job)
    rows = [table.actions(d) for d in range(table.n_devices)]
    caps = row_caps(rows, config.max_inflight) if config.dispatch == "ready_first" else None
    return Arbitration(config.hint, caps, config.memory_cap,
                       _memory(job, table) if config.memory_cap is not None else {},
                       var if var.active else None, _base_s(job, emulated))
