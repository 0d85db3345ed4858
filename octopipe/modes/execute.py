"""`mode=execute`: run a plan on the torch.distributed runtime and measure it against the simulator.

The plan is a named schedule (`schedule=<name>`, with `pp`, `chunks`, `microbatches`; layers split
evenly), a file (`schedule.file=PATH`: a plan JSON with its partition, or a torch CSV), or the
tuner's plan (`schedule=octopipe`); `runtime.schedules=[1f1b,zbv]` runs several side by side.

A plan with `shards` (the tuner's split layers: original layer index -> pieces) runs
the model with those layers split (`octopipe.model.shard`, `plan_model`): its partition indexes
the pieces; the stages, the reference gradients, the profiled costs and the calibration are those
of the split model, which starts from the unsplit model's weights (so its loss is the same).

Model: `runtime.compute=real` builds the layers, so a model too large for this machine would not
fit: with `runtime.model=auto` (the default) a model above `runtime.max_params` parameters is
replaced by the tiny_hybrid preset and the run says so; `runtime.model=<preset>` picks one.

Pinning: `runtime.pin=auto` (the default) pins rank r to the r-th core (modulo the cores this
process may use, `octopipe.runtime.pinning.pin_map`) where the platform can (Linux); `true` insists,
`false` leaves placement to the OS. Pinned ranks run every launch, calibration and measured
alike, on their cores, and the fit and the prediction count concurrency per core.

Calibration: the simulator gets costs calibrated in situ (`runtime.calibrate=true`, the default;
see octopipe/measure/insitu.py). Before the plans run, one separate launch per partition the
schedules use measures F, I, W and B of every stage on the same ranks, backend, threads and
cores: a plan with `c` stages on each rank (1F1B, GPipe, ZB-H1: c=1; interleaved, ZB-V: c=2; a
tuned plan, even split or not) is predicted from `calibration_table(n, m, chunks=c)` (1F1B, or
interleaved 1F1B for c > 1, with half its backwards split into I and W) run on that very
partition (`insitu.calibration_partition`); any other plan from the even one-stage-per-rank
calibration's per-layer fit, which spreads each calibrated stage over its layers in the
`cost=profiled` profile's shape. Durations
are referred to a core of their own and stretched again where ranks share cores; that gives
`simulated_iteration_s`, and each schedule's summary names its `calibration`. The offline
profile's prediction stays in `simulated_profiled_iteration_s` / `fidelity_error_profiled`;
`runtime.calibrate=false` (or fewer than 2 micro-batches) predicts from the profile alone. The
loopback link is measured too.
`runtime.compute=emulated` keeps the selected model: every action sleeps its modelled time
(cost=analytic/file/profiled, scaled to `runtime.emulate_step_s`) while messages of the modelled
sizes really travel, so 8-16 ranks fit on two cores; its ranks are never pinned.

Ranks and links: `runtime.backend` gloo (default) or nccl (a GPU per rank), `runtime.device`
(auto: cuda with nccl, else cpu; `cuda` with gloo lets several ranks share one GPU, messages staged
through host memory) and `runtime.transport` (auto: `ordered` with nccl, which matches messages by
order, `tagged` with gloo); `cost=profiled` measures the layers on that same device.

Writes trace.json (the measured run: a track per rank, transfers as flows; one trace_<name>.json
per schedule when several run), plan.json + schedule.csv (the first schedule), summary.json with
grad_check_max_rel_err, measured_iteration_s, simulated_iteration_s, fidelity_error, `pinned`
(each rank's core, or null), the `calibrations` run and a `schedules` entry per schedule.
`simulated_replay_iteration_s` / `fidelity_error_replay` re-simulate with each stage's F/I/W/B
times observed in the measured iterations: on a shared, loaded CPU this separates the simulator's
model of the schedule (dependencies, transfers, dispatch) from the drift between offline
profiling and the contended run.

Structure: `runtime_config` turns `cfg.runtime` into a validated `RuntimeConfig` once; the input
builders (`choose_model`, `_costs`, `_plans`) read the rest of the config; `measure` is a
function of values (a `Job` template with the model, config, costs and cluster, the plans)
returning a `Result` (summary, report lines, artifacts); `run` prints and writes it.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Sequence

from omegaconf import OmegaConf
from rich.console import Console
from rich.table import Table

from octopipe.cluster import Cluster
from octopipe.config.convert import convert
from octopipe.config.runtime import RuntimeConfig
from octopipe.cost.profiled import profiled_costs
from octopipe.cost.table import CostTable
from octopipe.errors import ConfigError
from octopipe.io import CONF_DIR, json_text, preset_names, write_atomic
from octopipe.load import load_cluster, load_costs, load_model, load_splitter
from octopipe.measure.fidelity import Comparison, summarise
from octopipe.measure.insitu import Calibration, calibrate, calibration_partition
from octopipe.measure.machine import local_cluster, measure_loopback
from octopipe.model.build import build_model
from octopipe.model.params import model_params
from octopipe.model.spec import ModelSpec
from octopipe.modes.result import Artifact, Result
from octopipe.modes.simulate import schedule_from_cfg
from octopipe.plan import Plan, plan_model
from octopipe.runtime.job import Job
from octopipe.runtime.launch import execute
from octopipe.runtime.pinning import available_cores, can_pin, core_ids, pin_map
from octopipe.runtime.trace import chrome_trace
from octopipe.runtime.transport import choose_transport
from octopipe.schedule.plan_io import load_plan, save_plan
from octopipe.tune.split import model_splitter
from octopipe.tune.tuner import tune

FALLBACK_MODEL = "tiny_hybrid"


def runtime_config(cfg: Any) -> RuntimeConfig:
    """`cfg.runtime` as a validated RuntimeConfig: field types and ranges by the schema, then
    what depends on this machine (links it cannot run, pinning it cannot do), before any work."""
    config = convert(RuntimeConfig, cfg.get("runtime"), "runtime.")
    rank_links(config)
    rank_cores(config, 1)
    return config


def rank_links(config: RuntimeConfig) -> dict[str, str]:
    """The ranks' backend, transport and device: `runtime.backend` with `runtime.transport` and
    `runtime.device` resolved (auto: NCCL runs the ordered transport on CUDA, gloo the tagged
    one on the CPU; gloo with device=cuda lets several ranks share a GPU)."""
    transport, device = choose_transport(config.backend, config.transport, config.device)
    return {"backend": config.backend, "transport": transport, "device": device}


def rank_cores(config: RuntimeConfig, n: int) -> tuple[int, ...] | None:
    """Each rank's core under `runtime.pin` (auto | true | false), or None when ranks are not
    pinned; emulated compute never pins (its ranks sleep)."""
    if config.pin == "true" and not can_pin():
        raise ConfigError("runtime.pin=true: this platform cannot pin a process to a core "
                          "(no os.sched_setaffinity); use runtime.pin=auto or false")
    if config.pin == "false" or config.compute != "real" or not can_pin():
        return None
    return pin_map(n, core_ids())


def choose_model(config: RuntimeConfig, selected: ModelSpec | None) -> tuple[ModelSpec, str | None]:
    """The ModelSpec mode=execute runs (see the module docstring) and, when it replaces the
    `selected` model (the model group's, needed with runtime.model=auto), the line saying so."""
    if config.model != "auto":
        path = CONF_DIR / "model" / f"{config.model}.yaml"
        if not path.exists():
            raise ConfigError(f"runtime.model={config.model!r}: unknown preset; use auto or one of "
                              f"{', '.join(preset_names('model'))}")
        return build_model(OmegaConf.load(path)), None
    if config.compute == "real" and model_params(selected) > config.max_params:
        note = (f"[yellow]runtime.compute=real: {selected.name} has {model_params(selected) / 1e9:.2f}B "
                f"parameters, above runtime.max_params={float(config.max_params):.3g}; running the "
                f"{FALLBACK_MODEL} preset instead (runtime.model=<preset> chooses another, "
                f"runtime.compute=emulated keeps {selected.name})[/yellow]")
        return build_model(OmegaConf.load(CONF_DIR / "model" / f"{FALLBACK_MODEL}.yaml")), note
    return selected, None


def _splitter(cfg: Any, config: RuntimeConfig, model: ModelSpec, costs: CostTable, cluster: Cluster):
    """How the tuner may split heavy layers: real compute measures each piece (`cost=profiled`);
    emulated compute splits as `load_splitter` does for the configured costs."""
    if config.compute == "real":
        return model_splitter(model, lambda m: _cost_table(cfg, config, m, cluster))
    return load_splitter(cfg, model, cluster, costs)


def _plans(cfg: Any, config: RuntimeConfig, model: ModelSpec, costs: CostTable, cluster: Cluster) -> list[Plan]:
    """The plans `runtime.schedules` (or the schedule group) names, in that order."""
    names = list(config.schedules) if config.schedules else [None]
    plans = []
    for name in names:
        sub = cfg if name is None else OmegaConf.merge(cfg, {"schedule": {"name": name, "file": None}})
        if str(OmegaConf.select(sub, "schedule.name", default="")) == "octopipe" and \
                not OmegaConf.select(sub, "schedule.file", default=None):
            res = tune(costs, cluster, int(cfg.pp), int(cfg.microbatches), tuner_cfg=cfg.get("tuner"),
                       solver_cfg=cfg.get("solver"), seed=int(cfg.get("seed", 0)), model=model.name,
                       splitter=_splitter(cfg, config, model, costs, cluster))
            plan = res.plan
            plans.append(Plan(plan.partition, plan.table.__class__(
                plan.table.rows, plan.table.placement, plan.table.n_microbatches, "octopipe",
                plan.table.replicas, plan.table.mb_replica), model.name, cluster.name, plan.meta,
                plan.shards))
            continue
        path = OmegaConf.select(sub, "schedule.file", default=None)
        if path and Path(str(path)).suffix.lower() == ".json":     # keep its meta (shards)
            plan = load_plan(Path(str(path)))
            plan_model(model, plan)
            plans.append(Plan(plan.partition, plan.table, model.name, cluster.name,
                              {**plan.meta, "source": f"schedule.file={path}"}, plan.shards))
            continue
        table, partition = schedule_from_cfg(sub, model.n_layers)
        plans.append(Plan(partition, table, model.name, cluster.name, {"source": "mode=execute"}))
    return plans


def _costs(cfg: Any, config: RuntimeConfig, model: ModelSpec, n: int) -> tuple[CostTable, Cluster]:
    """(costs, cluster the simulator sees) for the chosen compute mode."""
    link = measure_loopback(cache=_cache_dir(cfg).parent / "loopback_link.json")
    if config.compute == "emulated":
        cluster = load_cluster(cfg)
        return _cost_table(cfg, config, model, cluster), local_cluster(n, link, like=cluster)
    sim_cluster = local_cluster(n, link)
    return _cost_table(cfg, config, model, sim_cluster), sim_cluster


def _cache_dir(cfg: Any) -> Path:
    return Path(str(OmegaConf.select(cfg, "cost.cache_dir", default=None) or "runs/cache/profiled"))


def _cost_table(cfg: Any, config: RuntimeConfig, model: ModelSpec, cluster: Cluster) -> CostTable:
    """Emulated: the configured costs of `model` on `cluster`; real: its `cost=profiled` times."""
    if config.compute == "emulated":
        costs = load_costs(cfg, model, cluster)
        if costs.n_layers != model.n_layers:
            raise ConfigError(f"cost: the cost table has {costs.n_layers} layers but the plan runs {model.name!r} "
                              f"with {model.n_layers} (split layers); use cost=analytic or cost=profiled")
        return costs
    cost_cfg = cfg.cost if str(OmegaConf.select(cfg, "cost.source", default="")) == "profiled" \
        else OmegaConf.load(CONF_DIR / "cost" / "profiled.yaml")
    cost_cfg = OmegaConf.merge(cost_cfg, {"device": rank_links(config)["device"]})   # measured where the ranks compute
    return profiled_costs(cost_cfg, model, cluster)


def _calibration(job: Job, partition, report: list) -> Calibration | None:
    """The in-situ calibration on `partition` for `job`'s ranks and micro-batches, or None (see
    the docstring); what it says goes to `report`."""
    if not job.config.calibrate:
        return None
    n, m = job.plan.table.n_devices, job.plan.table.n_microbatches
    if m < 2:
        report.append(f"[yellow]runtime.calibrate: {m} micro-batch is too few for the calibration run "
                      "(it needs 2); predicting from cost=profiled alone[/yellow]")
        return None
    cal, _ = calibrate(job, partition, cores=available_cores())
    report.append(f"calibration {cal.name}: {len(cal.partition)} stages on {n} ranks, fitted background "
                  f"load {cal.background:.3f} cores")
    return cal


def _json_artifact(name: str, doc: Any) -> Artifact:
    return Artifact(name, lambda path: path.write_text(json_text(doc)))


def _plan_artifact(plan: Plan) -> Artifact:
    """plan.json with schedule.csv beside it."""
    return Artifact("plan.json", lambda path: save_plan(plan, path, path.with_name("schedule.csv")))


def _table(rows: Sequence[Comparison], title: str) -> Table:
    t = Table(title=title)
    for col in ("schedule", "measured s/iter", "simulated s/iter", "fidelity error", "profiled error",
                "replay sim s/iter", "replay error", "grad max rel err"):
        t.add_column(col)
    for c in rows:
        g = "-" if c.grad_check_max_rel_err is None else f"{c.grad_check_max_rel_err:.2e}"
        replay = ("-", "-") if c.simulated_replay_s is None else \
            (f"{c.simulated_replay_s:.4f}", f"{100 * c.fidelity_error_replay:.1f}%")
        prof = "-" if c.fidelity_error_profiled is None else f"{100 * c.fidelity_error_profiled:.1f}%"
        t.add_row(c.schedule, f"{c.measured_iteration_s:.4f}", f"{c.simulated_iteration_s:.4f}",
                  f"{100 * c.fidelity_error:.1f}%", prof, *replay, g)
    return t


def measure(job: Job, plans: Sequence[Plan], costs_of: Callable[[ModelSpec], CostTable]) -> Result:
    """Run every plan as `job` (model, config, seed, costs and the simulator's cluster) runs
    them, each predicted from its calibration, and compare; `costs_of(model)` prices a plan
    whose layers are split. A function of values: the summary, report lines and artifacts."""
    config, model = job.config, job.model
    links = rank_links(config)
    pins = [rank_cores(config, plan.table.n_devices) for plan in plans]
    pinned = pins[0]
    report: list = [f"ranks pinned to cores {list(pinned)}" if pinned else "ranks not pinned"]
    # per model the plans run (split layers or not) its costs; per (model, ranks, calibration
    # partition) a calibration, all launched before the measured runs
    model_costs: dict = {}
    calibrations: dict = {}
    jobs, keys = [], []
    for plan, pin in zip(plans, pins):
        run_model = plan_model(model, plan)
        if run_model not in model_costs:
            if run_model is not model:
                report.append(f"plan {plan.table.name}: layers split as meta shards={plan.meta['shards']} "
                              f"({model.n_layers} -> {run_model.n_layers} layers)")
            model_costs[run_model] = job.costs if run_model is model else costs_of(run_model)
        plan_job = replace(job, plan=plan, model=run_model, costs=model_costs[run_model], pinned=pin)
        key = (run_model, plan.table.n_devices, calibration_partition(plan))
        if key not in calibrations:
            calibrations[key] = _calibration(plan_job, key[2], report) if config.compute == "real" else None
        jobs.append(plan_job)
        keys.append(key)
    rows, per, artifacts = [], {}, []
    for plan_job, key in zip(jobs, keys):
        calibration = calibrations[key]
        c = summarise(plan_job, [execute(plan_job)], calibration)
        per[c.schedule] = {**c.summary(), "calibration": calibration.name if calibration is not None else None,
                           "pinned": list(plan_job.pinned) if plan_job.pinned else None}
        rows.append(c)
        trace = chrome_trace(c.result.events, list(plan_job.measured))
        artifacts.append(_json_artifact("trace.json" if len(plans) == 1 else f"trace_{c.schedule}.json", trace))
        if plan_job is jobs[0]:
            artifacts.append(_plan_artifact(plan_job.plan))
            if len(plans) > 1:
                artifacts.append(_json_artifact("trace.json", trace))
    report.append(_table(rows, f"mode=execute: {model.name}, {plans[0].table.n_devices} ranks, {config.compute} "
                               f"compute, {config.dispatch}, {plans[0].table.n_microbatches} micro-batches"))
    if any(d["calibration"] for d in per.values()):
        report.append("simulated from: " + ", ".join(f"{name} <- {d['calibration'] or 'cost=profiled'}"
                                                     for name, d in per.items()))
    first = rows[0]
    calibration = calibrations[keys[0]]
    shards = plans[0].shards
    errs = [c.grad_check_max_rel_err for c in rows if c.grad_check_max_rel_err is not None]
    summary = {
        "model": model.name, "compute": config.compute, "dispatch": config.dispatch, **links,
        "split_layers": {str(k): int(v) for k, v in shards.items()} if shards else None,
        "n_devices": plans[0].table.n_devices, "microbatches": plans[0].table.n_microbatches,
        "measured_iteration_s": first.measured_iteration_s,
        "simulated_iteration_s": first.simulated_iteration_s,
        "fidelity_error": first.fidelity_error,
        "cost_inputs": "calibrated" if calibration is not None else
        ("profiled" if config.compute == "real" else "modelled"),
        "simulated_profiled_iteration_s": first.simulated_profiled_s,
        "fidelity_error_profiled": first.fidelity_error_profiled,
        "pinned": list(pinned) if pinned else None,
        "calibration": calibration.summary() if calibration is not None else None,
        "calibrations": [cal.summary() for cal in calibrations.values() if cal is not None],
        "simulated_replay_iteration_s": first.simulated_replay_s,
        "fidelity_error_replay": first.fidelity_error_replay,
        "grad_check_max_rel_err": max(errs) if errs else None,
        "mean_fidelity_error": sum(c.fidelity_error for c in rows) / len(rows),
        "schedules": per}
    return Result(summary, tuple(report), tuple(artifacts))


def run(cfg, out_dir: Path) -> dict:
    console = Console(width=120)
    config = runtime_config(cfg)
    model, note = choose_model(config, load_model(cfg) if config.model == "auto" else None)
    if note:
        console.print(note)
    costs, cluster = _costs(cfg, config, model, int(cfg.pp))
    plans = _plans(cfg, config, model, costs, cluster)
    job = Job(plans[0], model, config, seed=int(cfg.get("seed", 0)), costs=costs, cluster=cluster)
    result = measure(job, plans, lambda m: _cost_table(cfg, config, m, cluster))
    for item in result.report:
        console.print(item)
    for artifact in result.artifacts:
        write_atomic(out_dir / artifact.name, artifact.write)
    return result.summary
