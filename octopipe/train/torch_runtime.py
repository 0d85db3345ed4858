"""The same training on torch's own runtime, from our plan: torch.distributed.pipelining
`PipelineStage`s built from the same user blocks, our `schedule.csv` run through
`_PipelineScheduleRuntime` (the path torchtitan's `pipeline_parallel_schedule_csv` takes), the
same micro-batches, AdamW, schedule and clipping (`octopipe.train.optim`).

What torch can run: a user's blocks (torch applies the loss to the last stage's logits), any
partition (even or not) and any stage -> rank map the CSV implies, with F, B, I and W actions.
What needs OctoPipe's runtime: a preset's layers whose head computes the loss inside (and their
split layers, whose pieces hand on a wider carry), Chimera-style replicas (a stage on two ranks),
and ready-first dispatch (torch runs each row in order).
"""
from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

from octopipe.errors import ScheduleError
from octopipe.model.user_module import UserBlocks
from octopipe.plan import Plan
from octopipe.runtime.launch import free_port, run_ranks
from octopipe.runtime.stage import StageModule
from octopipe.schedule.csv_io import write_csv
from octopipe.train.loop import TrainRun
from octopipe.train.optim import OptimSettings, StageOptimizers
from octopipe.train.tied import ModelNames, cross_stage_ties


class TorchStage(nn.Module):
    """Blocks lo..hi-1 in torch's convention (one tensor in, one out; the last returns logits),
    with the parameter names of our stages (`layers.<j>.inner.<...>`)."""

    def __init__(self, blocks: UserBlocks, lo: int, hi: int, seed: int) -> None:
        super().__init__()
        self.layers = StageModule(blocks, lo, hi, seed).layers

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.layers.values():
            x = block.inner(x)
        return x


def check_torch_plan(blocks, plan: Plan) -> None:
    """ScheduleError for what torch's runtime cannot run (see the module docstring)."""
    if not isinstance(blocks, UserBlocks):
        raise ScheduleError("torch's runtime runs a user's blocks (model=module); a preset's head computes "
                            "its loss inside")
    ties = cross_stage_ties(blocks, 0, plan.partition.ranges)
    if ties:
        raise ScheduleError(f"parameter {ties[0][0].name} is shared by stages {list(ties[0][1])}; torch's runtime "
                            f"would train a copy per stage: run it on OctoPipe's runtime, which keeps it one")
    if plan.table.replicas:
        raise ScheduleError(f"plan {plan.table.name!r} holds a stage on several ranks (replicas); torch's "
                            f"runtime needs one rank per stage")


def _rank(rank: int, payload: tuple, control) -> None:
    blocks, plan, data, optim, steps, csv_path, port, out, seed, cores = payload
    torch.set_num_threads(1)
    if cores:
        os.sched_setaffinity(0, {cores[rank]})
    table = plan.table
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=table.n_devices)
    held = list(table.stages_of(rank))
    mods = {s: TorchStage(blocks, *plan.partition.ranges[s], seed) for s in held}
    stages = [PipelineStage(mods[s], s, table.n_stages, torch.device("cpu")) for s in held]
    m = table.n_microbatches
    loss_fn = blocks.raw(seed)[1]
    sched = _PipelineScheduleRuntime(stages, n_microbatches=m, loss_fn=loss_fn, scale_grads=True)
    sched._load_csv(csv_path, format="compute_only")
    opt = StageOptimizers({(0, s): mods[s] for s in held}, optim, distributed=True)
    losses, times = [], []
    for step in range(steps):
        t0 = time.perf_counter()        # the whole step, as our loop's step_s: batches, zero_grad, barrier
        batch = [data.batch(step, j) for j in range(m)]
        ids, target = torch.cat([b["ids"] for b in batch]), torch.cat([b["targets"] for b in batch])
        for mod in mods.values():
            mod.zero_grad(set_to_none=True)
        dist.barrier()
        mb_losses: list = []
        args = (ids,) if 0 in held else ()
        kwargs = {"target": target, "losses": mb_losses} if table.n_stages - 1 in held else {}
        sched.step(*args, **kwargs)
        total = torch.tensor([sum(float(x.detach()) for x in mb_losses)], dtype=torch.float64)
        dist.all_reduce(total)
        opt.step(step)
        times.append(time.perf_counter() - t0)
        losses.append(float(total) / m)
        control.report(rank, step, 0, -1, waiting=False)
    names = ModelNames.of(blocks, seed)
    params = {names(n): p.detach().clone() for s in held for n, p in mods[s].named_parameters()}
    torch.save({"losses": losses, "params": params, "times": times}, Path(out) / f"torch{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()
    control.finished(rank)


def train_with_torch(blocks: UserBlocks, plan: Plan, data, optim: OptimSettings, steps: int,
                     seed: int = 0, timeout_s: float = 600.0, cores: tuple[int, ...] | None = None) -> TrainRun:
    """`steps` training steps of `plan` on torch's runtime, one local gloo process per rank
    (rank r pinned to `cores[r]` when given; torch's launchers leave ranks to the OS); records
    carry each step's wall seconds (the whole step as our loop times it: batches, zero_grad,
    barrier, schedule, optimizer step; rank 0)."""
    check_torch_plan(blocks, plan)
    with tempfile.TemporaryDirectory(prefix="octopipe-torch-") as tmp:
        csv_path = str(Path(tmp) / "schedule.csv")
        write_csv(plan.table.compact().compute_only(), csv_path, "compute_only")
        payload = (blocks, plan, data, optim, steps, csv_path, free_port(), tmp, seed, cores)
        run_ranks(_rank, payload, plan.table, timeout_s, timeout_s)
        docs = [torch.load(Path(tmp) / f"torch{r}.pt", weights_only=False) for r in range(plan.table.n_devices)]
    params: dict[str, torch.Tensor] = {}
    for d in docs:
        params.update(d["params"])
    tokens = plan.table.n_microbatches * blocks.seq_len * blocks.micro_batch_size
    records = [{"step": k + 1, "loss": docs[0]["losses"][k], "step_s": t, "tokens_per_s": tokens / t}
               for k, t in enumerate(docs[0]["times"])]
    return TrainRun(docs[0]["losses"], params, "", records)


__all__ = ["TorchStage", "check_torch_plan", "train_with_torch"]
