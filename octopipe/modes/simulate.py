"""`mode=simulate`: one schedule through the communication-aware simulator.

`schedule=<name>` (with `pp`, `chunks`, `microbatches`) or `schedule.file=PATH` (a plan JSON,
whose partition is used, or a torch CSV); layers are split evenly over the stages otherwise.
`sim.*` chooses the policy, communication semantics, hint, limits and jitter; with
`sim.monte_carlo=N` the summary adds the makespan's mean, spread and percentiles over N seeded
jittered runs. Writes summary.json, trace.json (Chrome/Perfetto), timeline.png, schedule.csv
(torch dialect), plan.json, and under ready_first executed_schedule.csv: the order each device
actually ran, a table that strict order reproduces.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import OmegaConf
from rich.console import Console
from rich.table import Table

from octopipe.errors import ConfigError
from octopipe.plan import Plan, uniform_partition
from octopipe.schedule.table import ScheduleTable
from octopipe.sim import Jitter, SimResult, Simulator
from octopipe.sim.result import CAUSES
from octopipe.sim.trace import timeline_png, write_chrome_trace


def sim_option(cfg: Any, key: str, default: Any = None) -> Any:
    return OmegaConf.select(cfg, f"sim.{key}", default=default)


def jitter_of(cfg: Any, cv: float | None = None) -> Jitter:
    return Jitter(cv=float(sim_option(cfg, "jitter_cv", 0.0) if cv is None else cv),
                  slow_prob=float(sim_option(cfg, "slow_prob", 0.0)),
                  slow_factor=float(sim_option(cfg, "slow_factor", 2.0)))


def run_options(cfg: Any) -> dict:
    """Keyword arguments of `Simulator.run` from `sim.*`."""
    inflight = sim_option(cfg, "max_inflight")
    return {"policy": str(sim_option(cfg, "policy", "strict")),
            "semantics": str(sim_option(cfg, "semantics", "eager")),
            "hint": str(sim_option(cfg, "hint", "table")),
            "max_inflight": None if inflight is None else int(inflight),
            "memory_limit": bool(sim_option(cfg, "memory_limit", False)),
            "check_memory": bool(sim_option(cfg, "check_memory", False))}


def _int_or_none(cfg: Any, key: str) -> int | None:
    v = OmegaConf.select(cfg, key, default=None)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ConfigError(f"{key}={v!r}: must be a positive integer")
    return v


def plan_file_shards(cfg: Any) -> dict[int, int]:
    """The layers a plan JSON in `schedule.file` splits ({} for whole layers or a CSV)."""
    path = OmegaConf.select(cfg, "schedule.file", default=None)
    if not path or Path(str(path)).suffix.lower() != ".json":
        return {}
    from octopipe.schedule.plan_io import load_plan
    return dict(load_plan(Path(str(path))).shards)


def schedule_from_cfg(cfg: Any, n_layers: int) -> tuple[ScheduleTable, tuple[tuple[int, int], ...]]:
    """The table `schedule.name`/`schedule.file` asks for, and its partition."""
    path = OmegaConf.select(cfg, "schedule.file", default=None)
    if path:
        from octopipe.schedule.plan_io import load_plan, load_schedule_file
        p = Path(str(path))
        if p.suffix.lower() == ".json":
            plan = load_plan(p)
            if plan.n_layers != n_layers:
                raise ConfigError(f"schedule.file {str(p)!r} partitions {plan.n_layers} layers but "
                                  f"the model has {n_layers}; use the plan's model")
            return plan.table, plan.partition
        table = load_schedule_file(p)
    else:
        from octopipe.schedule.library import build_schedule
        name = OmegaConf.select(cfg, "schedule.name", default=None)
        if not name:
            raise ConfigError("schedule: give schedule=<name> or schedule.file=PATH")
        pp = _int_or_none(cfg, "pp")
        m = _int_or_none(cfg, "microbatches")
        if pp is None or m is None:
            raise ConfigError("pp and microbatches must be set for a named schedule")
        table = build_schedule(str(name), pp, m, _int_or_none(cfg, "chunks"))
    return table, uniform_partition(n_layers, table.n_stages)


def summary_table(title: str, figures: dict) -> Table:
    t = Table(title=title, show_header=False)
    for k, v in figures.items():
        if isinstance(v, float):
            v = f"{v:.6g}"
        elif isinstance(v, (list, dict)):
            continue
        t.add_row(k, str(v))
    return t


def write_artifacts(res: SimResult, plan: Plan, out_dir: Path) -> None:
    from octopipe.schedule.plan_io import save_plan
    write_chrome_trace(res, out_dir / "trace.json")
    timeline_png(res, out_dir / "timeline.png")
    save_plan(plan, out_dir / "plan.json", out_dir / "schedule.csv")


def run(cfg, out_dir: Path) -> dict:
    from octopipe.load import load_cluster, load_costs, load_model
    from octopipe.schedule.render import grid_text
    model = load_model(cfg)
    cluster = load_cluster(cfg)
    costs = load_costs(cfg, model, cluster)
    counts = plan_file_shards(cfg)
    if counts:            # a plan that splits layers partitions the split model: price its pieces
        from octopipe.load import load_splitter
        splitter = load_splitter(cfg, model, cluster, costs)
        if splitter is None:
            raise ConfigError("schedule.file: the plan splits layers but these costs do not match the "
                              "model layer for layer; use the plan's model and cost source")
        costs = splitter.costs_for(counts)
    table, partition = schedule_from_cfg(cfg, costs.n_layers)
    if table.n_devices > cluster.n_devices:
        raise ConfigError(f"the schedule uses {table.n_devices} devices but the cluster has "
                          f"{cluster.n_devices}; set pp={cluster.n_devices} or pick a larger cluster")
    plan = Plan(partition, table, model.name, cluster.name, {"source": "mode=simulate"})
    sim = Simulator(plan, costs, cluster)
    opts = run_options(cfg)
    seed = int(OmegaConf.select(cfg, "seed", default=0))
    jitter = jitter_of(cfg)
    res = sim.run(jitter=jitter, seed=seed, **opts)
    console = Console(width=120)
    console.print(grid_text(table))
    summary = {"schedule": table.name, "model": model.name, "cluster": cluster.name,
               "n_devices": table.n_devices, "n_stages": table.n_stages,
               "microbatches": table.n_microbatches, "partition": [list(p) for p in partition],
               **res.summary()}
    runs = int(sim_option(cfg, "monte_carlo", 0) or 0)
    if runs:
        if not jitter.active:
            raise ConfigError("sim.monte_carlo needs variability: set sim.jitter_cv > 0 or sim.slow_prob > 0")
        mc = sim.monte_carlo(runs, jitter, seed=seed, **{k: v for k, v in opts.items() if k != "check_memory"})
        summary["monte_carlo"] = mc.summary()
    console.print(summary_table(f"{table.name}: {opts['policy']} / {opts['semantics']}", summary))
    causes = Table(title="bubble causes per device (s)")
    causes.add_column("device")
    for c in CAUSES:
        causes.add_column(c)
    for d, row in enumerate(res.bubble_causes):
        causes.add_row(str(d), *(f"{x:.4g}" for x in row))
    console.print(causes)
    if res.over_capacity:
        console.print(f"[red]over capacity: devices {list(res.over_capacity)}[/red]")
    write_artifacts(res, plan, out_dir)
    if opts["policy"] == "ready_first":
        from octopipe.schedule.csv_io import write_csv
        write_csv(res.executed_table(), out_dir / "executed_schedule.csv")
        summary["executed_schedule"] = "executed_schedule.csv"
    return summary
