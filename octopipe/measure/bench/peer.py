"""Our executor against torch.distributed.pipelining on the same tiny model, backend (gloo),
ranks and micro-batches: 1F1B, interleaved 1F1B and ZB-V side by side, plus the tuned OctoPipe
plan against torch's best schedule.

Both sides time an iteration the same way: from the barrier before it to the moment the last
rank finished it (max over ranks of the end minus min of the start; one monotonic clock), the
median over the measured iterations, after a warm-up iteration (torch infers shapes in its first
step). Every round launches all of them once, in a rotated order, so that a busy machine slows each
alike; `paired_speedup` is the median over rounds of each round's ratio.

    python -m octopipe.measure.bench.peer [--ranks 2 4] [--microbatches 8] [--model tiny_hybrid]

`--train STEPS` compares training instead: the example GPT (examples/tiny_gpt.py, a user's
blocks) trained for STEPS AdamW steps on the same plan (1F1B, interleaved 1F1B, ZB-V and the
tuner's plan on the profiled blocks, after the plan trial `mode=train` runs: `train.trial_steps`)
by our runtime and by torch's `_PipelineScheduleRuntime` running our schedule.csv
(`octopipe.train.torch_runtime`), tokens/s as the median step after
the first; the losses of both are checked equal. The tuner plans on the blocks' profiled costs
with the runtime's host time per action (`runtime.host_time`), as `mode=train` does; a last row
sets the tuned plan on our runtime against torch's fastest schedule on its own. Each row also
gives a ceiling: torch's step against our busiest rank's compute (its actions' spans) stretched by
the plan's own bubble (`work_share`), the ratio an executor of the same actions with no overhead
between them would reach.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.pipelining as pp
import torch.nn.functional as F
from omegaconf import OmegaConf
from torch import nn

from octopipe.cluster import Cluster
from octopipe.config.cost import ProfiledCost
from octopipe.config.runtime import RuntimeConfig
from octopipe.config.train import TrainConfig
from octopipe.cost.profiled import profile_blocks, profiled_costs
from octopipe.cost.table import CostTable
from octopipe.io import CONF_DIR, write_json
from octopipe.layers.batch import microbatch
from octopipe.model.build import build_model
from octopipe.model.spec import ModelSpec
from octopipe.model.user_module import UserBlocks, check_blocks
from octopipe.plan import Partition, Plan, uniform_partition
from octopipe.runtime.host_time import with_host_time
from octopipe.runtime.job import Job
from octopipe.runtime.launch import execute, free_port, process_context
from octopipe.runtime.machine import local_cluster, measure_loopback
from octopipe.runtime.pinning import rank_cores
from octopipe.runtime.stage import StageModule
from octopipe.runtime.worker import keep_heap
from octopipe.schedule.library import build_schedule
from octopipe.sim.simulator import simulate
from octopipe.train.data import TokenBatches, load_corpus
from octopipe.train.loop import TrainSpec, launch_training
from octopipe.train.optim import OptimSettings
from octopipe.train.setup import EXAMPLE_FACTORY
from octopipe.train.torch_runtime import train_with_torch
from octopipe.train.trial import run_trial, trial_candidates
from octopipe.tune.tuner import TuneOptions, tune

TRIAL_STEPS = TrainConfig().trial_steps
PAIRS = (("1f1b", "Schedule1F1B"), ("interleaved", "ScheduleInterleaved1F1B"),
         ("zbv", "ScheduleZBVZeroBubble"))


class PeerStage(nn.Module):
    """Our layers in torch.distributed.pipelining's calling convention: the first stage takes
    token ids, the last returns logits (torch applies the loss)."""

    def __init__(self, model: ModelSpec, lo: int, hi: int, seed: int) -> None:
        super().__init__()
        self.inner = StageModule(model, lo, hi, seed)
        self.first, self.last, self.seq = lo == 0, hi == model.n_layers, model.seq_len

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch = {"ids": x} if self.first else {}
        h = None if self.first else x
        layers = list(self.inner.layers.values())
        for layer in layers[:-1] if self.last else layers:
            h = layer(h, batch)
        return layers[-1].logits(h, self.seq) if self.last else h


def _loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


def torch_job(model: ModelSpec, schedule: str, world: int, m: int, iterations: int) -> Job:
    """The Job of torch's `schedule` (a class of torch.distributed.pipelining, one of PAIRS) on
    `world` ranks: our table of the same schedule, whose placement says where each stage lives,
    the even partition, `iterations` iterations of `m` micro-batches."""
    table = build_schedule({theirs: ours for ours, theirs in PAIRS}[schedule], world, m)
    plan = Plan(uniform_partition(model.n_layers, table.n_stages), table, model.name)
    return Job(plan, model, RuntimeConfig(iterations=iterations, warmup=0, timeout_s=600))


def _torch_rank(rank: int, job: Job, schedule: str, port: int, out: str, heap: bool = False) -> None:
    if heap:
        keep_heap()
    torch.set_num_threads(1)
    world, m, table = job.plan.table.n_devices, job.plan.table.n_microbatches, job.plan.table
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    model, part = job.model, job.plan.partition
    stages = [pp.PipelineStage(PeerStage(model, *part[s], seed=job.seed), s, table.n_stages, torch.device("cpu"))
              for s in table.stages_of(rank)]
    cls = getattr(pp, schedule)
    sched = cls(stages if len(stages) > 1 else stages[0], n_microbatches=m, loss_fn=_loss)
    mbs = [microbatch(model, job.seed, 0, j) for j in range(m)]
    ids = torch.cat([b["ids"] for b in mbs])
    target = torch.cat([b["targets"] for b in mbs])
    held = set(table.stages_of(rank))
    args = (ids,) if 0 in held else ()                  # inputs only where stage 0 lives,
    kwargs = {"target": target} if table.n_stages - 1 in held else {}   # targets where the loss is
    marks = []
    for _ in range(job.total_iterations):
        for st in stages:
            st.submod.zero_grad(set_to_none=True)
        dist.barrier()
        t0 = time.perf_counter()
        sched.step(*args, **kwargs)
        marks.append((t0, time.perf_counter()))
    Path(out, f"torch{rank}.json").write_text(json.dumps(marks))
    dist.barrier()
    dist.destroy_process_group()


def run_torch(job: Job, schedule: str, heap: bool = False) -> list[float]:
    """Per-iteration wall seconds of torch's `schedule` running `job` (see `torch_job`) on gloo
    ranks; `heap`: with the heap setting our ranks use (`worker.keep_heap`)."""
    world, iterations = job.plan.table.n_devices, job.total_iterations
    ctx = process_context()
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        procs = [ctx.Process(target=_torch_rank, args=(r, job, schedule, port, tmp, heap)) for r in range(world)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=600)
        if any(p.exitcode != 0 for p in procs):
            raise RuntimeError(f"torch {schedule} failed on {world} ranks (exit codes "
                               f"{[p.exitcode for p in procs]})")
        marks = [json.loads(Path(tmp, f"torch{r}.json").read_text()) for r in range(world)]
    return [max(mk[it][1] for mk in marks) - min(mk[it][0] for mk in marks) for it in range(iterations)]


def run_ours(job: Job) -> list[float]:
    """Per-iteration wall seconds of our executor running `job`."""
    return execute(job).wall_s


def tuned_plan(model: ModelSpec, world: int, m: int, budget_s: float) -> Plan:
    """The tuner's plan for this machine: profiled costs, measured loopback link."""
    link = measure_loopback(cache=Path("runs/cache/loopback_link.json"))
    cluster = local_cluster(world, link)
    cost_cfg = OmegaConf.merge(OmegaConf.load(CONF_DIR / "cost" / "profiled.yaml"), {"device": "cpu"})
    costs = profiled_costs(cost_cfg, model, cluster)
    res = tune(costs, cluster, world, m, TuneOptions({"time_budget_s": budget_s}, model=model.name))
    return res.plan


def _median(xs: list[float]) -> float:
    return float(np.median(xs))


def compare_at(model: ModelSpec, world: int, m: int, config: RuntimeConfig, rounds: int,
               tune_budget_s: float, torch_keep_heap: bool = False) -> list[dict]:
    """Every round launches each of our schedules, each of torch's and the tuned plan once, in an
    order rotated from round to round, so load that drifts during the run falls on all of them;
    each launch runs `config.iterations` iterations, each figure is the median of its measured ones
    (the first of a launch is discarded), and `paired` the median over rounds of the per-round
    ratio torch / ours."""
    runs: dict[str, tuple[str, Job]] = {}
    for ours_name, torch_name in PAIRS:
        theirs = torch_job(model, torch_name, world, m, config.iterations)
        runs[ours_name] = ("ours", replace(theirs, config=config))
        runs[torch_name] = (torch_name, theirs)
    plan = tuned_plan(model, world, m, tune_budget_s) if tune_budget_s > 0 else None
    if plan is not None:
        runs["tuned"] = ("ours", Job(plan, model, config))
    names = list(runs)
    times: dict[str, list[list[float]]] = {k: [] for k in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            side, job = runs[name]
            got = run_ours(job) if side == "ours" else run_torch(job, side, torch_keep_heap)
            times[name].append(got[1:])
    med = {k: _median([x for rnd in v for x in rnd]) for k, v in times.items()}
    paired = lambda a, b: _median([_median(tb) / _median(ta) for ta, tb in zip(times[a], times[b])])
    rows = []
    for ours_name, torch_name in PAIRS:
        rows.append({"ranks": world, "schedule": ours_name, "torch_class": torch_name, "octopipe_s": med[ours_name],
                     "torch_s": med[torch_name], "speedup": med[torch_name] / med[ours_name],
                     "paired_speedup": paired(ours_name, torch_name)})
        print(f"{world} ranks  {ours_name:12s} octopipe {med[ours_name]:.4f} s   torch {torch_name:24s} "
              f"{med[torch_name]:.4f} s   torch/ours = {rows[-1]['speedup']:.2f}x "
              f"(per round {rows[-1]['paired_speedup']:.2f}x)", flush=True)
    if plan is not None:
        best = min((t for _, t in PAIRS), key=lambda t: med[t])
        rows.append({"ranks": world, "schedule": "octopipe (tuned)", "torch_class": best, "octopipe_s": med["tuned"],
                     "torch_s": med[best], "speedup": med[best] / med["tuned"], "paired_speedup": paired("tuned", best),
                     "partition": [list(p) for p in plan.partition], "placement": list(plan.placement),
                     "tuned_origin": plan.meta.get("origin", "")})
        print(f"{world} ranks  tuned plan   octopipe {med['tuned']:.4f} s   torch best {best:21s} "
              f"{med[best]:.4f} s   torch/ours = {rows[-1]['speedup']:.2f}x (per round "
              f"{rows[-1]['paired_speedup']:.2f}x; {rows[-1]['tuned_origin']})", flush=True)
    return rows


def busiest_rank_s(record: dict) -> float:
    """A training step's seconds of compute on its busiest rank (its actions' spans: the step less
    that rank's idle share), the least any executor of the same actions could take for it."""
    return (1.0 - min(record["idle_share"])) * record["step_s"]


def work_share(plan: Plan, costs: CostTable, cluster: Cluster) -> float:
    """The share of a simulated iteration of `plan` its busiest device computes: what is left
    is the plan's own bubble, which no executor of the plan can fill."""
    sim = simulate(plan, costs, cluster)
    return float(np.max(sim.busy) / sim.makespan)


def _training_job(blocks: UserBlocks, plan: Plan, data: TokenBatches, dispatch: str) -> Job:
    """Our runtime's training job of `plan`, its ranks pinned as mode=train pins them (runtime.pin)."""
    config = RuntimeConfig(dispatch=dispatch, timeout_s=1800, stall_s=300)
    return Job(plan, blocks, config, data=data, pinned=rank_cores(config, plan.table.n_devices))


def _ours_training(blocks: UserBlocks, plan: Plan, data: TokenBatches, optim: OptimSettings, steps: int,
                   dispatch: str) -> tuple[list[float], float, float]:
    """Losses, median tokens/s and median busiest-rank seconds of the steps after the first."""
    with tempfile.TemporaryDirectory() as tmp:
        run = launch_training(_training_job(blocks, plan, data, dispatch), TrainSpec(optim, steps), tmp)
    rest = run.records[1:]
    return run.losses, _median([r["tokens_per_s"] for r in rest]), _median([busiest_rank_s(r) for r in rest])


def compare_training(world: int, m: int, steps: int, rounds: int, dispatch: str,
                     tune_budget_s: float, torch_pin: bool) -> list[dict]:
    """Tokens/s of training steps, ours and torch's runtime, on the same plans (see the module
    docstring); per-round ratios are paired as in `compare_at`. `torch_pin`: torch's ranks pinned
    to the cores ours are (compares the executors alone)."""
    blocks = check_blocks(UserBlocks(EXAMPLE_FACTORY, 64, 4, 256))
    data = TokenBatches(load_corpus(""), blocks.seq_len, blocks.micro_batch_size, seed=0)
    optim = OptimSettings(total_steps=steps)
    plans = {}
    for name, _ in PAIRS:
        table = build_schedule(name, world, m)
        plans[name] = Plan(Partition.uniform(blocks.n_blocks, table.n_stages), table, "tiny_gpt")
    cluster = local_cluster(world, measure_loopback(cache=Path("runs/cache/loopback_link.json")))
    cost, trial_record = ProfiledCost(device="cpu", cache_dir=""), None
    costs = with_host_time(profile_blocks(blocks, cost, cluster), blocks, cost)
    if tune_budget_s > 0:
        res = tune(costs, cluster, world, m, TuneOptions({"time_budget_s": tune_budget_s}, model="tiny_gpt"))
        plans["octopipe"] = res.plan
        candidates = trial_candidates(res, TRIAL_STEPS)
        if candidates:          # as mode=train does: the tuner's plan against the fastest named schedule
            trial = run_trial(candidates, lambda plan: _training_job(blocks, plan, data, dispatch),
                              TrainSpec(optim, steps), TRIAL_STEPS)
            print(trial.line(), flush=True)
            plans["octopipe"] = candidates[trial.chosen][1]
            trial_record = trial.record()
    shares = {name: work_share(plan, costs, cluster) for name, plan in plans.items()}
    cores = rank_cores(RuntimeConfig(), world) if torch_pin else None
    speed: dict[tuple[str, str], list[float]] = {}
    for r in range(rounds):
        names = list(plans)
        for name in names[r % len(names):] + names[:r % len(names)]:
            ours_losses, ours, busy = _ours_training(blocks, plans[name], data, optim, steps, dispatch)
            theirs_run = train_with_torch(blocks, plans[name], data, optim, steps, cores=cores)
            if max(abs(a - b) / b for a, b in zip(ours_losses, theirs_run.losses)) > 1e-5:
                raise RuntimeError(f"{name}: our losses and torch's differ")
            speed.setdefault((name, "ours"), []).append(ours)
            speed.setdefault((name, "torch"), []).append(_median([x["tokens_per_s"] for x in theirs_run.records[1:]]))
            torch_step = _median([x["step_s"] for x in theirs_run.records[1:]])
            speed.setdefault((name, "ceiling"), []).append(torch_step * shares[name] / busy)
    rows = []
    for name in plans:
        o, t = speed[(name, "ours")], speed[(name, "torch")]
        rows.append({"ranks": world, "schedule": name, "octopipe_tokens_per_s": _median(o),
                     "torch_tokens_per_s": _median(t), "paired_speedup": _median([a / b for a, b in zip(o, t)]),
                     "ceiling": _median(speed[(name, "ceiling")]),
                     "partition": [list(r) for r in plans[name].partition.ranges],
                     "placement": list(plans[name].placement), "steps": steps,
                     **({"plan_trial": trial_record} if name == "octopipe" and trial_record else {})})
        print(f"{world} ranks  train {name:12s} octopipe {_median(o):9,.0f} tok/s   torch runtime "
              f"{_median(t):9,.0f} tok/s   ours/torch = {rows[-1]['paired_speedup']:.2f}x "
              f"(ceiling {rows[-1]['ceiling']:.2f}x)", flush=True)
    if "octopipe" in plans:         # what a user gains: the tuned plan here against torch's best schedule there
        best = max((n for n, _ in PAIRS), key=lambda n: _median(speed[(n, "torch")]))
        o, t = speed[("octopipe", "ours")], speed[(best, "torch")]
        rows.append({"ranks": world, "schedule": "octopipe vs torch's best", "torch_schedule": best,
                     "octopipe_tokens_per_s": _median(o), "torch_tokens_per_s": _median(t),
                     "paired_speedup": _median([a / b for a, b in zip(o, t)]), "steps": steps})
        print(f"{world} ranks  train tuned plan   octopipe {_median(o):9,.0f} tok/s   torch's best ({best}) "
              f"{_median(t):9,.0f} tok/s   ours/torch = {rows[-1]['paired_speedup']:.2f}x", flush=True)
    return rows


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--model", default="tiny_hybrid")
    ap.add_argument("--dispatch", default="strict", choices=["strict", "ready_first"])
    ap.add_argument("--tune-budget-s", type=float, default=20.0)
    ap.add_argument("--torch-keep-heap", action="store_true",
                    help="give torch's ranks the heap setting ours use (worker.keep_heap), to compare the "
                         "executors alone")
    ap.add_argument("--torch-pin", action="store_true",
                    help="--train: pin torch's ranks to the cores ours are pinned to (our runtime pins, "
                         "runtime.pin=auto; torch's launchers do not), to compare the executors alone")
    ap.add_argument("--out", default="runs/bench")
    ap.add_argument("--train", type=int, default=0, metavar="STEPS",
                    help="compare training steps of the example GPT instead (our runtime vs torch's)")
    args = ap.parse_args(argv)
    if args.train:
        rows = [row for world in args.ranks for row in
                compare_training(world, args.microbatches, args.train, args.rounds, args.dispatch,
                                 args.tune_budget_s, args.torch_pin)]
        doc = {"model": EXAMPLE_FACTORY, "microbatches": args.microbatches, "dispatch": args.dispatch,
               "backend": "gloo", "cores": os.cpu_count(), "torch_pin": args.torch_pin, "rows": rows}
        Path(args.out).mkdir(parents=True, exist_ok=True)
        write_json(Path(args.out) / "train_peer.json", doc)
        return doc
    model = build_model(OmegaConf.load(CONF_DIR / "model" / f"{args.model}.yaml"))
    config = RuntimeConfig(dispatch=args.dispatch, iterations=args.iterations + 1, warmup=0, timeout_s=600)
    rows = []
    for world in args.ranks:
        rows += compare_at(model, world, args.microbatches, config, args.rounds, args.tune_budget_s,
                           args.torch_keep_heap)
    doc = {"model": model.name, "microbatches": args.microbatches, "dispatch": args.dispatch,
           "backend": "gloo", "cores": os.cpu_count(), "torch_keep_heap": args.torch_keep_heap, "rows": rows}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "runtime_peer.json", doc)
    return doc


if __name__ == "__main__":
    main()
