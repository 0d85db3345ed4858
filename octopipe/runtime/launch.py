"""Start one process per pipeline rank, watch them, and gather what they measured.

Local runs use torch.multiprocessing (a forkserver that has already imported torch, so ranks
start in milliseconds) and gloo over 127.0.0.1. The launcher polls each rank's position; if a
rank raises or dies, every other rank is told to stop and the run ends in a
RuntimeExecutionError naming the rank and its action (a rank that died is the cause; the lost
connections of its peers are listed as consequences); if no rank moves for `stall_s`, the
watchdog ends it the same way, names the rank that stopped progressing (a frozen process, told by
its missing heartbeat, first) and prints where every rank stands in its row. Ranks die with the
launcher and the temporary directory goes with them (`lifeline`).
"""
from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from multiprocessing import forkserver, resource_tracker
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

from octopipe.errors import RuntimeExecutionError, ScheduleError
from octopipe.model.spec import ModelSpec
from octopipe.runtime.control import Control, Failure
from octopipe.runtime.dispatch import arbitration, check_arbitration
from octopipe.runtime.emulation import emulation
from octopipe.runtime.job import Job, Layers
from octopipe.runtime.lifeline import rank_entry
from octopipe.runtime.rank_job import ComputeSpec, DataParallelSpec, RankJob, TensorParallelSpec, Wiring
from octopipe.runtime.stage import as_blocks
from octopipe.runtime.tensor_parallel import assemble
from octopipe.runtime.transport import choose_transport
from octopipe.runtime.worker import RankProgram, run_iterations
from octopipe.schedule.table import ScheduleTable
from octopipe.schedule.validate import validate
from octopipe.sim.agreement import agreement_stages


@dataclass
class ExecutionResult:
    losses: list[float]                       # mean loss of each iteration
    grads: dict[str, torch.Tensor]            # gradients of the last iteration (before its step)
    events: list[list[dict]]                  # per rank: actions, sends and arrivals (perf_counter s)
    iteration_s: list[float] = field(default_factory=list)   # first action start to last action end
    wall_s: list[float] = field(default_factory=list)        # barrier release to every rank done
    table: ScheduleTable | None = None
    microbatch_losses: list[dict[int, float]] = field(default_factory=list)  # per iteration
    weights: dict[str, torch.Tensor] = field(default_factory=dict)   # asynchronous: final weights


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_job(model: Layers | None, partition, table: ScheduleTable) -> ScheduleTable:
    """Reject a plan the runtime cannot run, before any process starts."""
    compute = table.compact().compute_only()
    validate(compute)
    if len(partition) != table.n_stages:
        raise ScheduleError(f"partition has {len(partition)} stages but the table places {table.n_stages}")
    if model is not None:
        n = as_blocks(model).n_blocks
        name = f"model {model.name!r}" if isinstance(model, ModelSpec) else "the model's block list"
        if partition[-1][1] != n:
            raise ScheduleError(f"partition covers {partition[-1][1]} layers but {name} has {n}; run the "
                                "plan on the model it was made for")
    return compute


STOPS = (signal.SIGTERM, signal.SIGHUP)
"""The signals the CLI turns into an orderly stop (besides Ctrl-C); held back like Ctrl-C while
ranks start, so that no rank is half-started when the launcher exits."""


@contextlib.contextmanager
def interrupts_held() -> Iterator[list[int]]:
    """Hold Ctrl-C (SIGINT) and the CLI's stop signals (SIGTERM, SIGHUP) back for the block, then
    deliver the first that arrived. While held, SIGINT is blocked in this thread, so processes
    started here inherit it blocked and never raise KeyboardInterrupt (the launcher stops them);
    a signal arriving in the block only records its number in the list the block is given
    (non-empty: stop early). A stop signal is held only where Python handles it (the CLI raises
    an orderly stop from it): raised in the middle of starting a rank, it would leave a process
    that the launcher never learns of, which fails to unpickle its start once the launcher has
    exited. Off the main thread (where no handler can be set) the block runs as it is. A process
    that started with Ctrl-C ignored (a background job of a non-interactive shell, nohup) keeps
    ignoring it."""
    hit: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield hit
        return
    ignored = signal.getsignal(signal.SIGINT) is signal.SIG_IGN    # started ignoring Ctrl-C: it stays so
    previous = {signal.SIGINT: signal.signal(signal.SIGINT, signal.SIG_IGN if ignored
                                             else lambda n, _: hit.append(n))}
    previous.update({s: signal.signal(s, lambda n, _: hit.append(n)) for s in STOPS
                     if callable(signal.getsignal(s))})
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield hit
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for s, handler in previous.items():
            signal.signal(s, handler)
    if hit:
        _deliver(hit[0], previous[hit[0]])


def _deliver(signum: int, handler) -> None:
    """Deliver a held signal as its handler outside the block would have."""
    if signum == signal.SIGINT and handler is not signal.SIG_IGN:
        raise KeyboardInterrupt
    if callable(handler):
        handler(signum, None)


def process_context():
    """The forkserver that starts ranks; it has imported torch already, so ranks start fast. It
    starts with SIGINT blocked, so a Ctrl-C at the terminal reaches only the launcher, which
    stops the ranks itself (no traceback from a half-started process)."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.distributed", "torch.optim", "torch._dynamo",
                                "octopipe.runtime.worker", "octopipe.runtime.lifeline"])
    with interrupts_held():     # it (and the resource tracker), and every rank it forks, ignore Ctrl-C
        resource_tracker.ensure_running()       # which unblocks SIGINT once it has started: block again
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        forkserver.ensure_running()
    return ctx


PEER_LOSS = re.compile(r"closed by peer|reset by peer|broken pipe|connection refused|connection closed|"
                       r"socket closed|ECONNRESET|EPIPE|another rank failed", re.IGNORECASE)
"""What a survivor reports when the rank it talks to is gone: a consequence, never the cause."""


def is_consequence(f: Failure) -> bool:
    return f.peer or bool(PEER_LOSS.search(f.message))


@dataclass
class Clocks:
    """When each rank last moved in its row and last beat its heartbeat (launcher's clock)."""

    moved: list[float]
    beat: list[float]

    @classmethod
    def start(cls, world: int, now: float) -> Clocks:
        return cls([now] * world, [now] * world)


@dataclass(frozen=True)
class Stall:
    """Why the launcher stopped a run that was not failing: a stall, or the whole-run timeout."""

    seconds: float
    timeout: float | None = None      # set when the run's time limit ran out
    timeout_name: str = "runtime.timeout_s"   # the setting that gave it
    frozen_s: float = 1.0             # a heartbeat older than this means a frozen process


def _where(control: Control, table: ScheduleTable, rank: int) -> str:
    it, done, idx, waiting, fin = control.status(rank)
    row = _row(control, table, rank)
    if fin:
        return f"rank {rank}: finished its row (iteration {it})"
    if done >= len(row):
        return f"rank {rank}: done with iteration {it}, not yet in the next"
    action = row[idx] if 0 <= idx < len(row) else "?"
    verb = "waiting for the inputs of" if waiting else "running"
    return f"rank {rank}: {verb} {action} ({done}/{len(row)} of its row done, iteration {it})"


def _row(control: Control, table: ScheduleTable, rank: int) -> tuple:
    """The row of a world rank: that of its pipeline rank (a TP rank shares it)."""
    return table.actions(rank * table.n_devices // control.world)


def _action_of(control: Control, table: ScheduleTable, rank: int) -> str:
    """Where a rank stands, to follow "at": its cell (waiting for its inputs, or running it), or
    the end of an iteration."""
    it, _done, idx, waiting, _ = control.status(rank)
    row = _row(control, table, rank)
    if not 0 <= idx < len(row):
        return f"the end of iteration {it} (its row done)"
    return (f"{row[idx]} (iteration {it}, position {idx + 1}/{len(row)} in its row"
            f"{', waiting for its inputs' if waiting else ''})")


def _proc_state(pid: int | None) -> str:
    """The kernel's one-letter state of a process (Linux; '' elsewhere)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError, TypeError):
        return ""


def _frozen(procs, clocks: Clocks, stall: Stall, now: float) -> dict[int, str]:
    """The ranks whose process stopped beating, with what the kernel says of it."""
    out = {}
    for r, p in enumerate(procs):
        age = now - clocks.beat[r]
        if p.exitcode is None and age >= stall.frozen_s:
            stopped = " (its process is stopped: SIGSTOP or a debugger)" \
                if _proc_state(p.pid) in ("t", "T") else ""
            out[r] = f"no heartbeat for {age:.0f}s{stopped}"
    return out


def _stall_error(control, table, procs, clocks: Clocks, stall: Stall) -> RuntimeExecutionError:
    """The watchdog's report: the rank that stopped progressing first, then where each stands."""
    now = time.monotonic()
    frozen = _frozen(procs, clocks, stall, now)
    live = [r for r in range(len(procs)) if not control.status(r)[4]
            and control.status(r)[1] < len(_row(control, table, r))]
    running = [r for r in live if not control.status(r)[3]]
    if frozen:
        r = min(frozen, key=lambda q: clocks.beat[q])
        blame = f"rank {r} stopped responding ({frozen[r]}) at {_action_of(control, table, r)}"
    elif running:
        r = min(running, key=lambda q: clocks.moved[q])
        blame = (f"rank {r} stopped progressing: it has been running {_action_of(control, table, r)} "
                 f"for {now - clocks.moved[r]:.0f}s while the others wait")
    elif live:
        r = min(live, key=lambda q: clocks.moved[q])
        blame = f"rank {r} stopped progressing first: it waits at {_action_of(control, table, r)}"
    else:
        blame = "every rank finished its row but the run did not end"
    positions = "\n  ".join(_where(control, table, q) + (f" [{frozen[q]}]" if q in frozen else "")
                            for q in range(len(procs)))
    what = (f"the run exceeded {stall.timeout_name}={stall.timeout:g}" if stall.timeout is not None
            else f"no rank made progress for {stall.seconds:.0f}s")
    return RuntimeExecutionError(f"watchdog: {what}; {blame}; where each rank stands:\n  {positions}")


def _death(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _error(control, table, procs, failures: list[Failure]) -> RuntimeExecutionError:
    """The failure report: a rank that died (a signal, or an exit without a report) is the cause,
    then a rank that raised; survivors' lost connections and aborts are listed as consequences."""
    positions = "\n  ".join(_where(control, table, r) for r in range(len(procs)))
    reported = {f.rank for f in failures}
    dead = [(r, p.exitcode) for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in reported]
    roots = [f for f in failures if not is_consequence(f)]
    cause = None
    if dead:
        r, code = dead[0]
        head = f"rank {r} {_death(code)} at {_action_of(control, table, r)}"
    elif roots or failures:
        cause = (roots or failures)[0]
        head = f"rank {cause.rank} failed at {_action_of(control, table, cause.rank)}: {cause.message}"
    else:
        head = "a rank stopped without reporting why"
    others = [f for f in failures if f is not cause and (not dead or f.rank != dead[0][0])]
    after = "\n  consequences: " + "; ".join(f"rank {f.rank}: {f.message}" for f in others) if others else ""
    tb = cause.traceback if cause is not None and not is_consequence(cause) else ""
    return RuntimeExecutionError(f"{head}\n  {positions}{after}" + (f"\n{tb}" if tb else ""))


def _tick(control: Control, clocks: Clocks, snaps: list, now: float) -> list:
    """Update `clocks` from the shared state; the new per-rank snapshots."""
    status, beats = control.snapshot(), control.beats()
    new = [(status[r * 5:(r + 1) * 5], beats[r]) for r in range(len(clocks.moved))]
    for r, (old, cur) in enumerate(zip(snaps, new)):
        if old is None or old[0] != cur[0]:
            clocks.moved[r] = now
        if old is None or old[1] != cur[1]:
            clocks.beat[r] = now
    return new


def _watch(procs, control: Control, table: ScheduleTable, timeout_s: float, stall_s: float,
           timeout_name: str = "runtime.timeout_s") -> None:
    start = time.monotonic()
    clocks = Clocks.start(len(procs), start)
    snaps = _tick(control, clocks, [None] * len(procs), start)
    last_move = start
    failures: list[Failure] = []
    while True:
        time.sleep(0.02)
        failures += control.failures()
        codes = [p.exitcode for p in procs]
        if all(c == 0 for c in codes):
            return
        now = time.monotonic()
        before = list(clocks.moved)
        snaps = _tick(control, clocks, snaps, now)
        if clocks.moved != before:
            last_move = now
        stall = None
        if now - last_move > stall_s:
            stall = Stall(now - last_move, frozen_s=max(min(stall_s / 2, 2.0), 0.5))
        elif now - start > timeout_s:
            stall = Stall(now - last_move, timeout=timeout_s, frozen_s=max(min(stall_s / 2, 2.0), 0.5),
                          timeout_name=timeout_name)
        if failures or any(c not in (None, 0) for c in codes) or stall is not None:
            err = _stall_error(control, table, procs, clocks, stall) if stall is not None else None
            control.abort()
            grace = time.monotonic() + 5.0
            while time.monotonic() < grace and any(p.exitcode is None for p in procs):
                time.sleep(0.02)
                failures += control.failures()
            failures += control.failures()
            err = err or _error(control, table, procs, failures)
            for p in procs:
                if p.pid is not None and p.exitcode is None:
                    p.kill()
                if p.pid is not None:
                    p.join(timeout=5)
            raise err


def rank_job(job: Job, table: ScheduleTable, result_dir: str) -> RankJob:
    """What every rank of `job` gets: `table` (the plan's compute-only table), the transport and
    device resolved, emulated compute's sleeps and message sizes worked out once."""
    config = job.config
    transport, device = choose_transport(config.backend, config.transport, config.device)
    durations = dict(emulation(job).durations) if config.compute == "emulated" else {}
    elems = dict(emulation(job).message_elems) if config.compute == "emulated" else {}
    wiring = Wiring(job.world, job.init_method or f"tcp://127.0.0.1:{free_port()}",
                    config.backend, transport, device)
    compute = ComputeSpec(config.compute, job.model if config.compute == "real" else None, job.data,
                          job.autocast, durations, elems, cpus=tuple(job.pinned or ()),
                          recompute=job.recompute)
    return RankJob(job.plan.partition.ranges, table, wiring, compute,
                   TensorParallelSpec(config.tp, agree_stages(job)), arbitration(job, table, durations),
                   job.weights, config.dispatch, job.total_iterations, tuple(job.metered), job.seed, config.lr,
                   result_dir, job.fault, job.ab_strict,
                   DataParallelSpec(job.data_parallel.dp, job.data_parallel.zero))


def agree_stages(job: Job) -> tuple[tuple[bool, bool, bool], ...]:
    """Per stage, whether its F, I and W run TP collectives (B: either): what RRFP's agreement keys on
    (`octopipe.sim.agreement.agreement_stages`, the simulator's definition); empty (F, I and B of
    every stage) without a ModelSpec or at tp = 1."""
    if job.config.tp <= 1 or not isinstance(job.model, ModelSpec):
        return ()
    return agreement_stages(job.model, job.plan.partition, job.config.tp)


def _check(job: Job) -> ScheduleTable:
    """Reject a job the runtime cannot run, before any process starts; its compute-only table."""
    config, table = job.config, job.plan.table
    if config.dispatch not in ("strict", "ready_first"):
        raise ScheduleError(f"runtime.dispatch={config.dispatch!r}: choose strict or ready_first")
    if job.ab_strict and (config.dispatch != "ready_first" or config.warmup % 2 or config.iterations % 2):
        raise ScheduleError("an A/B job (ab_strict) needs runtime.dispatch=ready_first and even warmup and "
                            "iterations (each strict iteration is paired with the ready-first one after it)")
    choose_transport(config.backend, config.transport, config.device)
    if config.compute not in ("real", "emulated"):
        raise ScheduleError(f"runtime.compute={config.compute!r}: choose real or emulated")
    if config.compute == "real" and job.model is None:
        raise ScheduleError("compute=real needs the model's layers; pass a ModelSpec or a block list")
    compute_table = check_job(job.model if config.compute == "real" else None, job.plan.partition, table)
    check_arbitration(job, compute_table, choose_transport(config.backend, config.transport, config.device)[0])
    world = job.world
    if job.data_parallel.dp > 1 and any(len({pl[s] for pl in table.all_placements()}) > 1
                                        for s in range(table.n_stages)):
        raise ScheduleError(f"data parallelism ({job.data_parallel.dp} replicas) needs a schedule without "
                            f"replicated (Chimera) stages; choose another schedule")
    if config.backend == "nccl" and torch.cuda.device_count() < world:
        raise ScheduleError(f"backend=nccl needs a GPU per rank: the job has {world} ranks and this machine "
                            f"{torch.cuda.device_count()} GPU(s), and NCCL refuses two ranks on one GPU; use "
                            f"backend=gloo with device=cuda to share GPUs")
    if job.pinned is not None and len(job.pinned) != world:
        raise ScheduleError(f"the job pins {len(job.pinned)} cores but it has {world} ranks; "
                            "give one core per rank")
    return compute_table


def launch(job: Job, result_dir: str, program: RankProgram = run_iterations,
           payload: Callable[[RankJob], Any] = lambda rank: rank) -> ScheduleTable:
    """The one route into the runtime: check `job` (before any process starts), then run
    `program(rank, payload(rank_job), control)` on one process per rank, watched until all exit,
    each writing into `result_dir`. `mode=execute` runs the runtime's own iterations
    (`run_iterations`); `mode=train` runs its training loop on the same job. Returns the
    compute-only table that ran."""
    rank = resolve(job, result_dir)
    target = partial(rank_entry, os.getpid(), result_dir, program)
    run_ranks(target, payload(rank), rank.table, job.config.timeout_s, job.config.stall_s,
              world=rank.wiring.world, timeout_name=job.timeout_name)
    return rank.table


def resolve(job: Job, result_dir: str) -> RankJob:
    """`job` checked (the runtime refuses what it cannot run before any process starts) and
    resolved into what every rank gets; torchrun's entries call it in each rank."""
    return rank_job(job, _check(job), result_dir)


def execute(job: Job) -> ExecutionResult:
    """Run `job` on one process per device and return what was measured.

    `compute="emulated"` sleeps `job.costs` as `emulation` scales them; `compute="real"` builds
    the model's layers. `job.pinned[rank]` pins each rank to one core (Linux). Transport
    (`runtime.transport`): `tagged` (a tag per message; gloo only), `ordered` (per-pair groups,
    canonical posting order; what NCCL needs) or `auto` (ordered for nccl, tagged for gloo).
    Device: `cpu`, `cuda` (with gloo, several ranks may share one GPU; messages are staged
    through the CPU) or `auto` (cuda for nccl, cpu for gloo).
    """
    with tempfile.TemporaryDirectory(prefix="octopipe-run-") as tmp:
        compute_table = launch(job, tmp)
        world = job.world
        docs = [torch.load(Path(tmp) / f"rank{r}.pt", weights_only=False) for r in range(world)]
    return _gather(docs, compute_table, job.total_iterations)


def run_ranks(target, payload, table: ScheduleTable, timeout_s: float, stall_s: float,
              world: int | None = None, timeout_name: str = "runtime.timeout_s") -> None:
    """Start `target(rank, payload, control)` on `world` processes (default: a rank per row of
    `table`) and watch them until all exit (RuntimeExecutionError naming the failed or stalled
    rank otherwise); every process still running at the end is killed. The one process loop of
    every launch (`launch`, torch's runtime in `train.torch_runtime`)."""
    world = table.n_devices if world is None else world
    ctx = process_context()
    procs: list = []
    try:
        with interrupts_held() as interrupted:     # ranks start deaf to Ctrl-C; the launcher stops them
            control = Control(world, ctx)
            procs = [ctx.Process(target=target, args=(r, payload, control), name=f"octopipe-rank{r}")
                     for r in range(world)]
            for p in procs:
                if interrupted:
                    break
                p.start()
        if any(p.pid is None for p in procs):   # a signal stopped the starts and was not delivered
            raise KeyboardInterrupt
        _watch(procs, control, table, timeout_s, stall_s, timeout_name)
    finally:
        with interrupts_held():     # a second Ctrl-C or SIGTERM must not cut the clean-up short
            for p in procs:
                if p.pid is not None and p.exitcode is None:
                    p.kill()
            for p in procs:
                if p.pid is not None:
                    p.join(timeout=5)


def _gather(docs: list[dict], table: ScheduleTable, iterations: int) -> ExecutionResult:
    grads: dict[str, torch.Tensor] = {}
    per_it: list[dict[int, float]] = [{} for _ in range(iterations)]
    for d in docs:
        grads.update(d["grads"])
    if any(d.get("grad_shards") for d in docs):     # tp > 1: each TP rank's slices, made whole
        grads.update(assemble(d["grad_shards"] for d in docs))
    for d in docs:
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
    weights = {n: t for d in docs for n, t in d.get("weights", {}).items()}
    return ExecutionResult(losses, grads, events, times, walls, table, per_it, weights)
