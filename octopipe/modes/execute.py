"""`mode=execute`: run a plan on the torch.distributed runtime and measure it against the simulator.

The plans (a named schedule, a plan or CSV file, or the tuner's plan), the model chosen for this
machine, the in-situ calibration and the figures written are described in docs/runtime.md
("mode=execute"). `check_runtime` checks what of `runtime.*` depends on this machine before any
work; `measure` is a function of values (a `Job` template, the plans) returning a `Result`.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
from rich.table import Table

from octopipe.asynchronous.tables import refuse_flushing
from octopipe.cluster import Cluster
from octopipe.config.cost import ProfiledCost
from octopipe.config.presets import preset
from octopipe.config.runtime import RuntimeConfig
from octopipe.config.schema import Config
from octopipe.cost.profiled import profiled_costs
from octopipe.cost.sources import cost_table
from octopipe.cost.table import CostTable
from octopipe.errors import ConfigError
from octopipe.io import preset_names
from octopipe.measure.insitu import Calibration, calibrate, calibration_partition
from octopipe.measure.measured_vs_simulated import Comparison, summarise
from octopipe.measure.memory import MEMORY_KEYS, memory_figures, rank_layer_bytes
from octopipe.measure.rank_time import rank_profile
from octopipe.model.build import build_model
from octopipe.model.params import model_params
from octopipe.model.spec import ModelSpec
from octopipe.modes.artifacts import json_artifact, plan_artifacts
from octopipe.modes.inputs import Inputs, splitter_for
from octopipe.modes.mode_result import Result
from octopipe.modes.simulate import check_devices, check_file_work, schedule_from_cfg
from octopipe.plan import Plan, plan_model
from octopipe.plan_io import load_plan
from octopipe.runtime.dispatch import check_arbitration, plain, variability_of
from octopipe.runtime.job import Job
from octopipe.runtime.launch import ExecutionResult, execute
from octopipe.runtime.machine import local_cluster, measure_loopback
from octopipe.runtime.pinning import available_cores, rank_cores
from octopipe.runtime.tensor_parallel import agreement_cost
from octopipe.runtime.trace import measured_trace
from octopipe.runtime.transport import choose_transport
from octopipe.sim.hints import PLAN
from octopipe.sim.simulator import ReadyFirst, Simulator
from octopipe.tune.splitting import LayerSplitter, model_splitter
from octopipe.tune.tuner import TuneOptions, tune

FALLBACK_MODEL = "tiny_hybrid"


def check_runtime(config: RuntimeConfig) -> RuntimeConfig:
    """`config` once what depends on this machine (links it cannot run, pinning it cannot do)
    is checked, before any work; field types and ranges the schema has checked already."""
    rank_links(config)
    rank_cores(config, 1)
    return config


def rank_links(config: RuntimeConfig) -> dict[str, str]:
    """The ranks' backend, transport and device: `runtime.backend` with `runtime.transport` and
    `runtime.device` resolved (auto: NCCL runs the ordered transport on CUDA, gloo the tagged
    one on the CPU; gloo with device=cuda lets several ranks share a GPU)."""
    transport, device = choose_transport(config.backend, config.transport, config.device)
    return {"backend": config.backend, "transport": transport, "device": device}


def model_preset(name: str) -> ModelSpec:
    """The ModelSpec of model preset `name`."""
    return build_model(preset("model", name))


def choose_model(config: RuntimeConfig, selected: Callable[[], ModelSpec]) -> tuple[ModelSpec, str | None]:
    """The ModelSpec mode=execute runs (see the module docstring) and, when it replaces the
    model group's (`selected()`, asked for only with runtime.model=auto), the line saying so."""
    if config.model != "auto":
        if config.model not in preset_names("model"):
            raise ConfigError(f"runtime.model={config.model!r}: unknown preset; use auto or one of "
                              f"{', '.join(preset_names('model'))}")
        return model_preset(config.model), None
    model = selected()
    if config.compute == "real" and model_params(model) > config.max_params:
        note = (f"[yellow]runtime.compute=real: {model.name} has {model_params(model) / 1e9:.2f}B "
                f"parameters, above runtime.max_params={float(config.max_params):.3g}; running the "
                f"{FALLBACK_MODEL} preset instead (runtime.model=<preset> chooses another, "
                f"runtime.compute=emulated keeps {model.name})[/yellow]")
        return model_preset(FALLBACK_MODEL), note
    return model, None


def n_ranks(inputs: Inputs) -> int:
    """The ranks the plans run on: `pp`, or every rank of the cluster when it is null."""
    return inputs.config.pp if inputs.config.pp is not None else inputs.cluster.n_devices


def _splitter(inputs: Inputs, model: ModelSpec, costs: CostTable, cluster: Cluster) -> LayerSplitter | None:
    """How the tuner may split heavy layers: real compute measures each piece (`cost=profiled`);
    emulated compute splits as the planner does for the configured costs."""
    if inputs.config.runtime.compute == "real":
        return model_splitter(model, lambda m: _cost_table(inputs.config, m, cluster))
    return splitter_for(inputs.config.cost, model, cluster, costs)


def _with_schedule(cfg: Config, name: str | None) -> Config:
    """`cfg` with schedule `name` in place of the schedule group's (None: `cfg` itself)."""
    return cfg if name is None else replace(cfg, schedule=replace(cfg.schedule, name=name, file=None))


def _plans(inputs: Inputs, model: ModelSpec, costs: CostTable, cluster: Cluster) -> list[Plan]:
    """The plans `runtime.schedules` (or the schedule group) names, in that order."""
    cfg = inputs.config
    names = list(cfg.runtime.schedules) if cfg.runtime.schedules else [None]
    plans = []
    for name in names:
        sub = _with_schedule(cfg, name)
        path = sub.schedule.file
        if sub.schedule.name == "octopipe" and not path:
            res = tune(costs, cluster, n_ranks(inputs), cfg.microbatches, TuneOptions(
                cfg.tuner, cfg.solver, seed=cfg.seed, model=model.name,
                splitter=_splitter(inputs, model, costs, cluster)))
            plan = res.plan
            plans.append(Plan(plan.partition, replace(plan.table, name="octopipe"), model.name,
                              cluster.name, plan.meta, plan.pieces))
            continue
        if path and Path(path).suffix.lower() == ".json":     # keep its meta (pieces)
            check_file_work(cfg, Path(path))
            plan = load_plan(Path(path))
            check_devices(sub, plan.table)
            plan_model(model, plan)
            plans.append(Plan(plan.partition, plan.table, model.name, cluster.name,
                              {**plan.meta, "source": f"schedule.file={path}"}, plan.pieces))
            continue
        table, partition = schedule_from_cfg(sub, model.n_layers)
        check_devices(sub, table)
        refuse_flushing(table.name, "mode=execute")   # an asynchronous table never runs with a silent flush
        plans.append(Plan(partition, table, model.name, cluster.name, {"source": "mode=execute"}))
    return plans


def _costs(inputs: Inputs, model: ModelSpec) -> tuple[CostTable, Cluster]:
    """(costs, cluster the simulator sees) for the chosen compute mode."""
    cfg, n = inputs.config, n_ranks(inputs)
    link = measure_loopback(cache=_cache_dir(cfg).parent / "loopback_link.json")
    if cfg.runtime.compute == "emulated":
        cluster = inputs.cluster
        return _cost_table(cfg, model, cluster), local_cluster(n, link, like=cluster)
    sim_cluster = local_cluster(n, link)
    return _cost_table(cfg, model, sim_cluster), sim_cluster


def _cache_dir(cfg: Config) -> Path:
    """Where measured costs are cached (`cost.cache_dir` under cost=profiled, else its default)."""
    chosen = cfg.cost.cache_dir if isinstance(cfg.cost, ProfiledCost) else ""
    return Path(chosen or ProfiledCost().cache_dir)


def _cost_table(cfg: Config, model: ModelSpec, cluster: Cluster) -> CostTable:
    """Emulated: the configured costs of `model` on `cluster`; real: its `cost=profiled` times,
    measured on the device the ranks compute on."""
    if cfg.runtime.compute == "emulated":
        costs = cost_table(cfg.cost, model, cluster)
        if costs.n_layers != model.n_layers:
            raise ConfigError(f"cost: the cost table has {costs.n_layers} layers but the plan runs {model.name!r} "
                              f"with {model.n_layers} (split layers); use cost=analytic or cost=profiled")
        return costs
    cost = cfg.cost if isinstance(cfg.cost, ProfiledCost) else preset("cost", "profiled")
    return profiled_costs(replace(cost, device=rank_links(cfg.runtime)["device"]), model, cluster)


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
    cal, _ = calibrate(replace(job, config=plain(job.config)), partition, cores=available_cores())
    report.append(f"calibration {cal.name}: {len(cal.partition)} stages on {n} ranks, fitted background "
                  f"load {cal.background:.3f} cores")
    return cal


def _mb(values: Sequence[float]) -> str:
    return "[" + ", ".join(f"{x / 1e6:.2f}" for x in values) + "]"


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


def arbitration_prediction(job: Job, res: ExecutionResult) -> dict | None:
    """Measured against simulated under `job`'s variability, hint and caps, or None when it sets
    none: each stage's base F/I/W/B time is what the measured iterations took divided by the
    factor drawn for each action (the draws are known: seed, iteration), and the simulator runs
    the same policy on the same draws of every measured iteration."""
    config = job.config
    var = variability_of(config, job)
    plain = config.hint == "table" and config.max_inflight == PLAN and config.memory_cap is None
    if plain and not var.active:
        return None
    sim = Simulator(res.table if res.table is not None else job.plan.table.compact().compute_only())
    p = sim.program
    node = {str(p.action(c)): c for c in range(p.n_compute)}
    acc: dict[tuple[int, int], list[float]] = {}
    for it in job.measured:
        d = var.draws(np.random.default_rng((job.seed, it)), p.n_stages, p.n_microbatches)
        for ev in res.events:
            for e in ev:
                if e["it"] == it and "action" in e:
                    c = node[e["action"]]
                    f = float(var.compute_factor(d, p.c_stage[c], p.c_kind[c], p.c_mb[c], p.c_dev[c]))
                    acc.setdefault((int(p.c_stage[c]), int(p.c_kind[c])), []).append((e["end"] - e["start"]) / f)
    base = sim.uniform(transfer=1e-4).durations
    base = base.scaled(compute=np.array([np.mean(acc[(int(p.c_stage[c]), int(p.c_kind[c]))])
                                         for c in range(p.n_compute)]))
    policy = "strict" if config.dispatch == "strict" else \
        ReadyFirst(config.hint, config.max_inflight, False)
    sims = [sim.run(var.apply(p, base, np.random.default_rng((job.seed, it))) if var.active else base,
                    policy=policy).makespan for it in job.measured]
    meas = [res.iteration_s[it] for it in job.measured]
    return {"measured_iteration_s": float(np.mean(meas)), "simulated_iteration_s": float(np.mean(sims)),
            "error": abs(float(np.mean(meas)) - float(np.mean(sims))) / float(np.mean(meas)),
            "hint": config.hint, "max_inflight": config.max_inflight, "jitter_cv": config.jitter_cv,
            "straggler_prob": config.straggler_prob, "seq_len_cv": config.seq_len_cv,
            "images_max": config.images_max, "transfer_delay": config.transfer_delay}


def measure(job: Job, plans: Sequence[Plan], costs_of: Callable[[ModelSpec], CostTable]) -> Result:
    """Run every plan as `job` (model, config, seed, costs and the simulator's cluster) runs
    them, each predicted from its calibration, and compare; `costs_of(model)` prices a plan
    whose layers are split. A function of values: the summary, report lines and artifacts."""
    config, model = job.config, job.model
    links = rank_links(config)
    pins = [rank_cores(config, plan.table.n_devices * config.tp) for plan in plans]   # a core per TP rank
    pinned = pins[0]
    report: list = [f"ranks pinned to cores {list(pinned)}" if pinned else "ranks not pinned"]
    # per model the plans run (split layers or not) its costs; per (model, ranks, calibration
    # partition) a calibration, all launched before the measured runs
    model_costs: dict = {}
    model_bytes: dict = {}
    calibrations: dict = {}
    jobs, keys = [], []
    for plan, pin in zip(plans, pins):
        run_model = plan_model(model, plan)
        if run_model not in model_costs:
            if run_model is not model:
                report.append(f"plan {plan.table.name}: layers split as pieces={plan.pieces} "
                              f"({model.n_layers} -> {run_model.n_layers} layers)")
            model_costs[run_model] = job.costs if run_model is model else costs_of(run_model)
            model_bytes[run_model] = rank_layer_bytes(job, run_model, links["device"])
        plan_job = replace(job, plan=plan, model=run_model, costs=model_costs[run_model], pinned=pin)
        check_arbitration(plan_job, plan.table.compact().compute_only(),
                          choose_transport(config.backend, config.transport, config.device)[0])
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
                           "agreement": agreement_cost(c.result.events, plan_job.measured),
                           "pinned": list(plan_job.pinned) if plan_job.pinned else None,
                           "arbitration": arbitration_prediction(plan_job, c.result),
                           "rank_time": rank_profile(c.result.events, list(plan_job.measured)),
                           **memory_figures(plan_job, c.result, calibration, model_bytes[plan_job.model])}
        rows.append(c)
        trace = measured_trace(c.result.events, list(plan_job.measured))
        artifacts.append(json_artifact("trace.json" if len(plans) == 1 else f"trace_{c.schedule}.json", trace))
        if plan_job is jobs[0]:
            artifacts.extend(plan_artifacts(plan_job.plan))
            if len(plans) > 1:
                artifacts.append(json_artifact("trace.json", trace))
    tp = f" x tp {config.tp}" if config.tp > 1 else ""
    report.append(_table(rows, f"mode=execute: {model.name}, {plans[0].table.n_devices} ranks{tp}, {config.compute} "
                               f"compute, {config.dispatch}, {plans[0].table.n_microbatches} micro-batches"))
    if any(d["calibration"] for d in per.values()):
        report.append("simulated from: " + ", ".join(f"{name} <- {d['calibration'] or 'cost=profiled'}"
                                                     for name, d in per.items()))
    for name, d in per.items():
        arb, agreed = d["arbitration"], d["agreement"]
        if arb is not None:
            report.append(f"{name} under hint={arb['hint']}, max_inflight={arb['max_inflight']}, jitter_cv="
                          f"{arb['jitter_cv']}: measured {arb['measured_iteration_s']:.4f} s/iter, simulated on "
                          f"the same draws {arb['simulated_iteration_s']:.4f} ({100 * arb['error']:.1f}%)")
        if d["memory_max_rel_err"] is not None:
            report.append(f"{name} memory per rank (MB): measured {_mb(d['memory_measured_bytes'])}, simulated "
                          f"{_mb(d['memory_simulated_bytes'])} (max rel err {100 * d['memory_max_rel_err']:.1f}%), "
                          f"replay {_mb(d['memory_simulated_replay_bytes'])}")
            if d["memory_executed_max_rel_err"] is not None:
                report.append(f"{name} memory on the order the ranks ran (MB): simulated "
                              f"{_mb(d['memory_simulated_executed_bytes'])} (max rel err "
                              f"{100 * d['memory_executed_max_rel_err']:.1f}%)")
        if agreed is not None:
            report.append(f"{name}: TP agreement {agreed['us_per_round']:.0f} us per round, "
                          f"{agreed['rounds_per_task']:.2f} rounds per task, at most "
                          f"{100 * agreed['max_share_of_iteration']:.1f}% of a rank's iteration")
    first = rows[0]
    calibration = calibrations[keys[0]]
    pieces = plans[0].pieces
    errs = [c.grad_check_max_rel_err for c in rows if c.grad_check_max_rel_err is not None]
    summary = {
        "model": model.name, "compute": config.compute, "dispatch": config.dispatch, **links,
        "split_layers": {str(k): int(v) for k, v in pieces.items()} if pieces else None,
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
        "arbitration": per[first.schedule]["arbitration"],
        "tp": config.tp, "agreement": per[first.schedule]["agreement"],
        **{k: per[first.schedule][k] for k in MEMORY_KEYS},
        "schedules": per}
    return Result(summary, tuple(report), tuple(artifacts))


def run(inputs: Inputs) -> Result:
    cfg = inputs.config
    config = check_runtime(cfg.runtime)
    model, note = choose_model(config, lambda: inputs.model)
    costs, cluster = _costs(inputs, model)
    plans = _plans(inputs, model, costs, cluster)
    job = Job(plans[0], model, config, seed=cfg.seed, costs=costs, cluster=cluster)
    result = measure(job, plans, lambda m: _cost_table(cfg, m, cluster))
    return replace(result, report=((note,) if note else ()) + result.report)
