"""The training loop on the runtime's ranks, and the single-process reference it equals.

A step is one pipeline iteration (the table's micro-batches, gradients accumulated as their
mean), then AdamW on every stage after clipping by the global norm. Rank 0 appends each step's
loss, learning rate, norm and tokens/s to `progress.jsonl`, which the launcher follows for the
progress bar. Checkpoints every `checkpoint_every` steps (and at the end) through
`octopipe.train.checkpoint`.
"""
from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from octopipe.errors import TrainingDiverged
from octopipe.model.user_module import UserBlocks
from octopipe.runtime.hf_tensor_parallel import HFTPBlocks
from octopipe.runtime.job import Job
from octopipe.runtime.launch import launch
from octopipe.runtime.memory import optimizer_bytes
from octopipe.runtime.rank_job import RankJob
from octopipe.runtime.stage import StageModule, as_blocks
from octopipe.runtime.tensor_parallel import assemble, rank_shards, replicated
from octopipe.runtime.worker import Rank, join
from octopipe.train import checkpoint, tp_checkpoint
from octopipe.train.optim import OptimSettings, StageOptimizers, lr_at
from octopipe.train.stream import AdamWUpdate, Stream, step_losses
from octopipe.train.tied import ModelNames, TiedGrads


@dataclass(frozen=True)
class TrainSpec:
    """The training a launch runs beside its runtime `Job`: steps `start .. steps-1` with
    `optim`, checkpointing into `checkpoint_dir` every `checkpoint_every` steps (0: never) with
    `meta` (fingerprints) and the plan's JSON."""

    optim: OptimSettings
    steps: int
    start: int = 0
    resume: str = ""
    checkpoint_every: int = 0
    checkpoint_dir: str = ""
    meta: dict = field(default_factory=dict)
    plan_json: str = ""
    stream: Stream | None = None     # asynchronous (schedule=pipedream*): the one stream it trains


@dataclass(frozen=True)
class TrainRankJob:
    """What every training rank runs: the runtime's resolved `rank` job and the `train` spec."""

    rank: RankJob
    train: TrainSpec


def _local_tensors(worker: Rank, opt: StageOptimizers) -> dict[str, torch.Tensor]:
    """This rank's parameters and AdamW state under its stage names (`model.<n>`, `optim.<n>.<state>`)."""
    return {**{f"model.{n}": p for c, mod in sorted(worker.compute.copies.items()) if c[0] == 0
               for n, p in mod.named_parameters()}, **opt.state_tensors()}


def _stage_tensors(worker: Rank, opt: StageOptimizers, names: ModelNames) -> dict[str, torch.Tensor]:
    """This rank's checkpoint tensors under the model's names: `model.<name>` and
    `optim.<name>.<state>` (the same on any plan, so that a checkpoint outlives it; a TP rank's
    slices put back together with its TP group's: collective)."""
    if worker.blocks is not None:
        return tp_checkpoint.whole_tensors(worker, _local_tensors(worker, opt), names)
    out = {f"model.{names(n)}": p for c, mod in sorted(worker.compute.copies.items()) if c[0] == 0
           for n, p in mod.named_parameters()}
    for key, t in opt.state_tensors().items():
        name, _, state = key[len("optim."):].rpartition(".")
        out[f"optim.{names(name)}.{state}"] = t
    return out


def _restore(worker: Rank, opt: StageOptimizers, path: str, names: ModelNames) -> None:
    """Fill every copy's parameters and AdamW state from checkpoint `path` (any plan's)."""
    if worker.blocks is not None:       # TP: whole tensors read, this rank's slices kept
        local = _local_tensors(worker, opt)
        mine = tp_checkpoint.take(worker, local, checkpoint.load(path, tp_checkpoint.template(worker, local, names)),
                                  names)
        with torch.no_grad():
            for _, mod in sorted(worker.compute.copies.items()):
                for n, p in mod.named_parameters():
                    p.copy_(mine[f"model.{n}"])
        opt.load_state_tensors({k: v for k, v in mine.items() if k.startswith("optim.")})
        return
    loaded = checkpoint.load(path, _stage_tensors(worker, opt, names))
    with torch.no_grad():
        for _, mod in sorted(worker.compute.copies.items()):
            for n, p in mod.named_parameters():
                p.copy_(loaded[f"model.{names(n)}"])
    state = {}
    for key in opt.state_tensors():
        name, _, st = key[len("optim."):].rpartition(".")
        state[key] = loaded[f"optim.{names(name)}.{st}"]
    opt.load_state_tensors(state)


def _final_params(worker: Rank, names: ModelNames, replica0: bool = True) -> dict[str, torch.Tensor]:
    return {names(n): p.detach().cpu().clone() for c, mod in sorted(worker.compute.copies.items())
            if c[0] == 0 or not replica0 for n, p in mod.named_parameters()}


def _my_loss(worker: Rank) -> float:
    """This rank's share of the step's loss sum (a TP rank's copy of the loss counted once)."""
    return sum(v for _, v in sorted(worker.compute.losses.items())) if worker.trank == 0 else 0.0


def _uncounted(worker: Rank) -> set[int]:
    """Ids of this rank's parameters another rank counts in the global norm: those whose averaged
    gradient every replica holds, on replicas but the first; on TP ranks but the first, the
    parameters every TP rank holds whole."""
    out = worker.grad_sync.counted_elsewhere() if worker.grad_sync is not None else set()
    if worker.trank > 0 and isinstance(worker.blocks, HFTPBlocks):
        out |= worker.blocks.replicated(worker.compute.copies.values())
    elif worker.trank > 0:
        out |= replicated(worker.compute.copies.values(), worker.blocks, worker.job.seed)
    return out


def _blocks_of(worker: Rank, stage: int) -> str:
    lo, hi = worker.job.partition[stage]
    return f"stage {stage} (block{'s' if hi - lo > 1 else ''} {lo}{'-' + str(hi - 1) if hi - lo > 1 else ''})"


def _health(worker: Rank, opt: StageOptimizers, step: int) -> tuple[dict | None, float, float]:
    """Collective, one all-reduce: the step's mean loss over every replica's micro-batches, and
    (None, the gradient's global sum of squares) when that loss, every forward output and every
    gradient are finite; else where the first non-finite value arose: the first stage whose
    forward output was, else the last stage whose gradient was (a backward runs from the last
    stage down). The sum of squares is the clipping norm's, reduced once."""
    compute, n = worker.compute, worker.table.n_stages
    v = torch.zeros(2 * n + 1, dtype=torch.float64)
    for s, flags in compute.output_finite.items():
        v[s] = float(not bool(torch.stack(flags).all()))
    for s, sq in opt.stage_squares().items():
        v[n + s] += sq
    v[2 * n] = _my_loss(worker)
    dist.all_reduce(v)
    loss = float(v[2 * n]) / (worker.table.n_microbatches * worker.job.dp)
    bad_out = [s for s in range(n) if v[s] != 0]
    bad_grad = [s for s in range(n) if not math.isfinite(float(v[n + s]))]
    if math.isfinite(loss) and not bad_out and not bad_grad:
        return None, float(v[n:2 * n].sum()), loss
    if bad_out:
        where = f"{_blocks_of(worker, bad_out[0])} is the first whose forward output is not finite"
    elif not math.isfinite(loss):
        where = f"{_blocks_of(worker, n - 1)} computed it"
    else:
        where = f"{_blocks_of(worker, bad_grad[-1])} is the first whose gradient is not finite"
    return {"step": step + 1, "loss": loss, "stage": bad_out[0] if bad_out else (
        n - 1 if not math.isfinite(loss) else bad_grad[-1]), "where": where}, math.nan, loss


def _idle_shares(worker: Rank, rank: int, step: int, dt: float) -> list[float]:
    """Collective: each rank's share of step `step` spent not computing (its actions' time
    against the step's wall time)."""
    busy = sum(e["end"] - e["start"] for e in worker.events if e.get("it") == step and "action" in e)
    shares = torch.zeros(dist.get_world_size(), dtype=torch.float64)
    shares[rank] = max(0.0, 1.0 - busy / dt) if dt > 0 else 0.0
    dist.all_reduce(shares)
    return [round(float(x), 6) for x in shares]


def _iteration_wall(worker: Rank, step: int) -> float:
    """Collective: step `step`'s pipeline iteration, from the first rank's start to the last
    rank's end (the ranks share one clock: they run on one machine, or the spread is theirs)."""
    marks = [e for e in worker.events if e.get("it") == step and "begin" in e]
    v = torch.tensor([-marks[0]["begin"], marks[0]["finish"]], dtype=torch.float64)
    dist.all_reduce(v, op=dist.ReduceOp.MAX)
    return float(v[0] + v[1])


def _record(out: Path, rec: dict) -> None:
    with open(out / "progress.jsonl", "a") as f:
        f.write(json.dumps(rec) + "\n")


def _train_async(rank: int, job: TrainRankJob, worker: Rank, out: Path) -> dict:
    """One stream of job.train.stream: AdamW per backward (or window) through the stash, no flush;
    the rank holding the last stage logs each step once its last micro-batch is through."""
    st, compute = job.train.stream, worker.compute
    opt = StageOptimizers(compute.copies, job.train.optim)
    names = ModelNames.of(job.rank.model, job.rank.seed)
    if job.train.resume:
        _restore(worker, opt, job.train.resume, names)
        for (_, s), mod in compute.copies.items():
            compute.weights.bind(s, mod)
    m, last = st.microbatches, st.stages - 1
    tokens = m * job.rank.compute.data.batch(0, 0)["ids"].numel()
    clock = [time.perf_counter()]

    def on_update(stage: int, u: int, norm: float) -> None:
        done = (u + 1) * st.window
        if stage != last or done % m:
            return
        step = st.start + done // m - 1
        now = time.perf_counter()
        dt, clock[0] = now - clock[0], now
        loss = sum(compute.losses[k] for k in range(done - m, done)) / m
        _record(out, {"step": step + 1, "loss": loss, "lr": lr_at(job.train.optim, step), "grad_norm": norm,
                      "step_s": dt, "tokens_per_s": tokens / dt})
    compute.weights.update = AdamWUpdate(opt, st, on_update)
    worker.events = []
    worker.iteration(0)
    mb = torch.zeros(st.length, dtype=torch.float64)
    for k, v in compute.losses.items():
        mb[k] = v
    dist.all_reduce(mb)
    saved, bad = "", [k for k, v in enumerate(mb.tolist()) if not math.isfinite(v)]
    if bad:
        step = st.start + bad[0] // m
        return {"diverged": {"step": step + 1, "loss": float(mb[bad[0]]), "stage": st.stages - 1,
                             "where": f"micro-batch {bad[0] % m} of the stream's step {step + 1}"},
                "checkpoint": job.train.resume, "losses": [], "params": {}, "events": []}
    if job.train.checkpoint_every:
        saved = str(checkpoint.save(job.train.checkpoint_dir, job.train.steps, _stage_tensors(worker, opt, names),
                                    job.train.meta,
                                    {"plan.json": job.train.plan_json} if job.train.plan_json else None))
    losses = {k: float(v) for k, v in enumerate(mb.tolist())}
    params = _final_params(worker, names, replica0=False)
    return {"losses": step_losses(losses, m), "params": params, "checkpoint": saved, "events": worker.events,
            "microbatch_losses": losses}


def _train(rank: int, job: TrainRankJob, worker: Rank, out: Path) -> dict:
    if job.train.stream is not None:
        return _train_async(rank, job, worker, out)
    sync = worker.grad_sync
    names = ModelNames.of(job.rank.model, job.rank.seed)
    tied = TiedGrads(job.rank.model, job.rank.seed, job.rank.partition, worker.table, rank, worker.compute.copies,
                     worker.grid)
    tied.check_equal(rank)
    if sync is not None:
        sync.keep_whole({id(p) for e in tied.entries for p in e.copies})
    opt = StageOptimizers(worker.compute.copies, job.train.optim, distributed=True,
                          owned=sync.owned() if sync is not None else None)
    opt.uncounted = tied.uncounted | _uncounted(worker)
    if job.train.resume:
        _restore(worker, opt, job.train.resume, names)
    table = worker.table
    tokens = job.rank.dp * table.n_microbatches * job.rank.compute.data.batch(job.train.start, 0)["ids"].numel()
    losses, saved = [], job.train.resume
    worker.compute.check_finite = True
    for step in range(job.train.start, job.train.steps):
        t0 = time.perf_counter()
        worker.events = []
        worker.compute.metering = step + 1 == job.train.steps    # the memory figure is the last step's
        worker.iteration(step)
        tied.sum()
        diverged, squares, loss = _health(worker, opt, step)
        if diverged is not None:        # stop before the update: the weights stay those of the last good step
            return {"diverged": diverged, "checkpoint": saved, "losses": losses, "params": {}, "events": []}
        norm = opt.step(step, squares)
        if sync is not None:
            sync.gather_params()
        dt = time.perf_counter() - t0
        losses.append(loss)
        last = step + 1 == job.train.steps
        if job.train.checkpoint_every and ((step + 1) % job.train.checkpoint_every == 0 or last):
            saved = str(checkpoint.save(job.train.checkpoint_dir, step + 1, _stage_tensors(worker, opt, names),
                                        job.train.meta,
                                          {"plan.json": job.train.plan_json} if job.train.plan_json else None))
        idle = _idle_shares(worker, rank, step, dt)
        wall = _iteration_wall(worker, step)
        if rank == 0:
            _record(out, {"step": step + 1, "loss": loss, "lr": lr_at(job.train.optim, step), "grad_norm": norm,
                          "step_s": dt, "iteration_s": wall, "tokens_per_s": tokens / dt, "idle_share": idle})
    copies = {e.tie.name: [p.detach().cpu().clone() for p in e.copies] for e in tied.entries}
    memory = {"saved_peak_bytes": int(worker.compute.saved_peak_bytes),     # the last step's
              "state_bytes": int(worker.compute.state_bytes()) + sum(optimizer_bytes(o) for o in opt.opts.values())}
    if isinstance(worker.blocks, HFTPBlocks):       # TP: this rank's shards, made whole by `gather`
        shards, params = worker.blocks.shards(worker.compute.copies.values(), names), {}
    elif worker.blocks is not None:
        shards = rank_shards(worker.compute.copies.values(), worker.blocks, job.rank.seed, lambda p: p)
        params: dict = {}
    else:
        shards, params = {}, _final_params(worker, names)
    return {"losses": losses, "params": params, "param_shards": shards, "tied_copies": copies, "memory": memory,
            "checkpoint": saved if saved != job.train.resume else "", "events": worker.events}


def train_rank(rank: int, job: TrainRankJob, control) -> None:
    """One training rank from process start to its rank<R>.pt (the process group is joined
    here unless torchrun's entry joined it already)."""
    join(rank, job.rank)
    worker = Rank(job.rank, rank, control)
    out = Path(job.rank.result_dir)
    doc = _train(rank, job, worker, out)
    torch.save(doc, out / f"rank{rank}.pt")
    dist.barrier()
    control.finished(rank)


@dataclass
class TrainRun:
    """What a training launch gave: the mean loss of each step run, the final parameters of
    every stage (names as the single-process model's), the last checkpoint written."""

    losses: list[float]
    params: dict[str, torch.Tensor]
    checkpoint: str
    records: list[dict]
    events: list[list[dict]] = field(default_factory=list)
    microbatch_losses: dict[int, float] = field(default_factory=dict)   # asynchronous: the stream's
    tied_equal: bool | None = None     # whether every copy of each shared parameter ended equal (None: none)
    memory: list[dict] = field(default_factory=list)   # per rank: the last step's saved-activation peak, state


def follow(path: Path, on_step: Callable[[dict], None], stop: threading.Event) -> None:
    """Call `on_step` on each record rank 0 appends to `path`, until `stop` (then the rest)."""
    seen = 0
    while True:
        done = stop.is_set()
        if path.exists():
            lines = path.read_text().splitlines()
            for line in lines[seen:]:
                on_step(json.loads(line))
            seen = len(lines)
        if done:
            return
        time.sleep(0.2)


def diverged_error(d: dict, checkpoint_every: int) -> TrainingDiverged:
    """The one line a run stopped at a non-finite value ends with."""
    kept = (f"the last good checkpoint is {d['checkpoint']} (train.resume= continues from it)" if d["checkpoint"]
            else "no checkpoint was saved before it" + ("" if checkpoint_every else " (train.checkpoint_every=0)"))
    grad = "" if not math.isfinite(d["loss"]) else " but a gradient is not finite"
    return TrainingDiverged(f"training stopped at step {d['step']}: the loss is {d['loss']}{grad}"
                            f"; {d['where']}; {kept}; lower train.lr or train.clip_norm, or check the model")


def gather(out: Path, world: int, checkpoint_every: int = 0) -> TrainRun:
    """The rank files of a finished training launch in `out` as one TrainRun (TrainingDiverged
    when the ranks stopped at a non-finite loss or gradient)."""
    docs = [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(world)]
    if docs[0].get("diverged"):
        raise diverged_error({**docs[0]["diverged"], "checkpoint": docs[0]["checkpoint"]}, checkpoint_every)
    params: dict[str, torch.Tensor] = {}
    for d in docs:
        params.update(d["params"])
    if any(d.get("param_shards") for d in docs):
        params.update(assemble(d["param_shards"] for d in docs if d.get("param_shards")))
    path = out / "progress.jsonl"
    records = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
    copies: dict[str, list[torch.Tensor]] = {}
    for d in docs:
        for name, ts in d.get("tied_copies", {}).items():
            copies.setdefault(name, []).extend(ts)
    equal = all(torch.equal(ts[0], t) for ts in copies.values() for t in ts[1:]) if copies else None
    return TrainRun(docs[0]["losses"], params, docs[0]["checkpoint"], records, [d["events"] for d in docs],
                    docs[0].get("microbatch_losses", {}), equal, [d.get("memory", {}) for d in docs])


def launch_training(job: Job, spec: TrainSpec, result_dir: str,
                    on_step: Callable[[dict], None] | None = None) -> TrainRun:
    """Train `spec` on `job` through the runtime's one route (`launch`: the same checks and
    process loop as `mode=execute`), one local process per rank writing into `result_dir`
    (which must exist); `on_step` sees each step's record as rank 0 writes it."""
    out = Path(result_dir)
    stop = threading.Event()
    follower = threading.Thread(target=follow, args=(out / "progress.jsonl", on_step, stop), daemon=True) \
        if on_step else None
    if follower:
        follower.start()
    try:
        launch(job, result_dir, train_rank, partial(TrainRankJob, train=spec))
    finally:
        stop.set()
        if follower:
            follower.join()
    return gather(out, job.world, spec.checkpoint_every)


def _reference_model(blocks, seed: int) -> tuple[nn.Module, Callable[[dict], torch.Tensor]]:
    """The model a single process trains: a user's factory output as the factory returned it
    (called afresh, its shared parameters shared: not the runtime's per-stage copies), or a
    preset's layers as one stage; and its loss on a batch."""
    if isinstance(blocks, UserBlocks):
        raw, loss_fn = blocks.fresh(seed)

        def loss(batch: dict) -> torch.Tensor:
            x = batch["ids"]
            for block in raw:
                x = block(x)
            return loss_fn(x, batch["targets"])
        return nn.Sequential(*raw), loss
    full = StageModule(blocks, 0, as_blocks(blocks).n_blocks, seed)
    return full, lambda batch: full(None, batch)


def reference_train(blocks, batches, n_microbatches: int, optim: OptimSettings, steps: int,
                    seed: int = 0, autocast: torch.dtype | None = None) -> TrainRun:
    """The same training in one process: the whole model at once, micro-batches in order, the
    mean loss's gradient, the same AdamW, schedule and clipping; final weights under the model's
    names."""
    model, loss_of = _reference_model(blocks, seed)
    opt = StageOptimizers({(0, 0): model}, optim)
    losses = []
    for step in range(steps):
        model.zero_grad(set_to_none=True)
        total = 0.0
        for m in range(n_microbatches):
            batch = batches.batch(step, m)
            with torch.autocast("cpu", dtype=autocast, enabled=autocast is not None):
                loss = loss_of(batch)
            (loss / n_microbatches).backward()
            total += float(loss.detach())
        losses.append(total / n_microbatches)
        opt.step(step)
    params = {k: p.detach().clone() for k, p in model.named_parameters()}
    return TrainRun(losses, params, "", [])
