"""Start one process per pipeline rank, watch them, and gather what they measured.

Local runs use torch.multiprocessing (a forkserver that has already imported torch, so ranks
start in milliseconds) and gloo over 127.0.0.1. The launcher polls each rank's position; if a
rank raises or dies, every other rank is told to stop and the run ends in a
RuntimeExecutionError naming the rank and its action; if no rank moves for `stall_s`, the
watchdog ends it the same way and prints where every rank stands in its row.
"""
from __future__ import annotations

import signal
import socket
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.multiprocessing as mp

from octopipe.errors import RuntimeExecutionError, ScheduleError
from octopipe.model.spec import ModelSpec
from octopipe.runtime.control import Control, Failure
from octopipe.runtime.dispatch import arbitration, check_arbitration
from octopipe.runtime.emulation import emulation
from octopipe.runtime.job import Job
from octopipe.runtime.transport import choose_transport
from octopipe.runtime.worker import RankJob, rank_main
from octopipe.schedule.table import ScheduleTable
from octopipe.schedule.validate import validate


@dataclass
class ExecutionResult:
    losses: list[float]                       # mean loss of each iteration
    grads: dict[str, torch.Tensor]            # gradients of the last iteration (before its step)
    events: list[list[dict]]                  # per rank: actions, sends and arrivals (perf_counter s)
    iteration_s: list[float] = field(default_factory=list)   # first action start to last action end
    wall_s: list[float] = field(default_factory=list)        # barrier release to every rank done
    table: ScheduleTable | None = None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_job(model: ModelSpec | None, partition, table: ScheduleTable) -> ScheduleTable:
    """Reject a plan the runtime cannot run, before any process starts."""
    compute = table.compact().compute_only()
    validate(compute)
    if len(partition) != table.n_stages:
        raise ScheduleError(f"partition has {len(partition)} stages but the table places {table.n_stages}")
    if model is not None and partition[-1][1] != model.n_layers:
        raise ScheduleError(f"partition covers {partition[-1][1]} layers but model {model.name!r} has "
                            f"{model.n_layers}")
    return compute


def process_context():
    """The forkserver that starts ranks; it has imported torch already, so ranks start fast."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.distributed", "torch.optim", "torch._dynamo",
                                "octopipe.runtime.worker"])
    return ctx


def _where(control: Control, table: ScheduleTable, rank: int) -> str:
    it, done, idx, waiting, fin = control.status(rank)
    row = table.actions(rank)
    if fin or done >= len(row):
        return f"rank {rank}: finished its row (iteration {it})"
    action = row[idx] if 0 <= idx < len(row) else "?"
    verb = "waiting for the inputs of" if waiting else "running"
    return f"rank {rank}: {verb} {action} ({done}/{len(row)} of its row done, iteration {it})"


def _action_of(control: Control, table: ScheduleTable, rank: int) -> str:
    it, done, idx, waiting, _ = control.status(rank)
    row = table.actions(rank * table.n_devices // control.world)   # a TP rank's pipeline rank
    a = row[idx] if 0 <= idx < len(row) else None
    return f"{'waiting for ' if waiting else ''}{a} (iteration {it}, position {idx + 1}/{len(row)} in its row)"


def _error(control, table, procs, failures: list[Failure], stalled: float | None) -> RuntimeExecutionError:
    positions = "\n  ".join(_where(control, table, r) for r in range(len(procs)))
    if stalled is not None:
        return RuntimeExecutionError(f"watchdog: no rank made progress for {stalled:.0f}s; where each rank "
                                     f"stands:\n  {positions}")
    reported = {f.rank for f in failures}
    roots = [f for f in failures if not f.peer]
    if roots:
        f = roots[0]
        head = f"rank {f.rank} failed at {_action_of(control, table, f.rank)}: {f.message}"
    else:
        dead = [(r, p.exitcode) for r, p in enumerate(procs)
                if p.exitcode not in (None, 0) and r not in reported]
        if dead:
            r, code = dead[0]
            how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with code {code}"
            head = f"rank {r} {how} at {_action_of(control, table, r)}"
        elif failures:
            f = failures[0]
            head = f"rank {f.rank} failed at {_action_of(control, table, f.rank)}: {f.message}"
        else:
            head = "a rank stopped without reporting why"
    tb = next((f.traceback for f in failures if not f.peer and f.traceback), "")
    return RuntimeExecutionError(f"{head}\n  {positions}" + (f"\n{tb}" if tb else ""))


def _watch(procs, control: Control, table: ScheduleTable, timeout_s: float, stall_s: float) -> None:
    start = last_move = time.monotonic()
    snap = control.snapshot()
    failures: list[Failure] = []
    while True:
        time.sleep(0.02)
        failures += control.failures()
        codes = [p.exitcode for p in procs]
        if all(c == 0 for c in codes):
            return
        now = time.monotonic()
        if (s := control.snapshot()) != snap:
            snap, last_move = s, now
        stalled = now - last_move if now - last_move > stall_s or now - start > timeout_s else None
        if failures or any(c not in (None, 0) for c in codes) or stalled is not None:
            control.abort()
            grace = time.monotonic() + 5.0
            while time.monotonic() < grace and any(p.exitcode is None for p in procs):
                time.sleep(0.02)
                failures += control.failures()
            failures += control.failures()
            err = _error(control, table, procs, failures, stalled)
            for p in procs:
                if p.exitcode is None:
                    p.kill()
                p.join(timeout=5)
            raise err


def rank_job(job: Job, table: ScheduleTable, init_method: str, result_dir: str) -> RankJob:
    """What every rank of `job` gets: `table` (the plan's compute-only table), the transport and
    device resolved, emulated compute's sleeps and message sizes worked out once."""
    config = job.config
    transport, device = choose_transport(config.backend, config.transport, config.device)
    emulated = emulation(job) if config.compute == "emulated" else None
    return RankJob(job.model if config.compute == "real" else None, job.plan.partition, table,
                   table.n_devices * config.tp, init_method, config.backend, config.dispatch, config.compute,
                   job.total_iterations, job.seed, config.lr,
                   dict(emulated.durations) if emulated else {}, dict(emulated.message_elems) if emulated else {},
                   result_dir, job.fault, cpus=tuple(job.pinned or ()), transport=transport, device=device,
                   arbitration=arbitration(job, table, dict(emulated.durations) if emulated else {}),
                   tp=config.tp)


def _check(job: Job) -> ScheduleTable:
    """Reject a job the runtime cannot run, before any process starts; its compute-only table."""
    config, table = job.config, job.plan.table
    if config.dispatch not in ("strict", "ready_first"):
        raise ScheduleError(f"runtime.dispatch={config.dispatch!r}: choose strict or ready_first")
    choose_transport(config.backend, config.transport, config.device)
    if config.compute not in ("real", "emulated"):
        raise ScheduleError(f"runtime.compute={config.compute!r}: choose real or emulated")
    if config.compute == "real" and job.model is None:
        raise ScheduleError("compute=real needs the model's layers; pass a ModelSpec")
    compute_table = check_job(job.model if config.compute == "real" else None, job.plan.partition, table)
    check_arbitration(job, compute_table, choose_transport(config.backend, config.transport, config.device)[0])
    world = table.n_devices
    if config.backend == "nccl" and torch.cuda.device_count() < world:
        raise ScheduleError(f"backend=nccl needs a GPU per rank: the table has {world} ranks and this machine "
                            f"{torch.cuda.device_count()} GPU(s), and NCCL refuses two ranks on one GPU; use "
                            f"backend=gloo with device=cuda to share GPUs")
    if job.pinned is not None and len(job.pinned) != world:
        raise ScheduleError(f"the job pins {len(job.pinned)} cores but the table has {world} ranks; "
                            "give one core per rank")
    return compute_table


def execute(job: Job) -> ExecutionResult:
    """Run `job` on one process per device and return what was measured.

    `compute="emulated"` sleeps `job.costs` as `emulation` scales them; `compute="real"` builds
    the model's layers. `job.pinned[rank]` pins each rank to one core (Linux). Transport
    (`runtime.transport`): `tagged` (a tag per message; gloo only), `ordered` (per-pair groups,
    canonical posting order; what NCCL needs) or `auto` (ordered for nccl, tagged for gloo).
    Device: `cpu`, `cuda` (with gloo, several ranks may share one GPU; messages are staged
    through the CPU) or `auto` (cuda for nccl, cpu for gloo).
    """
    compute_table = _check(job)
    world = compute_table.n_devices * job.config.tp
    ctx = process_context()
    control = Control(world, ctx)
    with tempfile.TemporaryDirectory(prefix="octopipe-run-") as tmp:
        rank = rank_job(job, compute_table, f"tcp://127.0.0.1:{free_port()}", tmp)
        procs = [ctx.Process(target=rank_main, args=(r, rank, control), name=f"octopipe-rank{r}")
                 for r in range(world)]
        for p in procs:
            p.start()
        try:
            _watch(procs, control, compute_table, job.config.timeout_s, job.config.stall_s)
        finally:
            for p in procs:
                if p.exitcode is None:
                    p.kill()
                p.join(timeout=5)
        docs = [torch.load(Path(tmp) / f"rank{r}.pt", weights_only=False) for r in range(world)]
    return _gather(docs, compute_table, job.total_iterations)


def _gather(docs: list[dict], table: ScheduleTable, iterations: int) -> ExecutionResult:
    grads: dict[str, torch.Tensor] = {}
    per_it: list[dict[int, float]] = [{} for _ in range(iterations)]
    for d in docs:
        grads.update(d["grads"])
        for it, losses in enumerate(d["losses"]):
            per_it[it].update(losses)
    losses = [sum(v.values()) / len(v) if v else float("nan") for v in per_it]
    events = [d["events"] for d in docs]
    times, walls = [], []
    for it in range(iterations):
        acts = [e for ev in events for e in ev if e["it"] == it and "action" in e]
        times.append(max(e["end"] for e in acts) - min(e["start"] for e in acts))
        marks = [e for ev in events for e in ev if e["it"] == it and "begin" in e]
        walls.append(max(e["finish"] for e in marks) - min(e["begin"] for e in marks))
    return ExecutionResult(losses, grads, events, times, walls, table)
