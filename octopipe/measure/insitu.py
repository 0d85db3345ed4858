"""In-situ calibration: cost inputs measured under the conditions the runtime executes in.

`cost=profiled` times each layer alone in one process. A pipeline run is different: 2-4 rank
processes share the CPU's cores (contention, caches, thread counts), every action goes through
the dispatcher, and a split backward (I then W, two autograd passes) costs more than one B pass.
So before predicting, run one calibration iteration of the real runtime on the same ranks,
backend and thread settings: a 1F1B table whose backward is B for even micro-batches and I then
W for odd ones (`calibration_table`), so one run observes F, B, I and W of every stage. Each
calibration stage's median observed time, divided by the profiled sum of its layers, scales
those layers (`fit`): per-layer times keep the profile's shape across layers and take the
level measured in the run, so schedules with other partitions (interleaved, V-shaped) get their
stage sums from the same layers. `Calibration.costs_for(table)` gives the simulator the costs of
the actions that table uses: a table that runs B gets I + W = the calibrated B. The first stage
has no input gradient, so the runtime's I there does nothing and its W does the whole backward;
the fit reads that stage's I + W as its split backward and `costs_for` moves the first stage's
I into its W. Shared cores are modelled in `octopipe.sim.core_sharing`.

The calibration run is never one of the runs being predicted. Schedules of `c` stages per rank
(interleaved, ZB-V) and plans with uneven stages (a tuned plan) are predicted from a calibration of
their own partition (`calibration_partition`: `calibration_table(n, m, chunks=c)` on that
partition), since the profile's shape misjudges how a stage's time splits between its layers.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from octopipe.cost.table import CostTable
from octopipe.errors import ConfigError
from octopipe.plan import Plan, uniform_partition
from octopipe.runtime.job import Job
from octopipe.runtime.launch import ExecutionResult, execute
from octopipe.schedule.action import Action, ActionKind
from octopipe.schedule.library import build_schedule
from octopipe.schedule.table import ScheduleTable
from octopipe.sim import simulate
from octopipe.sim.core_sharing import concurrency, fit_background, shared_run, stretch
from octopipe.sim.sim_result import SimResult

KINDS = ("F", "I", "W", "B")


def calibration_table(n: int, m: int, base: str = "1f1b", chunks: int = 1, split: int = 1) -> ScheduleTable:
    """The named `base` schedule on `n` ranks and `m` micro-batches (m >= 2), `chunks` stages per
    rank (chunks > 1: looped placement, base "interleaved"), with its backward split, I then W
    at once, for micro-batches of parity `split` (1: odd) and kept whole (B) for the others:
    every stage runs all four kinds, in the steady state other schedules run in. Launches that
    alternate `split` put B and I+W at every position of the row alike (the first backward of an
    iteration runs slower on a CPU)."""
    if m < 2:
        raise ConfigError(f"microbatches={m}: the calibration run needs at least 2 micro-batches "
                          "(one full backward and one split backward per stage)")
    if chunks > 1 and base in ("1f1b", "gpipe"):
        base = "interleaved"
    table = build_schedule(base, n, m, chunks if chunks > 1 else None).compute_only()
    if table.n_stages != n * chunks or any(a.kind in (ActionKind.I, ActionKind.W) for row in table.rows
                                           for a in row if a is not None):
        raise ConfigError(f"calibration base {base!r}: choose a schedule with {chunks} stage(s) per rank "
                          "and full backwards (gpipe, 1f1b, interleaved)")
    rows = []
    for row in table.rows:
        out = []
        for a in row:
            if a is not None and a.kind == ActionKind.B and a.microbatch % 2 == split % 2:
                out += [Action(a.stage, ActionKind.I, a.microbatch), Action(a.stage, ActionKind.W, a.microbatch)]
            elif a is not None:
                out.append(a)
        rows.append(tuple(out))
    name = f"calibration-{base}" + (f"-x{chunks}" if chunks > 1 else "") + ("" if split % 2 else "-even")
    return ScheduleTable(tuple(rows), table.placement, m, name)


def calibration_partition(plan) -> tuple[tuple[int, int], ...]:
    """The partition of the calibration run that predicts `plan`: its own when it has the same
    number of stages on each rank (the calibration table places them looped: `c` per rank, and
    ranks are alike, so it times the very stages the plan runs, whatever their sizes); otherwise
    the even split into one stage per rank, whose per-layer fit (the profile's shape within each
    calibrated stage) prices the plan's stages."""
    n, stages = plan.table.n_devices, plan.table.n_stages
    partition = tuple((int(lo), int(hi)) for lo, hi in plan.partition)
    if stages % n == 0:
        return partition
    return uniform_partition(partition[-1][1], n)


def calibration_name(table_name: str, partition: Sequence[tuple[int, int]]) -> str:
    """The calibration table's name, with the stage sizes when the split is not even."""
    partition = tuple((int(lo), int(hi)) for lo, hi in partition)
    if partition == uniform_partition(partition[-1][1], len(partition)):
        return table_name
    return f"{table_name}@{'+'.join(str(hi - lo) for lo, hi in partition)}"


def calibration_tables(n: int, m: int, partition: Sequence[tuple[int, int]]) -> tuple[ScheduleTable, ScheduleTable]:
    """The two calibration tables for `partition` on `n` ranks (`len(partition) / n` stages per
    rank), the backward split on odd and on even micro-batches, named by `calibration_name`."""
    if len(partition) % n:
        raise ValueError(f"a calibration partition needs the same stages on each of the {n} ranks; "
                         f"got {len(partition)} stages")
    tables = (calibration_table(n, m, chunks=len(partition) // n, split=split) for split in (1, 0))
    odd, even = (replace(t, name=calibration_name(t.name, partition)) for t in tables)
    return odd, even


def action_samples(events: Sequence[Sequence[dict]], iterations: Iterable[int],
                   world: int | None = None) -> tuple[np.ndarray, ...]:
    """(stage, kind index in KINDS, start, end, rank) arrays of every compute action in
    `iterations` of runtime traces (`ExecutionResult.events`: per rank, dicts with
    it/action/start/end). The traces of several launches of `world` ranks may be pooled, one
    launch after another (their clocks never overlap); trace j is then rank j mod `world`."""
    its = set(iterations)
    world = world or max(len(events), 1)
    rows = []
    for j, rank_events in enumerate(events):
        for e in rank_events:
            if "action" in e and e["it"] in its:
                a = Action.parse(e["action"])
                rows.append((a.stage, KINDS.index(a.kind.name), e["start"], e["end"], j % world))
    arr = np.array(rows, dtype=np.float64).reshape(-1, 5)
    return arr[:, 0].astype(int), arr[:, 1].astype(int), arr[:, 2], arr[:, 3], arr[:, 4].astype(int)


def stage_times(events: Sequence[Sequence[dict]], n_stages: int, iterations: Iterable[int],
                cores: float | None = None, background: float = 0.0,
                pinned: Sequence[int] | None = None) -> dict[int, dict[str, float]]:
    """Median seconds of each stage's F, I, W and B actions in `iterations` of runtime traces;
    with `cores`, each duration is first divided by its `cores.stretch` (the time it would take
    with a core to itself); with `pinned` (each rank's core), concurrency counts only the ranks
    on the action's core, each core a group of one. Kinds a stage never ran are absent."""
    stage, kind, start, end, rank = action_samples(events, iterations, len(pinned) if pinned else None)
    seconds = end - start
    if cores is not None and len(seconds):
        seconds = seconds / _stretch(start, end, rank, cores, background, pinned)
    out: dict[int, dict[str, float]] = {s: {} for s in range(n_stages)}
    for s in range(n_stages):
        for ki, k in enumerate(KINDS):
            sel = seconds[(stage == s) & (kind == ki)]
            if len(sel):
                out[s][k] = float(np.median(sel))
    return out


def _concurrency(start, end, rank, pinned: Sequence[int] | None) -> np.ndarray:
    return concurrency(start, end, None if pinned is None else np.asarray(pinned)[rank])


def _stretch(start, end, rank, cores: float, background: float, pinned: Sequence[int] | None) -> np.ndarray:
    return stretch(_concurrency(start, end, rank, pinned), 1.0 if pinned else cores, background)


def _spread(observed: float, shape: np.ndarray) -> np.ndarray:
    """`observed` seconds spread over layers in proportion to `shape` (evenly when it is all 0)."""
    total = float(shape.sum())
    if total > 0:
        return shape * (observed / total)
    return np.full(len(shape), observed / len(shape))


@dataclass(frozen=True)
class Calibration:
    """Per-layer F, I, W and B seconds fitted from a calibration run, and what was observed."""

    f: np.ndarray
    i: np.ndarray
    w: np.ndarray
    b: np.ndarray
    observed: dict[int, dict[str, float]] = field(default_factory=dict)
    partition: tuple[tuple[int, int], ...] = ()
    cores: float | None = None     # None: the times as observed; else per-core times (`octopipe.sim.core_sharing`)
    background: float = 0.0
    pinned: tuple[int, ...] | None = None   # each rank's core when ranks are pinned
    name: str = ""                  # the calibration table that was run (`calibrate` sets it)

    def predict(self, plan, base: CostTable, cluster, dispatch: str) -> float:
        """Simulated iteration time of `plan` from these costs (and, with `cores`, shared cores)."""
        return float(self.simulated(plan, base, cluster, dispatch).makespan)

    def simulated(self, plan, base: CostTable, cluster, dispatch: str) -> SimResult:
        """The simulated run `predict` times (its memory columns `base`'s)."""
        costs = self.costs_for(plan.table, base, plan.partition)
        if self.cores is None:
            return simulate(plan, costs, cluster, policy=dispatch, semantics="eager")
        pinned = None if self.pinned is None else [self.pinned[d % len(self.pinned)]
                                                   for d in range(plan.table.n_devices)]
        return shared_run(plan, costs, cluster, dispatch, self.cores, self.background, pinned=pinned)

    def costs_for(self, table: ScheduleTable, base: CostTable,
                  partition: Sequence[tuple[int, int]] | None = None) -> CostTable:
        """`base` with F, I, W replaced by the calibrated times of the actions `table` runs: a table
        of full backwards (B) gets I + W = B, split in the profile's I:W proportion; with a split
        backward, the first stage of `partition` does all its backward in W."""
        kinds = {a.kind for row in table.rows for a in row if a is not None}
        f, i, w = self.f, self.i.copy(), self.w.copy()
        if ActionKind.B in kinds and not ({ActionKind.I, ActionKind.W} & kinds):
            share = np.divide(base.i[:, 0], base.i[:, 0] + base.w[:, 0],
                              out=np.ones(len(self.b)), where=(base.i[:, 0] + base.w[:, 0]) > 0)
            i, w = self.b * share, self.b * (1 - share)
        elif partition:
            hi = partition[0][1]
            w[:hi] += i[:hi]
            i[:hi] = 0.0
        k = len(base.kinds)
        col = lambda v: np.repeat(np.asarray(v, dtype=np.float64)[:, None], k, axis=1)
        return CostTable(base.layer_names, base.kinds, col(f), col(i), col(w), base.act_bytes,
                         base.static_bytes, base.out_bytes, base.params, w_act_bytes=base.w_act_bytes,
                         flops=base.flops, tokens_per_microbatch=base.tokens_per_microbatch)

    def summary(self) -> dict:
        return {"name": self.name, "partition": [list(p) for p in self.partition], "cores": self.cores,
                "background_load": self.background, "pinned": self.pinned,
                "observed_stage_s": {str(s): d for s, d in self.observed.items()}}


def fit(observed: dict[int, dict[str, float]], partition: Sequence[tuple[int, int]],
        base: CostTable, column: int = 0, cores: float | None = None, background: float = 0.0,
        pinned: Sequence[int] | None = None) -> Calibration:
    """Per-layer times whose stage sums over `partition` equal the `observed` stage medians, each
    stage's layers keeping `base`'s (profiled) proportions. A stage missing B takes B = I + W;
    one missing I or W takes them from B in the profile's I:W proportion."""
    n = base.n_layers
    out = {k: np.zeros(n) for k in KINDS}
    for s, (lo, hi) in enumerate(partition):
        obs = observed.get(s, {})
        if "F" not in obs or not ("B" in obs or "I" in obs):
            raise ValueError(f"stage {s} has no observed F and backward in the calibration run")
        pf, pi, pw = (base.f[lo:hi, column], base.i[lo:hi, column], base.w[lo:hi, column])
        b_obs = obs.get("B", obs.get("I", 0.0) + obs.get("W", 0.0))
        out["F"][lo:hi] = _spread(obs["F"], pf)
        out["B"][lo:hi] = _spread(b_obs, pi + pw)
        if "I" in obs and lo == 0:      # no input gradient: I + W is the split backward
            split = _spread(obs["I"] + obs.get("W", 0.0), pi + pw)
            share = np.divide(pi, pi + pw, out=np.zeros(hi - lo), where=(pi + pw) > 0)
            out["I"][lo:hi], out["W"][lo:hi] = split * share, split * (1 - share)
        elif "I" in obs:
            out["I"][lo:hi] = _spread(obs["I"], pi)
            out["W"][lo:hi] = _spread(obs.get("W", 0.0), pw)
        else:
            both = float((pi + pw).sum())
            frac_i = float(pi.sum()) / both if both > 0 else 1.0
            out["I"][lo:hi] = _spread(b_obs * frac_i, pi)
            out["W"][lo:hi] = _spread(b_obs * (1 - frac_i), pw)
    return Calibration(out["F"], out["I"], out["W"], out["B"], observed,
                       tuple((int(a), int(b)) for a, b in partition), cores, background,
                       None if pinned is None else tuple(int(c) for c in pinned))


def fit_run(events: Sequence[Sequence[dict]], partition: Sequence[tuple[int, int]], base: CostTable,
            iterations: Iterable[int], cores: float | None = None,
            pinned: Sequence[int] | None = None) -> Calibration:
    """`fit` from calibration traces; with `cores`, the background load is fitted first from how
    the durations of each stage's actions vary with how many ranks computed beside them (with
    `pinned`, each rank's core: beside them on their core)."""
    its = list(iterations)
    background = 0.0
    if cores is not None:
        stage, kind, start, end, rank = action_samples(events, its, len(pinned) if pinned else None)
        keep = (end - start) > 1e-4          # the first stage's empty I says nothing
        k = _concurrency(start, end, rank, pinned)
        background = fit_background((stage * len(KINDS) + kind)[keep], k[keep], (end - start)[keep],
                                    1.0 if pinned else cores)
    observed = stage_times(events, len(partition), its, cores, background, pinned)
    return fit(observed, partition, base, cores=cores, background=background, pinned=pinned)


def calibrate(job: Job, partition: Sequence[tuple[int, int]] | None = None, *, rounds: int = 1,
              cores: float | None = None) -> tuple[Calibration, list[ExecutionResult]]:
    """Calibrate the costs that predict `job.plan` on its ranks and micro-batches: run
    `calibration_tables(n, m, partition)` (default: `calibration_partition(job.plan)`) with real
    compute, `rounds` separate launches of `job`'s warm-up + measured iterations, the split
    backward on odd micro-batches in even rounds and on even ones in odd rounds, with the job's
    ranks, links, dispatch and pinned cores (and no optimizer step). Fit per-layer costs
    (`fit_run`, from `job.costs`' profile, with `cores` shared when given) from the pooled
    measured iterations. Returns the calibration (named for its table) and each launch's result."""
    n, m = job.plan.table.n_devices, job.plan.table.n_microbatches
    partition = tuple(partition) if partition is not None else calibration_partition(job.plan)
    tables = calibration_tables(n, m, partition)
    config = replace(job.config, compute="real", lr=0.0)
    results = [execute(replace(job, plan=Plan(partition, tables[r % 2]), config=config, fault=None))
               for r in range(rounds)]
    events = [ev for r in results for ev in r.events]
    cal = fit_run(events, partition, job.costs, job.measured, cores, job.pinned)
    return replace(cal, name=tables[0].name), results
