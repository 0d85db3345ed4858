"""A training run's work, estimated and bounded before it starts: memory for the weights and
AdamW state against this machine's, profiling seconds against `train.max_profile_s`, and the
plan's predicted step time times the steps against `train.timeout_s`; each phase says its
estimate on a progress line first."""
from __future__ import annotations

import os
import time
from collections.abc import Callable

import numpy as np
import torch

from octopipe.cluster import Cluster
from octopipe.config.schema import Config
from octopipe.cost.collectives import all_gather_seconds, dp_sync_seconds, reduce_scatter_seconds
from octopipe.cost.table import CostTable
from octopipe.errors import ConfigError
from octopipe.plan import Plan
from octopipe.sim.core_sharing import makespan
from octopipe.sim.durations import with_grad_sync
from octopipe.sim.simulator import Simulator, simulate

STATE_BYTES = 16.0
"""fp32 weights, their gradients and AdamW's two moments, per parameter."""


def machine_memory() -> float:
    """Bytes of memory this machine has."""
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def cpu_flops() -> float:
    """FLOP/s of one rank's thread on this machine, from a short matmul (the profiler's speed)."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a = torch.randn(256, 256)
        a @ a
        t0 = time.perf_counter()
        for _ in range(8):
            a @ a
        return 8 * 2 * 256 ** 3 / max(time.perf_counter() - t0, 1e-9)
    finally:
        torch.set_num_threads(old)


def check_memory(name: str, params: int, memory: float | None = None) -> None:
    """Refuse a model whose weights, gradients and AdamW state alone exceed 80% of this machine's
    memory (what the ranks share)."""
    memory = machine_memory() if memory is None else memory
    need = STATE_BYTES * params
    if need > 0.8 * memory:
        raise ConfigError(f"train.model: {name} has {params / 1e9:.2f}B parameters, whose weights, gradients and "
                          f"AdamW state need about {need / 2**30:.0f} GiB; this machine has {memory / 2**30:.0f} GiB: "
                          f"train a smaller model (train.model=auto picks one that fits)")


def profile_seconds(params: int, tokens: int, passes: int, flops: float) -> float:
    """Seconds to time every block `passes` times (forward, split and full backward: about 6
    forward-equivalents each) at `flops`: 2 x params x tokens per forward."""
    return passes * 6.0 * 2.0 * params * tokens / max(flops, 1.0)


def check_profile(name: str, seconds: float, limit: float, progress: Callable[[str], None]) -> None:
    progress(f"profiling {name} on this machine (about {seconds:.0f} s)")
    if seconds > limit:
        raise ConfigError(f"train.max_profile_s={limit:g}: profiling {name} would take about {seconds:.0f} s on this "
                          f"machine; train a smaller model, or raise train.max_profile_s to go on")


def step_seconds(plan: Plan, costs: CostTable, cluster: Cluster) -> tuple[float, np.ndarray]:
    """The plan's predicted step time and per-rank peak memory on the profiled costs."""
    sim = simulate(plan, costs, cluster)
    return float(sim.makespan), np.asarray(sim.peak_memory, dtype=np.float64)


def sync_seconds(plan: Plan, costs: CostTable, cluster: Cluster, dp: int, zero: bool, tp: int = 1) -> np.ndarray:
    """[S] seconds of each stage's gradient sync over `dp` replicas on the machine's link: an
    all-reduce of its fp32 gradients (ZeRO-1: a reduce-scatter, then an all-gather of fp32
    weights), a TP rank's share of them."""
    out = np.zeros(len(plan.partition))
    for s, (lo, hi) in enumerate(plan.partition.ranges):
        params = float(costs.params[lo:hi].sum()) / tp
        link = cluster.intra_link
        out[s] = dp_sync_seconds(params, dp, link) if not zero else \
            reduce_scatter_seconds(4.0 * params, dp, link) + all_gather_seconds(4.0 * params, dp, link)
    return out


def predicted_step(plan: Plan, costs: CostTable, cluster: Cluster, layout, dispatch: str, cores: int) -> float:
    """The simulator's iteration time of a training run on this machine: the plan on the profiled
    costs, its ranks sharing `cores` (`sim.core_sharing`: each replica's TP ranks with its share
    of the cores), plus what each stage's gradient sync over the replicas leaves exposed after
    its last backward. `layout`: train.parallel.TrainLayout."""
    sim = Simulator(plan, costs, cluster)
    exposed = 0.0
    if layout.dp > 1:
        bare = float(sim.run(policy=dispatch).makespan)
        sync = sync_seconds(plan, costs, cluster, layout.dp, layout.zero, layout.tp)
        exposed = float(sim.run(with_grad_sync(sim.durations, sync), policy=dispatch).makespan) - bare
    return makespan(plan, costs, cluster, dispatch, cores / (layout.dp * layout.tp), 0.0) + exposed


def check_training(cfg: Config, plan: Plan, costs: CostTable, cluster: Cluster,
                   progress: Callable[[str], None]) -> float:
    """Say and bound the training's predicted time and memory; the predicted step seconds."""
    t = cfg.train
    step, peak = step_seconds(plan, costs, cluster)
    total = step * t.steps
    progress(f"training: about {step:.2f} s per step, {total:.0f} s for train.steps={t.steps} (predicted)")
    cap = cluster.kinds[0].memory_bytes
    worst = int(np.argmax(peak)) if len(peak) else 0
    if len(peak) and peak[worst] > cap:
        raise ConfigError(f"train.microbatches={t.microbatches}: plan {plan.table.name} would hold about "
                          f"{peak[worst] / 2**30:.1f} GiB on rank {worst}, above its {cap / 2**30:.1f} GiB share of "
                          f"this machine; lower train.microbatches or use a plan that keeps fewer in flight "
                          f"(train.plan=tuned)")
    if total > t.timeout_s:
        raise ConfigError(f"train.timeout_s={t.timeout_s:g}: the run would take about {total:.0f} s ({step:.2f} s per "
                          f"step x {t.steps} steps, predicted); lower train.steps or train.microbatches, or raise "
                          f"train.timeout_s")
    return step
