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
process may use, `octopipe.runtime.cores.pin_map`) where the platform can (Linux); `true` insists,
`false` leaves placement to the OS. Pinned ranks run every launch, calibration and measured
alike, on their cores, and the fit and the prediction count concurrency per core.

Calibration: the simulator gets costs calibrated in situ (`runtime.calibrate=true`, the default;
see octopipe/runtime/insitu.py). Before the plans run, one separate launch per partition the
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
(each rank's core, or null), the `calibrations` run and a `schedules` entry per schedule. `simulated_replay_iteration_s` / `fidelity_error_replay`
re-simulate with each stage's F/I/W/B times observed in the measured iterations: on a shared,
loaded CPU this separates the simulator's model of the schedule (dependencies, transfers,
dispatch) from the drift between offline profiling and the contended run.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import OmegaConf
from rich.console import Console
from rich.table import Table

from octopipe.errors import ConfigError
from octopipe.plan import Plan

FALLBACK_MODEL = "tiny_hybrid"


def _opt(cfg: Any, key: str, default: Any = None) -> Any:
    return OmegaConf.select(cfg, f"runtime.{key}", default=default)


def choose_model(cfg: Any, console: Console):
    """The ModelSpec mode=execute runs (see the module docstring)."""
    from octopipe.load import load_model
    from octopipe.model.build import build_model
    from octopipe.model.params import model_params
    from octopipe.run import CONF_DIR
    choice = str(_opt(cfg, "model", "auto"))
    compute = str(_opt(cfg, "compute", "real"))
    if choice != "auto":
        path = CONF_DIR / "model" / f"{choice}.yaml"
        if not path.exists():
            names = sorted(p.stem for p in (CONF_DIR / "model").glob("*.yaml"))
            raise ConfigError(f"runtime.model={choice!r}: unknown preset; use auto or one of {', '.join(names)}")
        return build_model(OmegaConf.load(path))
    model = load_model(cfg)
    limit = float(_opt(cfg, "max_params", 5e7))
    if compute == "real" and model_params(model) > limit:
        console.print(f"[yellow]runtime.compute=real: {model.name} has {model_params(model) / 1e9:.2f}B "
                      f"parameters, above runtime.max_params={limit:.3g}; running the {FALLBACK_MODEL} "
                      f"preset instead (runtime.model=<preset> chooses another, "
                      f"runtime.compute=emulated keeps {model.name})[/yellow]")
        return build_model(OmegaConf.load(CONF_DIR / "model" / f"{FALLBACK_MODEL}.yaml"))
    return model


def _splitter(cfg: Any, model, costs, cluster, compute: str):
    """How the tuner may split heavy layers: real compute measures each piece (`cost=profiled`);
    emulated compute splits as `load_splitter` does for the configured costs."""
    from octopipe.load import load_splitter
    from octopipe.tune.split import model_splitter
    if compute == "real":
        return model_splitter(model, lambda m: _cost_table(cfg, m, compute, cluster))
    return load_splitter(cfg, model, cluster, costs)


def _plans(cfg: Any, model, costs, cluster, compute: str) -> list[Plan]:
    from octopipe.modes.simulate import schedule_from_cfg
    names = _opt(cfg, "schedules", None)
    names = [str(n) for n in names] if names else [None]
    plans = []
    for name in names:
        sub = cfg if name is None else OmegaConf.merge(cfg, {"schedule": {"name": name, "file": None}})
        if str(OmegaConf.select(sub, "schedule.name", default="")) == "octopipe" and \
                not OmegaConf.select(sub, "schedule.file", default=None):
            from octopipe.tune.tuner import tune
            res = tune(costs, cluster, int(cfg.pp), int(cfg.microbatches), tuner_cfg=cfg.get("tuner"),
                       solver_cfg=cfg.get("solver"), seed=int(cfg.get("seed", 0)), model=model.name,
                       splitter=_splitter(cfg, model, costs, cluster, compute))
            plan = res.plan
            plans.append(Plan(plan.partition, plan.table.__class__(
                plan.table.rows, plan.table.placement, plan.table.n_microbatches, "octopipe",
                plan.table.replicas, plan.table.mb_replica), model.name, cluster.name, plan.meta,
                plan.shards))
            continue
        path = OmegaConf.select(sub, "schedule.file", default=None)
        if path and Path(str(path)).suffix.lower() == ".json":     # keep its meta and shards
            from octopipe.plan import plan_model
            from octopipe.schedule.plan_io import load_plan
            plan = load_plan(Path(str(path)))
            plan_model(model, plan)
            plans.append(Plan(plan.partition, plan.table, model.name, cluster.name,
                              {**plan.meta, "source": f"schedule.file={path}"}, plan.shards))
            continue
        table, partition = schedule_from_cfg(sub, model.n_layers)
        plans.append(Plan(partition, table, model.name, cluster.name, {"source": "mode=execute"}))
    return plans


def _costs(cfg: Any, model, compute: str, n: int):
    """(costs, cluster the simulator sees) for the chosen compute mode."""
    from octopipe.load import load_cluster
    from octopipe.runtime.calibrate import local_cluster, measure_loopback
    link = measure_loopback(cache=_cache_dir(cfg).parent / "loopback_link.json")
    if compute == "emulated":
        cluster = load_cluster(cfg)
        return _cost_table(cfg, model, compute, cluster), local_cluster(n, link, like=cluster)
    sim_cluster = local_cluster(n, link)
    return _cost_table(cfg, model, compute, sim_cluster), sim_cluster


def _cache_dir(cfg: Any) -> Path:
    return Path(str(OmegaConf.select(cfg, "cost.cache_dir", default=None) or "runs/cache/profiled"))


def _cost_table(cfg: Any, model, compute: str, cluster):
    """Emulated: the configured costs of `model` on `cluster`; real: its `cost=profiled` times."""
    from octopipe.cost.profiled import profiled_costs
    from octopipe.load import load_costs
    from octopipe.run import CONF_DIR
    if compute == "emulated":
        costs = load_costs(cfg, model, cluster)
        if costs.n_layers != model.n_layers:
            raise ConfigError(f"cost: the cost table has {costs.n_layers} layers but the plan runs {model.name!r} "
                              f"with {model.n_layers} (split layers); use cost=analytic or cost=profiled")
        return costs
    cost_cfg = cfg.cost if str(OmegaConf.select(cfg, "cost.source", default="")) == "profiled" \
        else OmegaConf.load(CONF_DIR / "cost" / "profiled.yaml")
    cost_cfg = OmegaConf.merge(cost_cfg, {"device": rank_links(cfg)["device"]})   # measured where the ranks compute
    return profiled_costs(cost_cfg, model, cluster)


def rank_links(cfg: Any) -> dict[str, str]:
    """The ranks' backend, transport and device, as `execute`'s keywords: `runtime.backend` with
    `runtime.transport` and `runtime.device` resolved (auto: NCCL runs the ordered transport on
    CUDA, gloo the tagged one on the CPU; gloo with device=cuda lets several ranks share a GPU)."""
    from octopipe.runtime.transport import choose_transport
    backend = str(_opt(cfg, "backend", "gloo"))
    transport, device = choose_transport(backend, str(_opt(cfg, "transport", "auto")),
                                         str(_opt(cfg, "device", "auto")))
    return {"backend": backend, "transport": transport, "device": device}


def rank_cores(cfg: Any, n: int, compute: str) -> tuple[int, ...] | None:
    """Each rank's core under `runtime.pin` (auto | true | false), or None when ranks are not
    pinned; emulated compute never pins (its ranks sleep)."""
    from octopipe.runtime.cores import can_pin, core_ids, pin_map
    pin = _opt(cfg, "pin", "auto")
    choice = str(pin).lower()
    if choice not in ("auto", "true", "false"):
        raise ConfigError(f"runtime.pin={pin!r}: choose auto, true or false")
    if choice == "true" and not can_pin():
        raise ConfigError("runtime.pin=true: this platform cannot pin a process to a core "
                          "(no os.sched_setaffinity); use runtime.pin=auto or false")
    if choice == "false" or compute != "real" or not can_pin():
        return None
    return pin_map(n, core_ids())


def _calibration(cfg: Any, model, costs, plan: Plan, partition, dispatch: str, warmup: int,
                 iterations: int, pinned: tuple[int, ...] | None, links: dict, console: Console):
    """The in-situ calibration on `partition` for `plan`'s ranks and micro-batches over `links`
    (backend, transport, device), or None (see the docstring)."""
    from octopipe.runtime.cores import available_cores
    from octopipe.runtime.insitu import calibrate
    if not bool(_opt(cfg, "calibrate", True)):
        return None
    n, m = plan.table.n_devices, plan.table.n_microbatches
    if m < 2:
        console.print(f"[yellow]runtime.calibrate: {m} micro-batch is too few for the calibration run "
                      "(it needs 2); predicting from cost=profiled alone[/yellow]")
        return None
    cal, _ = calibrate(model, costs, n, m, dispatch=dispatch, iterations=iterations, warmup=warmup,
                       seed=int(cfg.get("seed", 0)), cores=available_cores(), pinned=pinned, partition=partition,
                       timeout_s=float(_opt(cfg, "timeout_s", 300)), stall_s=float(_opt(cfg, "stall_s", 30)),
                       **links)
    console.print(f"calibration {cal.name}: {len(cal.partition)} stages on {n} ranks, fitted background "
                  f"load {cal.background:.3f} cores")
    return cal


def run(cfg, out_dir: Path) -> dict:
    from octopipe.run import write_json
    from octopipe.runtime.fidelity import launch, summarise
    from octopipe.runtime.insitu import calibration_partition
    from octopipe.plan import plan_model
    from octopipe.runtime.trace import chrome_trace
    from octopipe.schedule.plan_io import save_plan
    console = Console(width=120)
    compute = str(_opt(cfg, "compute", "real"))
    dispatch = str(_opt(cfg, "dispatch", "ready_first"))
    if compute not in ("real", "emulated"):
        raise ConfigError(f"runtime.compute={compute!r}: choose real or emulated")
    if dispatch not in ("strict", "ready_first"):
        raise ConfigError(f"runtime.dispatch={dispatch!r}: choose strict or ready_first")
    links = rank_links(cfg)
    iterations, warmup = int(_opt(cfg, "iterations", 3)), int(_opt(cfg, "warmup", 1))
    if iterations < 1 or warmup < 0:
        raise ConfigError("runtime.iterations must be >= 1 and runtime.warmup >= 0")
    rank_cores(cfg, int(cfg.pp), compute)       # a bad runtime.pin fails before any work
    model = choose_model(cfg, console)
    costs, sim_cluster = _costs(cfg, model, compute, int(cfg.pp))
    plans = _plans(cfg, model, costs, sim_cluster, compute)
    pins = [rank_cores(cfg, plan.table.n_devices, compute) for plan in plans]
    pinned = pins[0]
    console.print(f"ranks pinned to cores {list(pinned)}" if pinned else "ranks not pinned")
    # per model the plans run (split layers or not) its costs; per (model, ranks, calibration
    # partition) a calibration, all launched before the measured runs
    model_costs: dict = {}
    calibrations: dict = {}
    keys = []
    for plan, pin in zip(plans, pins):
        run_model = plan_model(model, plan)
        if run_model not in model_costs:
            if run_model is not model:
                console.print(f"plan {plan.table.name}: layers split as shards={plan.shards} "
                              f"({model.n_layers} -> {run_model.n_layers} layers)")
            model_costs[run_model] = costs if run_model is model else \
                _cost_table(cfg, run_model, compute, sim_cluster)
        key = (run_model, plan.table.n_devices, calibration_partition(plan))
        if key not in calibrations:
            calibrations[key] = _calibration(cfg, run_model, model_costs[run_model], plan, key[2], dispatch,
                                             warmup, iterations, pin, links, console) \
                if compute == "real" else None
        keys.append(key)
    rows, per = [], {}
    kw = dict(compute=compute, dispatch=dispatch, iterations=iterations, warmup=warmup,
              seed=int(cfg.get("seed", 0)), lr=float(_opt(cfg, "lr", 0.0)),
              step_s=float(_opt(cfg, "emulate_step_s", 0.01)),
              max_message_bytes=float(_opt(cfg, "max_message_bytes", 262144)))
    for plan, key, pin in zip(plans, keys, pins):
        run_model, calibration = key[0], calibrations[key]
        result = launch(run_model, plan, model_costs[run_model], sim_cluster, cpus=pin,
                        timeout_s=float(_opt(cfg, "timeout_s", 300)), stall_s=float(_opt(cfg, "stall_s", 30)),
                        **links, **kw)
        c = summarise(run_model, plan, [result], model_costs[run_model], sim_cluster, calibration=calibration,
                      grad_check=bool(_opt(cfg, "grad_check", True)), **kw)
        per[c.schedule] = {**c.summary(), "calibration": calibration.name if calibration is not None else None,
                           "pinned": list(pin) if pin else None}
        rows.append(c)
        trace = chrome_trace(c.result.events, list(range(warmup, warmup + iterations)))
        name = "trace.json" if len(plans) == 1 else f"trace_{c.schedule}.json"
        write_json(out_dir / name, trace)
        if plan is plans[0]:
            save_plan(plan, out_dir / "plan.json", out_dir / "schedule.csv")
            if len(plans) > 1:
                write_json(out_dir / "trace.json", trace)
    t = Table(title=f"mode=execute: {model.name}, {plans[0].table.n_devices} ranks, {compute} compute, "
                    f"{dispatch}, {plans[0].table.n_microbatches} micro-batches")
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
    console.print(t)
    if any(d["calibration"] for d in per.values()):
        console.print("simulated from: " + ", ".join(f"{name} <- {d['calibration'] or 'cost=profiled'}"
                                                     for name, d in per.items()))
    first = rows[0]
    calibration = calibrations[keys[0]]
    shards = plans[0].shards
    errs = [c.grad_check_max_rel_err for c in rows if c.grad_check_max_rel_err is not None]
    return {"model": model.name, "compute": compute, "dispatch": dispatch, **links,
            "split_layers": {str(k): int(v) for k, v in shards.items()} if shards else None,
            "n_devices": plans[0].table.n_devices, "microbatches": plans[0].table.n_microbatches,
            "measured_iteration_s": first.measured_iteration_s,
            "simulated_iteration_s": first.simulated_iteration_s,
            "fidelity_error": first.fidelity_error,
            "cost_inputs": "calibrated" if calibration is not None else
            ("profiled" if compute == "real" else "modelled"),
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
