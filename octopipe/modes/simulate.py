"""`mode=simulate`: one schedule through the communication-aware simulator.

`schedule=<name>` (with `pp`, `chunks`, `microbatches`) or `schedule.file=PATH` (a plan JSON,
whose partition is used, or a torch CSV); layers are split evenly over the stages otherwise. A
stack's own configuration (`schedule.megatron_layout`, `schedule.hybrid_pattern`,
`schedule.torchtitan_fqns` with a schedule, `schedule.deepspeed_parts`) is simulated as that stack
runs it, and the summary's `comparison` says how much faster OctoPipe's plan for that stack, and
its own free plan, would be.
`sim.*` chooses the policy, communication semantics, hint, limits and jitter; with
`sim.monte_carlo=N` the summary adds the makespan's mean, spread and percentiles over N seeded
jittered runs. With cost.tp > 1 under ready_first, RRFP's TP agreement is charged before each
task with TP collectives (`sim.tp_agreement_s`, octopipe/sim/agreement.py). Artifacts: trace.json (Chrome/Perfetto),
timeline.png, schedule.csv (torch
dialect), plan.json, and under ready_first executed_schedule.csv: the order each device
actually ran, a table that strict order reproduces.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from rich.table import Table

from octopipe.asynchronous import simulated as asim
from octopipe.config.schema import Config
from octopipe.config.sim import SimConfig
from octopipe.errors import ConfigError
from octopipe.io import regular_file
from octopipe.modes.artifacts import compact_json_artifact, plan_artifacts, table_artifact
from octopipe.modes.inputs import Inputs
from octopipe.modes.mode_result import Artifact, Result
from octopipe.modes.targeting import import_comparison, imported_plan
from octopipe.plan import Plan, uniform_partition
from octopipe.plan_io import load_plan, load_schedule_file
from octopipe.schedule.library import SCHEDULES, build_schedule
from octopipe.schedule.render import grid_text
from octopipe.schedule.table import ScheduleTable
from octopipe.sim import Jitter, ReadyFirst, Simulator
from octopipe.sim.agreement import tp_agreement
from octopipe.sim.sim_result import CAUSES
from octopipe.sim.trace import sim_timeline_png, sim_trace


def jitter_of(sim: SimConfig, cv: float | None = None) -> Jitter:
    """The variability `sim.*` asks for (`cv` overrides sim.jitter_cv)."""
    return Jitter(cv=sim.jitter_cv if cv is None else cv, slow_prob=sim.slow_prob,
                  slow_factor=sim.slow_factor)


def run_options(sim: SimConfig) -> dict:
    """Keyword arguments of `Simulator.run` from `sim.*`."""
    policy = (ReadyFirst(sim.hint, sim.max_inflight, sim.memory_limit)
              if sim.policy == "ready_first" else sim.policy)
    return {"policy": policy, "semantics": sim.semantics, "check_memory": sim.check_memory}


def check_file_work(cfg: Config, path: Path) -> None:
    """Refuse, before reading it, a schedule.file whose size implies more than `sim.max_actions`
    actions (reading and checking a table grow with it): a CSV cell takes about 6 bytes
    (`12F34,`), a plan JSON's about 10."""
    size = regular_file(path, "schedule.file")
    actions = size // (10 if path.suffix.lower() == ".json" else 6)
    if actions > cfg.sim.max_actions:
        raise ConfigError(f"schedule.file={str(path)!r}: {size / 1e6:.2f} MB, about {actions:,} actions, above "
                          f"sim.max_actions={cfg.sim.max_actions:,}; reading and checking it grow with it: give a "
                          f"smaller table or set sim.max_actions={actions} to go on")


def plan_file(cfg: Config) -> Plan | None:
    """The plan JSON `schedule.file` names (None for a named schedule or a CSV)."""
    path = cfg.schedule.file
    if not path or Path(path).suffix.lower() != ".json":
        return None
    check_file_work(cfg, Path(path))
    return load_plan(Path(path))


def plan_file_pieces(cfg: Config) -> dict[int, int]:
    """The layers a plan JSON in `schedule.file` splits ({} for whole layers or a CSV)."""
    plan = plan_file(cfg)
    return {} if plan is None else dict(plan.pieces)


def schedule_from_cfg(cfg: Config, n_layers: int) -> tuple[ScheduleTable, tuple[tuple[int, int], ...]]:
    """The table `schedule.name`/`schedule.file` asks for, and its partition."""
    path = cfg.schedule.file
    if path:
        p = Path(path)
        check_file_work(cfg, p)
        if p.suffix.lower() == ".json":
            plan = load_plan(p)
            if plan.n_layers != n_layers:
                raise ConfigError(f"schedule.file {str(p)!r} partitions {plan.n_layers} layers but "
                                  f"the model has {n_layers}; use the plan's model")
            return plan.table, plan.partition
        table = load_schedule_file(p)
        check_work(cfg, sum(len(r) for r in table.compute_only().rows), f"{table.name}'s table")
    else:
        if not cfg.schedule.name:
            raise ConfigError("schedule: give schedule=<name> or schedule.file=PATH")
        if cfg.pp is None:
            raise ConfigError("pp and microbatches must be set for a named schedule")
        check_work(cfg, *estimated_actions(cfg, cfg.schedule.name))
        table = build_schedule(cfg.schedule.name, cfg.pp, cfg.microbatches, cfg.chunks)
    return table, uniform_partition(n_layers, table.n_stages)


def estimated_actions(cfg: Config, name: str) -> tuple[int, str]:
    """The compute actions the named schedule's table will hold at `pp`, `chunks`, `microbatches`
    (before building it), and how that count was made."""
    info = SCHEDULES.get(name)
    chunks = cfg.chunks or (info.default_chunks if info else 2)
    kinds = 3 if info is None or info.split_backward else 2
    stages = (cfg.pp or 1) * chunks
    return stages * cfg.microbatches * kinds, f"{stages} stages x {cfg.microbatches} micro-batches x {kinds} kinds"


def check_work(cfg: Config, actions: int, how: str) -> None:
    """Refuse a simulation above `sim.max_actions` with the estimate and the override."""
    if actions > cfg.sim.max_actions:
        raise ConfigError(f"this simulation would run about {actions:,} compute actions ({how}), above "
                          f"sim.max_actions={cfg.sim.max_actions:,}; time and memory grow with it: lower "
                          f"microbatches or pp, or set sim.max_actions={actions} to go on")


def check_devices(cfg: Config, table: ScheduleTable) -> None:
    """`pp` set to another rank count than `schedule.file`'s table is refused, not ignored (the
    default `pp` yields to the file)."""
    default = next(f.default for f in dataclasses.fields(Config) if f.name == "pp")
    if cfg.schedule.file and cfg.pp not in (None, default) and cfg.pp != table.n_devices:
        raise ConfigError(f"pp={cfg.pp} but schedule.file {cfg.schedule.file!r} has {table.n_devices} "
                          f"ranks; drop pp or set pp={table.n_devices}")


def summary_table(title: str, figures: dict) -> Table:
    t = Table(title=title, show_header=False)
    for k, v in figures.items():
        if isinstance(v, float):
            v = f"{v:.6g}"
        elif isinstance(v, (list, dict)):
            continue
        t.add_row(k, str(v))
    return t


def run(inputs: Inputs) -> Result:
    cfg = inputs.config
    model, cluster = inputs.costed_model, inputs.cluster   # cost=file: the profile's model
    costs = inputs.piece_costs(plan_file_pieces(cfg))   # a split plan prices its pieces
    imported = cfg.schedule.imported()
    if imported:
        given = imported_plan(inputs)
        table, partition = given.table, given.partition
    else:
        table, partition = schedule_from_cfg(cfg, costs.n_layers)
    check_devices(cfg, table)
    n_actions = sum(len(r) for r in table.compute_only().rows)
    if n_actions > 10_000:
        inputs.progress(f"simulating {n_actions:,} compute actions of {table.name} (large: this takes a while)")
    if table.n_devices > cluster.n_devices:
        raise ConfigError(f"the schedule uses {table.n_devices} devices but the cluster has "
                          f"{cluster.n_devices}; set pp={cluster.n_devices} or pick a larger cluster")
    plan = Plan(partition, table, model.name, cluster.name, {"source": "mode=simulate"})
    sim = Simulator(plan, costs, cluster)
    tp = getattr(cfg.cost, "tp", 1)
    if tp > 1 and cfg.sim.policy == "ready_first" and costs.n_layers == model.n_layers:
        link = cluster.inter_link if getattr(cfg.cost, "tp_link", "intra") == "inter" else cluster.intra_link
        sim.durations = tp_agreement(sim.program, sim.durations, model, partition, tp, link, cfg.sim.tp_agreement_s)
    opts = run_options(cfg.sim)
    jitter = jitter_of(cfg.sim)
    res = sim.run(jitter=jitter, seed=cfg.seed, **opts)
    report: list = [grid_text(table)]
    summary = {"schedule": table.name, "model": model.name, "cluster": cluster.name,
               "n_devices": table.n_devices, "n_stages": table.n_stages,
               "microbatches": table.n_microbatches, "partition": [list(p) for p in partition],
               **res.summary()}
    if asim.is_async(table):   # asynchronous: weight versions, their bytes, throughput vs 1F1B
        summary["asynchronous"] = {
            **asim.async_summary(table, res, asim.stage_param_bytes(costs, partition)),
            **asim.throughput_vs_1f1b(table, asim.simulator_for(costs, cluster, partition),
                                      {"seed": cfg.seed, **opts})}
    if cfg.sim.monte_carlo:
        if not jitter.active:
            raise ConfigError("sim.monte_carlo needs variability: set sim.jitter_cv > 0 or sim.slow_prob > 0")
        mc = sim.monte_carlo(cfg.sim.monte_carlo, jitter, seed=cfg.seed,
                             **{k: v for k, v in opts.items() if k != "check_memory"})
        summary["monte_carlo"] = mc.summary()
    if imported:
        summary["comparison"], lines = import_comparison(inputs, float(res.makespan), imported)
        report.extend(lines)
    report.append(summary_table(f"{table.name}: {cfg.sim.policy} / {cfg.sim.semantics}", summary))
    causes = Table(title="bubble causes per device (s)")
    causes.add_column("device")
    for c in CAUSES:
        causes.add_column(c)
    for d, row in enumerate(res.bubble_causes):
        causes.add_row(str(d), *(f"{x:.4g}" for x in row))
    report.append(causes)
    if res.over_capacity:
        report.append(f"[red]over capacity: devices {list(res.over_capacity)}[/red]")
    artifacts: list[Artifact] = [compact_json_artifact("trace.json", sim_trace(res)),
                                 Artifact("timeline.png", lambda path: sim_timeline_png(res, path)),
                                 *plan_artifacts(plan)]
    if cfg.sim.policy == "ready_first":
        artifacts.append(table_artifact("executed_schedule.csv", res.executed_table()))
        summary["executed_schedule"] = "executed_schedule.csv"
    return Result(summary, tuple(report), tuple(artifacts))
