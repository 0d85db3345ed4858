"""`experiment=octopipe_authors`: the named baselines and the OctoPipe plan on the OctoPipe
authors' per-layer profiles, against the figures of the authors' tool (PipelineSimulator, their
graph-based simulator and bubble-aware tuner; the OctoPipe paper, arXiv 2509.23722).

For every profile preset (per-layer times measured by the OctoPipe authors), pipeline size,
micro-batch count and communication setting (free, as the authors' tool assumes, or a real
node's links), this driver builds the baselines, simulates them with `octopipe.sim`, and asks
the tuner for a plan through `run_octopipe_tuner`:

- `s1f1b`: 1F1B, one stage per device, uniform layers per stage (Megatron-style);
- `interleaved`: interleaved 1F1B, `chunks` stages per device, uniform layers per stage;
- `zbh1`: ZB-H1 (split backward), uniform layers per stage;
- `s1f1b_balanced`, `zbh1_balanced`: the same schedules on the partition that minimizes the
  slowest stage's F + B (exact min-max split; the Mist/AdaPipe-style balanced baseline);
- `octopipe`: the tuner's plan, re-simulated here like every baseline.

Figures per row: makespan, per-device bubble ratio (idle share of the makespan; busy time is the
device's compute from the cost table), efficiency against the lower bound (total work over the
devices: no bubble, no exposed transfer), tuner seconds, and speedups of the OctoPipe plan.

A separate check re-runs the authors' tool's own baseline conventions on the case the issue
quotes (Nemotron-Nano-v2-9B, 4 devices, 8 micro-batches, communication free) and compares
with its figures: see `authors_check`.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from octopipe.cluster import Cluster, DeviceKind, Link
from octopipe.config.cost import FileCost
from octopipe.config.experiment import AuthorsReference, NodeSpec, OctoPipeAuthorsExperiment
from octopipe.config.solver import SolverConfig
from octopipe.config.tuner import TunerConfig
from octopipe.cost.from_file import ProfileOptions, describe, label_parts, profile_cost_table, type_means
from octopipe.cost.profile_format import DEFAULT_LABEL_KINDS, load_preset, profile_presets
from octopipe.cost.stage_costs import StageCosts
from octopipe.cost.table import CostTable
from octopipe.errors import ConfigError
from octopipe.experiments import octopipe_authors_report as report
from octopipe.experiments.octopipe_authors_gate import gated_makespan
from octopipe.experiments.octopipe_authors_results import Case, CheckRow, Outcome, Results
from octopipe.model.layer import LayerKind
from octopipe.modes.inputs import Inputs
from octopipe.modes.mode_result import Result
from octopipe.plan import Partition, Plan, uniform_partition
from octopipe.progress import case_progress
from octopipe.schedule.library import build_schedule
from octopipe.schedule.table import ScheduleTable
from octopipe.sim import simulate
from octopipe.tune import TuneOptions, tune
from octopipe.tune.bounds import device_bound, lower_bound
from octopipe.tune.candidate import Problem
from octopipe.tune.splitting import row_splitter

# layer kinds a profile row may split by (rows carry no head or group counts)
ROW_SPLIT_KINDS = frozenset(k.value for k in (LayerKind.HEAD, LayerKind.MLP, LayerKind.MOE))
BASELINES = ("s1f1b", "interleaved", "zbh1", "s1f1b_balanced", "zbh1_balanced")


# ---------------------------------------------------------------------------------------------
# Pure pieces: partitions, bounds, busy time, clusters


def balanced_partition(weights: np.ndarray, n_stages: int) -> Partition:
    """Contiguous non-empty stages minimizing the largest stage sum of `weights` (the project's
    min-max DP, `Partition.balanced`; ties keep the latest cut, so earlier stages take the extra
    layers)."""
    return Partition.balanced(weights, n_stages)


def layer_work_s(costs: CostTable) -> np.ndarray:
    """F + B seconds per layer on the fastest device kind (a lower bound on any device)."""
    return (costs.f + costs.b).min(axis=1)


def lower_bound_s(costs: CostTable, n_devices: int, n_microbatches: int) -> float:
    """Total work divided over the devices: no bubble, no exposed transfer (the tuner's
    `lower_bound` on `n_devices` devices as fast as the fastest kind)."""
    work = np.repeat(layer_work_s(costs)[:, None], n_devices, axis=1)
    return lower_bound(work, n_microbatches)


def device_busy_s(costs: CostTable, plan: Plan, cluster: Cluster, n_microbatches: int) -> np.ndarray:
    """Compute seconds per device: its stages' F + B on its device kind, for every micro-batch."""
    n = plan.table.n_devices
    st = StageCosts.bind(costs, plan.partition, plan.placement, costs.columns_for(cluster, n))
    return st.per_device((st.f + st.i + st.w) * n_microbatches, n)


def node_cluster(node: NodeSpec, n_devices: int) -> Cluster:
    """`n_devices` GPUs of one node joined by the configured link (bandwidth per direction)."""
    kind = DeviceKind(node.device, float(node.peak_tflops) * 1e12, float(node.memory_gb) * 1e9,
                      float(node.memory_bandwidth_tbps) * 1e12)
    link = Link(node.link, float(node.link_bandwidth_gbps) * 1e9, float(node.link_latency_us) * 1e-6)
    return Cluster(node.name, (kind,), (0,) * n_devices, (0,) * n_devices, link, link)


def comm_free(cluster: Cluster) -> Cluster:
    """The same devices with transfers that take no time (the authors' tool's assumption)."""
    free = Link("free", math.inf, 0.0)
    return Cluster(f"{cluster.name}-comm-free", cluster.kinds, cluster.device_kind, cluster.node,
                   free, free)


# ---------------------------------------------------------------------------------------------
# Edges: schedule library, simulator, tuner


def schedule_table(name: str, n_devices: int, n_microbatches: int, chunks: int) -> ScheduleTable:
    return build_schedule(name, n_devices, n_microbatches, chunks)


def simulate_makespan_s(plan: Plan, costs: CostTable, cluster: Cluster) -> float:
    """Strict, eager-communication simulation of a plan: its makespan in seconds."""
    return float(simulate(plan, costs, cluster).makespan)


def split_shares(profile, costs: CostTable) -> tuple[list[bool], list[float]]:
    """Which profile rows may split and the share of each that cannot.

    A row may split when one of its label parts is an MLP, MoE or LM head (`ROW_SPLIT_KINDS`:
    their split dimensions are wide enough for any piece count); the other parts (attention,
    Mamba, embedding) stay whole with the first piece: a profile row does not say how many
    key/value heads or Mamba groups it has, so it cannot say how many pieces they allow. Shares
    come from the type means of F + B (`type_means`), so a GPT block with the head folded in
    (`T+H`) keeps mean(T) whole and splits the inferred head time.
    """
    kinds = {**DEFAULT_LABEL_KINDS, **dict(profile.label_kinds)}
    labels = profile.labels or tuple("" for _ in range(costs.n_layers))
    total = (costs.f + costs.i + costs.w)[:, 0]
    means = type_means(total, labels) if profile.labels else {}
    ok, fixed = [], []
    for lab in labels:
        parts = label_parts(lab) if lab else ()
        splittable = [p for p in parts if kinds.get(p) in ROW_SPLIT_KINDS]
        if not splittable or any(p not in means for p in parts) or sum(means[p] for p in parts) <= 0:
            ok.append(False)
            fixed.append(0.0)
            continue
        ok.append(True)
        fixed.append(sum(means[p] for p in parts if p not in splittable) / sum(means[p] for p in parts))
    return ok, fixed


def run_octopipe_tuner(costs: CostTable, cluster: Cluster, case: Case, tuner_cfg: TunerConfig,
                       solver_cfg: SolverConfig, seed: int, splittable: Sequence[bool] = (),
                       fixed: Sequence[float] | None = None) -> tuple[Plan, float, CostTable]:
    """The OctoPipe plan for one case, the tuner's seconds and the costs its layers index (the
    profile's rows, or them split into pieces).

    The experiment's only call into the tuner: `octopipe.tune.tune(costs, cluster, n_devices,
    n_microbatches, ...)`. `splittable[i]`: row i may be divided into pieces (rows with an MLP,
    MoE or head part; pieces were not measured: they share the splittable part of the row
    evenly, and the first keeps the `fixed[i]` share that cannot split, see `split_shares`).
    """
    splittable = list(splittable) or [False] * costs.n_layers
    result = tune(costs, cluster, case.devices, case.microbatches, TuneOptions(
        tuner_cfg, solver_cfg, seed=seed, model=case.profile,
        splitter=row_splitter(costs, splittable, fixed)))
    return result.plan, float(result.tuner_seconds), result.costs


# ---------------------------------------------------------------------------------------------
# Baselines and cases


def baseline_plans(costs: CostTable, n_devices: int, n_microbatches: int, chunks: int,
                   names: Sequence[str] = BASELINES,
                   table_of: Callable[..., ScheduleTable] = schedule_table) -> dict[str, Plan]:
    """The named baselines as plans (uniform or balanced partitions)."""
    n = costs.n_layers
    work = layer_work_s(costs)
    plans = {}
    for name in names:
        if name == "s1f1b":
            plans[name] = Plan(uniform_partition(n, n_devices), table_of("1f1b", n_devices, n_microbatches, 1))
        elif name == "interleaved":
            if n < n_devices * chunks:
                continue
            plans[name] = Plan(uniform_partition(n, n_devices * chunks),
                               table_of("interleaved", n_devices, n_microbatches, chunks))
        elif name == "zbh1":
            plans[name] = Plan(uniform_partition(n, n_devices), table_of("zbh1", n_devices, n_microbatches, 1))
        elif name == "s1f1b_balanced":
            plans[name] = Plan(balanced_partition(work, n_devices),
                               table_of("1f1b", n_devices, n_microbatches, 1))
        elif name == "zbh1_balanced":
            plans[name] = Plan(balanced_partition(work, n_devices),
                               table_of("zbh1", n_devices, n_microbatches, 1))
        else:
            raise ConfigError(f"experiment.baselines: unknown baseline {name!r}; valid: "
                              f"{', '.join(BASELINES)}")
    return plans


def evaluate_case(case: Case, name: str, plan: Plan, costs: CostTable, cluster: Cluster,
                  simulate: Callable[[Plan, CostTable, Cluster], float] = simulate_makespan_s,
                  tuner_s: float | None = None, device_bound: float | None = None) -> Outcome:
    """One schedule's outcome on a case: its simulated makespan, busy time and bounds."""
    m = case.microbatches
    return Outcome(case, name, simulate(plan, costs, cluster),
                   device_busy_s(costs, plan, cluster, m), lower_bound_s(costs, case.devices, m),
                   plan.partition, plan.placement, tuner_s, device_bound,
                   dict(plan.pieces))


def device_bound_s(costs: CostTable, cluster: Cluster, case: Case) -> float:
    """The tuner's whole-layer bound (fill/drain per device, transfers free, so valid for both
    comm settings)."""
    return device_bound(Problem.build(costs, comm_free(cluster), case.devices, case.microbatches))


def cases(exp: OctoPipeAuthorsExperiment) -> list[Case]:
    """Every profile x devices x micro-batches x comm setting of the experiment (the schema
    has checked each comm setting)."""
    return [Case(pr, p, m, c) for pr in exp.profiles for p in exp.devices
            for m in exp.microbatches for c in exp.comm]


# ---------------------------------------------------------------------------------------------
# The authors' tool's own baseline conventions


def authors_check(ref: AuthorsReference, cost_opts: ProfileOptions,
                  simulate: Callable[[Plan, CostTable, Cluster], float] = simulate_makespan_s,
                  table_of: Callable[..., ScheduleTable] = schedule_table) -> list[CheckRow]:
    """Re-run the authors' tool's baselines on the case the issue quotes.

    Its conventions (PipelineSimulator, `_init_placement_and_partition`): uniform stages
    (`layers / (devices · chunks)` each); interleaved with `chunks = layers // devices`, i.e. one
    layer per virtual stage; ZB-H halves B before rounding each half to its 0.1 ms tick.
    """
    prof = load_preset(ref.profile)
    p, m = ref.devices, ref.microbatches
    cluster = comm_free(node_cluster(_CHECK_NODE, p))
    kinds = tuple(k.name for k in cluster.kinds)
    costs = profile_cost_table(prof, cost_opts, kinds)
    split_backward_costs = profile_cost_table(
        prof, ProfileOptions(cost_opts.averaging, cost_opts.split, cost_opts.tick_ms, True), kinds)
    n = costs.n_layers
    v = n // p
    rows = [CheckRow("lower_bound", lower_bound_s(costs, p, m) * 1e3, float(ref.lower_bound_ms),
                     "total F + B over the devices, times rounded up to the tick")]
    s1 = Plan(uniform_partition(n, p), table_of("1f1b", p, m, 1))
    rows.append(CheckRow("s1f1b", simulate(s1, costs, cluster) * 1e3, float(ref.s1f1b_ms),
                         f"{n // p} layers per stage (the authors' makespan counts one more "
                         "tick)"))
    il = Plan(uniform_partition(n, p * v), table_of("interleaved", p, m, v))
    rows.append(CheckRow("interleaved", simulate(il, costs, cluster) * 1e3,
                         float(ref.interleaved_ms),
                         f"chunks = {v}, one layer per virtual stage; data dependencies only (the "
                         "authors' simulator also holds a steady-state F until the next device "
                         "has finished more B and its last op was a B)"))
    sc = StageCosts.bind(costs, il.partition, il.placement, [0] * p)
    rows.append(CheckRow("interleaved_gated",
                         gated_makespan(il.table, sc.f, sc.b, v) * 1e3,
                         float(ref.interleaved_ms),
                         "the same table replayed with the authors' simulator's gate "
                         "(octopipe.experiments.octopipe_authors_gate)"))
    zb = Plan(uniform_partition(n, p), table_of("zbh1", p, m, 1))
    rows.append(CheckRow("zbh1", simulate(zb, split_backward_costs, cluster) * 1e3, float(ref.zbh_ms),
                         "uniform stages, I and W each rounded up to the tick (one tick short, as "
                         "s1f1b)"))
    return rows


_CHECK_NODE = NodeSpec(name="check", device="H800", peak_tflops=989, memory_gb=80,
                       memory_bandwidth_tbps=3.35, link="free", link_bandwidth_gbps=1,
                       link_latency_us=0)


# ---------------------------------------------------------------------------------------------
# The mode-level driver


def run_cases(exp: OctoPipeAuthorsExperiment, cost_opts: ProfileOptions, tuner_cfg: TunerConfig,
              solver_cfg: SolverConfig, seed: int,
              progress: Callable[[str], None] = lambda s: None) -> Results:
    """Every case: the baselines, and the tuner's plan unless `exp.tuner` is off."""
    res = Results(tuner=exp.tuner)
    if not res.tuner:
        res.note = "experiment.tuner=false: baselines only, no OctoPipe plan and no speedups."
    chunks = exp.interleaved_chunks
    names = exp.baselines or BASELINES
    bounds: dict[tuple[str, int, int], float] = {}
    for case in cases(exp):
        progress(case.label)
        node = node_cluster(exp.node, case.devices)
        cluster = node if case.comm == "node" else comm_free(node)
        costs = profile_cost_table(load_preset(case.profile), cost_opts,
                                   tuple(k.name for k in cluster.kinds))
        for name, plan in baseline_plans(costs, case.devices, case.microbatches, chunks, names).items():
            res.outcomes.append(evaluate_case(case, name, plan, costs, cluster))
        if res.tuner:
            splittable, fixed = (split_shares(load_preset(case.profile), costs)
                                 if exp.split_layers else ([], None))
            plan, seconds, plan_costs = run_octopipe_tuner(costs, cluster, case, tuner_cfg, solver_cfg,
                                                           seed, splittable, fixed)
            key = (case.profile, case.devices, case.microbatches)
            if key not in bounds:
                bounds[key] = device_bound_s(costs, cluster, case)
            res.outcomes.append(evaluate_case(case, "octopipe", plan, plan_costs, cluster,
                                              tuner_s=seconds, device_bound=bounds[key]))
    return res


def run(inputs: Inputs) -> Result:
    """Run every case; the tables, plots, report.md and the summary as a Result."""
    cfg = inputs.config
    if not isinstance(cfg.cost, FileCost):
        raise ConfigError(f"experiment=octopipe_authors runs on profiles: cost={cfg.cost.source} "
                          f"given, cost=file expected")
    exp = cfg.experiment
    if not isinstance(exp, OctoPipeAuthorsExperiment):
        raise ConfigError(f"the octopipe_authors driver runs experiment=octopipe_authors, not "
                          f"experiment={getattr(exp, 'name', None)}")
    for k, name in enumerate(exp.profiles):
        if name not in profile_presets():
            raise ConfigError(f"experiment.profiles[{k}]={name}: not a shipped profile; valid: "
                              f"{', '.join(profile_presets())}")
    cost_opts = ProfileOptions.of(cfg.cost)
    with case_progress(len(cases(exp)), "octopipe_authors", on_case=None if inputs.interactive else
                       (lambda done, total, label: inputs.progress(f"case {label}"))) as step:
        res = run_cases(exp, cost_opts, cfg.tuner, cfg.solver, cfg.seed, progress=step)
    res.check = authors_check(exp.authors_reference, cost_opts)
    summary = report.summarize(res, exp)
    summary["cost"] = {"averaging": cost_opts.averaging, "split": cost_opts.split,
                       "tick_ms": cost_opts.tick_ms,
                       "profiles": [describe(load_preset(p), cost_opts) for p in exp.profiles]}
    items = (*(f"[dim]{line}[/dim]" for line in summary["cost"]["profiles"]),
             *report.report_items(res))
    return Result(summary, items, report.artifacts(res, exp, summary))
