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
from octopipe.runtime.transport import choose_transport
from octopipe.runtime.worker import Fault, RankJob, rank_main
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


def _context():
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
    row = table.actions(rank)
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


def execute(model: ModelSpec | None, partition, table: ScheduleTable, *, dispatch: str = "ready_first",
            compute: str = "real", iterations: int = 1, seed: int = 0, lr: float = 0.0,
            durations: dict | None = None, message_elems: dict | None = None, backend: str = "gloo",
            timeout_s: float = 120.0, stall_s: float = 30.0, fault: Fault | None = None,
            cpus: tuple[int, ...] | None = None, transport: str = "auto",
            device: str = "auto") -> ExecutionResult:
    """Run `table` with `partition` on one process per device and return what was measured.

    `compute="emulated"` needs `durations[stage] = (f, i, w)` seconds and `message_elems[stage]`
    (float32 elements sent after the stage); `compute="real"` builds the model's layers.
    `cpus[rank]` pins each rank to one core (Linux; None leaves the OS to place them).
    `transport`: `tagged` (a tag per message; gloo only), `ordered` (per-pair groups, canonical
    posting order; what NCCL needs) or `auto` (ordered for nccl, tagged for gloo). `device`:
    `cpu`, `cuda` (with gloo, several ranks may share one GPU; messages are staged through the
    CPU) or `auto` (cuda for nccl, cpu for gloo).
    """
    if dispatch not in ("strict", "ready_first"):
        raise ScheduleError(f"runtime.dispatch={dispatch!r}: choose strict or ready_first")
    transport, device = choose_transport(backend, transport, device)
    if compute not in ("real", "emulated"):
        raise ScheduleError(f"runtime.compute={compute!r}: choose real or emulated")
    if compute == "real" and model is None:
        raise ScheduleError("compute=real needs the model's layers; pass a ModelSpec")
    if compute == "emulated" and (durations is None or len(durations) != table.n_stages):
        raise ScheduleError("compute=emulated needs a modelled (f, i, w) duration for every stage")
    compute_table = check_job(model, partition, table)
    world = table.n_devices
    if backend == "nccl" and torch.cuda.device_count() < world:
        raise ScheduleError(f"backend=nccl needs a GPU per rank: the table has {world} ranks and this machine "
                            f"{torch.cuda.device_count()} GPU(s), and NCCL refuses two ranks on one GPU; use "
                            f"backend=gloo with device=cuda to share GPUs")
    if cpus is not None and len(cpus) != world:
        raise ScheduleError(f"cpus lists {len(cpus)} cores but the table has {world} ranks; give one core per rank")
    ctx = _context()
    control = Control(world, ctx)
    with tempfile.TemporaryDirectory(prefix="octopipe-run-") as tmp:
        job = RankJob(model, tuple(tuple(p) for p in partition), compute_table, world,
                      f"tcp://127.0.0.1:{free_port()}", backend, dispatch, compute, iterations, seed, lr,
                      dict(durations or {}), dict(message_elems or {}), tmp, fault,
                      cpus=tuple(cpus or ()), transport=transport, device=device)
        procs = [ctx.Process(target=rank_main, args=(r, job, control), name=f"octopipe-rank{r}")
                 for r in range(world)]
        for p in procs:
            p.start()
        try:
            _watch(procs, control, compute_table, timeout_s, stall_s)
        finally:
            for p in procs:
                if p.exitcode is None:
                    p.kill()
                p.join(timeout=5)
        docs = [torch.load(Path(tmp) / f"rank{r}.pt", weights_only=False) for r in range(world)]
    return _gather(docs, compute_table, iterations)


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
