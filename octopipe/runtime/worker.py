"""One pipeline rank: builds its stages, runs its row of the table, reports what happened.

Dispatch `strict` runs the row in order; `ready_first` runs the best-ranked ready action that
no buffer cap holds back, ranked by the hint (`table`, `bf`, `bfw`) and capped as
`octopipe.sim.hints` defines for the simulator too. Stages on the same rank hand tensors over in memory.
Messages to other ranks go through the `tagged` or `ordered` transport (transport.py); the
ordered one posts each pair's messages in the order `pair_orders` gives.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import time
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from octopipe.model.user_module import UserBlocks
from octopipe.runtime.compute import EmulatedCompute, RealCompute
from octopipe.runtime.control import Control
from octopipe.runtime.data_parallel import GradSync, ReplicaBatches
from octopipe.runtime.hf_tensor_parallel import HFTPBlocks
from octopipe.runtime.jitter import DelayedSender, Jittered
from octopipe.runtime.messages import (
    expected_messages,
    pair_groups,
    pair_orders,
    produced_message,
    replica_groups,
)
from octopipe.runtime.rank_job import RankJob
from octopipe.runtime.stage import SyntheticBatches
from octopipe.runtime.tensor_parallel import (
    NONE,
    Round,
    TPBlocks,
    agreed,
    rank_shards,
)
from octopipe.runtime.transport import BWD, FWD, Key, OrderedTransport, Pairs, Transport
from octopipe.schedule.action import Action, ActionKind
from octopipe.sim.agreement import needs_agreement
from octopipe.sim.hints import KIND_CODE, admission_order, admits, row_priority


class Aborted(Exception):
    """Another rank failed; this one stops where it is."""
















class Rank:
    """The dispatcher of one rank for one iteration after another."""

    def __init__(self, job: RankJob, rank: int, control: Control) -> None:
        self.job, self.rank, self.control = job, rank, control
        self.dispatch = job.dispatch        # this iteration's (`RankJob.ab_strict` alternates it)
        self.table = job.table
        self.grid = job.grid
        self.prank, self.drank, self.trank = self.grid.place(rank)     # pipeline rank, DP replica, TP rank
        self.row = job.table.compact().compute_only().actions(self.prank)
        self.device = torch.device("cuda", torch.cuda.current_device()) if job.wiring.device == "cuda" \
            else torch.device("cpu")
        self.comm_device = self.device if job.wiring.backend == "nccl" else torch.device("cpu")
        self.tp_group = self.grid.tp_groups()[(self.prank, self.drank)] if job.tp > 1 else None
        # real compute with tp > 1: this TP rank's shard of each layer (runtime/tensor_parallel.py)
        self.blocks = None
        if self.tp_group is not None and job.compute.kind == "real":
            self.blocks = HFTPBlocks(job.model, self.trank, job.tp, self.tp_group) \
                if isinstance(job.model, UserBlocks) else TPBlocks(job.model, self.trank, job.tp, self.tp_group)
        if job.compute.kind == "emulated":
            self.compute = EmulatedCompute(job.compute.durations, job.compute.message_elems, job.table.n_stages,
                                           self.device)
        else:
            self.compute = RealCompute(job.model if self.blocks is None else self.blocks, job.partition,
                                       job.table.replica_stages_of(self.prank), job.table.n_microbatches,
                                       job.seed, self.device, job.table.mb_replica, job.weights)
            if job.compute.data is not None or self.blocks is not None:
                self.compute.batches = job.compute.data or SyntheticBatches(job.model, job.seed)
            if job.dp > 1:
                self.compute.batches = ReplicaBatches(self.compute.batches, self.drank, job.table.n_microbatches)
            self.compute.autocast = getattr(torch, job.compute.autocast) if job.compute.autocast else None
            self.compute.recompute = frozenset(job.compute.recompute)
        arb = job.arbitration
        if arb.variability is not None:
            self.compute = Jittered(self.compute, arb.variability, self.prank, job.seed,
                                    (job.table.n_stages, job.table.n_microbatches), self.device)
        self.prio = row_priority(self.row, arb.hint)
        self.rowpos = {a: k for k, a in enumerate(self.row)}
        self.ranked = sorted(self.row, key=self.prio.__getitem__)
        self.gated = arb.max_inflight is not None or arb.memory_cap is not None
        self.admission = admission_order(self.row)
        self.delayed = DelayedSender() if arb.variability is not None and arb.variability.transfer_delay > 0 \
            else None
        self.groups = replica_groups(job.table)
        # the ordered transport's pairs join TP rank t of one pipeline rank to TP rank t of another
        self.orders = {(self.grid.rank(src, t, d), self.grid.rank(dst, t, d)): keys
                       for (src, dst), keys in (pair_orders(job.table)
                                                if job.wiring.transport == "ordered" else {}).items()
                       for d in range(job.dp) for t in range(job.tp)}
        self.pair_groups = pair_groups(self.orders)
        self.opt = torch.optim.SGD(self.compute.parameters(), lr=job.lr) \
            if job.lr > 0 and self.compute.parameters() and job.weights is None else None
        self.grad_sync = GradSync(self.compute.copies, self.row, self.grid, self.prank, job.data_parallel,
                                  job.table) if job.dp > 1 and job.compute.kind == "real" else None
        self.agreeing = self._agreeing()
        self.feeding = self._feeding()
        self._round: Round | None = None
        self.events: list[dict] = []

    def _agreeing(self) -> frozenset[Action]:
        """The row's tasks the TP ranks agree on under ready_first: RRFP's rule
        (`octopipe.sim.agreement.needs_agreement`: the tasks that run TP collectives), or every task under a buffer
        cap, whose state (live micro-batches, modelled bytes)
        changes with every task and must stay equal on the TP ranks."""
        if self.tp_group is None or self.job.dispatch != "ready_first":
            return frozenset()
        if self.gated:
            return frozenset(self.row)
        stages = self.job.tensor_parallel.agree_stages
        return frozenset(a for a in self.row if bool(needs_agreement(
            KIND_CODE[a.kind], *(stages[a.stage] if stages else (True, True, False)))))

    # readiness -------------------------------------------------------------------------
    def _input_key(self, a: Action) -> Key | None:
        n_s = self.table.n_stages
        if a.kind is ActionKind.F:
            return Key(a.stage, a.microbatch, FWD) if a.stage > 0 else None
        if a.kind in (ActionKind.B, ActionKind.I):
            return Key(a.stage, a.microbatch, BWD) if a.stage < n_s - 1 else None
        return None

    def _ready(self, a: Action, done: set[Action], local: dict[Key, torch.Tensor]) -> bool:
        if a.kind in (ActionKind.B, ActionKind.I) and Action(a.stage, ActionKind.F, a.microbatch) not in done:
            return False
        if a.kind is ActionKind.W and Action(a.stage, ActionKind.I, a.microbatch) not in done:
            return False
        key = self._input_key(a)
        return key is None or key in local or self.transport.expects(key)

    def _allowed(self, a: Action) -> bool:
        """Whether no buffer cap holds `a` back (`octopipe.sim.hints.admits`)."""
        if not self.gated or a.kind is not ActionKind.F or a.microbatch in self._started:
            return True
        arb = self.job.arbitration
        nxt = self.admission[self._adm_next] if self._adm_next < len(self.admission) else -1
        alloc = arb.memory.get((a.stage, 0), (0.0, 0.0))[0]
        return admits(a.microbatch, nxt, len(self._live), arb.cap(self.prank), self._mem, alloc, arb.memory_cap)

    def _agreed(self, pending: list[Action], done: set[Action], local) -> Action:
        """ready_first with TP ranks (strict needs nothing: every TP rank runs the same row in
        order). The best-ranked ready task runs at once if it has no TP collectives; otherwise
        it is this rank's pick in a `Round` (one scalar all-gather with the stage's other TP
        ranks) and runs only if every rank picked it. While a round is in flight the rank runs
        its ready tasks without collectives that send a message (`feeding`: a W, or the first
        stage's empty I, feeds only this rank's later tasks and ranks below the pick, so it waits
        for the round instead of delaying the agreed task); with none of those left to wait for,
        it blocks on the round itself (one wake-up, not the round's callback and then the
        dispatcher). After a disagreement a rank whose pick was the best gathered one picks again
        at once; the others wait until something arrived or finished since their pick (nothing
        else can change it). Other waits are on the inbox's condition, which arrivals, errors and
        the round's completion all notify (docs/runtime.md)."""
        inbox = self.transport.inbox
        while True:
            with inbox.cv:
                self._check(inbox)
                rnd = self._round
                if rnd is None:
                    a = self._pick(pending, done, local)
                    if a is not None and a not in self.agreeing:
                        return a
                    if a is not None and self._changes(done) != self._deferred:
                        self._post(a, done, inbox)
                        continue
                    free = self._free(pending, done, local)
                    if free is not None:
                        return free
                    inbox.cv.wait(timeout=0.05)
                    continue
                if not rnd.done():
                    free = self._free(pending, done, local, feeding=True)
                    if free is not None:
                        return free
                    if self.job.wiring.backend == "nccl" or any(a in self.feeding for a in pending):
                        t0 = time.perf_counter()
                        inbox.cv.wait(timeout=self._poll_s)
                        self._agree_s += time.perf_counter() - t0
                        continue
            t0 = time.perf_counter()
            picks = rnd.result()
            self._agree_s += time.perf_counter() - t0
            self._round = None
            self.events.append({"it": self._it, "round": rnd.pick, "post": rnd.posted, "end": time.perf_counter(),
                                "agreed": agreed(picks, rnd.pick)})
            if agreed(picks, rnd.pick):
                self._agree_tasks += 1
                self._deferred = None
                return self.row[rnd.pick]
            best = min((p for p in picks if p != NONE), key=lambda p: self.prio[self.row[p]])
            self._deferred = None if best == rnd.pick else rnd.seen

    def _post(self, a: Action, done: set[Action], inbox) -> None:
        """Start a round with pick `a`; its completion notifies `inbox`."""
        def wake() -> None:
            with inbox.cv:
                inbox.cv.notify_all()
        t0 = time.perf_counter()
        # the round's callback wakes a rank waiting on its inbox; a rank with no feeding task blocks
        # on the round itself and needs none (one less Python thread wanting the GIL per round)
        callback = wake if self.job.wiring.backend != "nccl" and self.feeding else None
        self._round = Round(self.rowpos[a], self.tp_group, self.comm_device, callback, seen=self._changes(done),
                            posted=t0)
        self._agree_rounds += 1
        self._agree_s += time.perf_counter() - t0

    def _changes(self, done: set[Action]) -> int:
        """A count that grows whenever this rank's readiness may have changed: arrivals plus
        finished tasks."""
        return len(self.transport.inbox.arrivals) + len(done)

    def _feeding(self) -> frozenset[Action]:
        """The row's tasks that need no agreement and send a message (to another rank, or to a
        stage of this one): what may run while a round is in flight. The others (W, the first
        stage's empty I) feed only this rank's own later tasks, which rank below the pick."""
        return frozenset(a for a in self.row if a not in self.agreeing and produced_message(self.table, a) is not None)

    def _free(self, pending: list[Action], done: set[Action], local, feeding: bool = False) -> Action | None:
        """The best-ranked ready task that needs no agreement (`feeding`: of those, one of
        `self.feeding`; None: none)."""
        return next((a for a in pending if a not in self.agreeing and (not feeding or a in self.feeding)
                     and self._ready(a, done, local) and self._allowed(a)), None)

    def _check(self, inbox) -> None:
        if inbox.error is not None:
            raise inbox.error
        if self.delayed is not None and self.delayed.error is not None:
            raise self.delayed.error
        if self.control.aborted():
            raise Aborted()

    def _pick(self, pending: list[Action], done: set[Action], local) -> Action | None:
        if self.dispatch == "strict":
            return pending[0] if self._ready(pending[0], done, local) else None
        return next((a for a in pending if self._ready(a, done, local) and self._allowed(a)), None)

    def _next(self, pending: list[Action], done: set[Action], local) -> Action:
        """Block until an action may run: the row's next (strict) or the best-ranked ready one no
        cap holds back (ready_first; `pending` is in hint order). Records each decision's cost."""
        if self.tp_group is not None and self.dispatch == "ready_first":
            return self._agreed(pending, done, local)
        inbox = self.transport.inbox
        with inbox.cv:
            while True:
                self._check(inbox)
                t0 = time.perf_counter()
                if self.dispatch == "strict":
                    if self._ready(pending[0], done, local):
                        return pending[0]
                else:
                    for a in pending:
                        if self._ready(a, done, local) and self._allowed(a):
                            self._decisions.append(time.perf_counter() - t0)
                            return a
                inbox.cv.wait(timeout=0.05)

    def _account(self, a: Action, started: bool) -> None:
        """Live micro-batches and modelled activation bytes after `a` starts or ends."""
        if not self.gated:
            return
        alloc, free = self.job.arbitration.memory.get((a.stage, KIND_CODE[a.kind]), (0.0, 0.0))
        m = a.microbatch
        if started:
            self._mem += alloc
            if a.kind is ActionKind.F:
                if m not in self._started:
                    self._started.add(m)
                    self._adm_next += 1
                self._live[m] = self._live.get(m, 0) + 1
            return
        self._mem -= free
        if a.kind in (ActionKind.I, ActionKind.B):
            self._live[m] -= 1
            if self._live[m] == 0:
                del self._live[m]

    # one action ------------------------------------------------------------------------
    def _input(self, a: Action, local: dict[Key, torch.Tensor]) -> torch.Tensor | None:
        """The tensor `a` consumes: handed over in memory, arrived, or (inline) waited for now."""
        key = self._input_key(a)
        if key is None:
            return None
        return local.pop(key) if key in local else self.transport.take(key)

    def _run(self, a: Action, x: torch.Tensor | None, it: int) -> None:
        s, m = a.stage, a.microbatch
        out = None
        if a.kind is ActionKind.F:
            out = self.compute.forward(s, m, x)
        elif a.kind is ActionKind.W:
            self.compute.backward_weight(s, m)
        else:
            fn = self.compute.backward if a.kind is ActionKind.B else self.compute.backward_input
            out = fn(s, m, x)
        msg = produced_message(self.table, a)
        if msg is not None:
            self._deliver(msg[0], out, msg[1], it)

    def _deliver(self, key: Key, tensor: torch.Tensor, dst: int, it: int) -> None:
        """Hand `tensor` to pipeline rank `dst`: in memory, or to its TP rank of this one's index."""
        if dst == self.prank:
            self._local[key] = tensor
            return
        dst = self.grid.rank(dst, self.trank, self.drank)
        if self.delayed is None:
            self.transport.send(key, tensor, dst, it)
        else:
            arb = self.job.arbitration
            producer = key.stage - 1 if key.direction == FWD else key.stage + 1
            wait = float(arb.variability.send_delay(self.compute.draws, producer, key.microbatch,
                                                    0 if key.direction == FWD else 1, arb.delay_base_s))
            transport = self.transport
            self.delayed.later(time.perf_counter() + wait, lambda: transport.send(key, tensor, dst, it))

    def _inject(self, a: Action, it: int) -> None:
        f = self.job.fault
        if f is None or f.rank != self.rank or f.action != str(a) or f.iteration != it:
            return
        if f.kind == "raise":
            raise RuntimeError(f"injected fault at {a}")
        if f.kind == "exit":
            os.kill(os.getpid(), signal.SIGKILL)
        if f.kind == "hang":
            while not self.control.aborted():
                time.sleep(0.05)
            raise Aborted()

    def iteration(self, it: int) -> None:
        n_s, n_m = self.table.n_stages, self.table.n_microbatches
        # strict dispatch needs no arrival news: the dispatcher waits on each receive itself, as
        # torch's schedules do, so no waiter thread takes the GIL from a computing rank
        self.dispatch = "strict" if self.job.ab_strict and it % 2 == 0 else self.job.dispatch
        inline = self.dispatch == "strict"
        if self.job.wiring.transport == "ordered":
            self.transport = OrderedTransport(self.rank, n_s, n_m, self.device, Pairs(self.orders, self.pair_groups),
                                              self.comm_device, poll=self.job.wiring.backend == "nccl", inline=inline)
        else:
            self.transport = Transport(self.rank, n_s, n_m, self.device, self.comm_device, inline)
        self.compute.start_iteration(it // 2 if self.job.ab_strict else it)
        if self.grad_sync is not None:
            self.grad_sync.start_iteration()
        expected = expected_messages(self.job, self.prank, self.row)
        self.transport.post_receives(it, {k: (self.grid.rank(src, self.trank, self.drank), shape)
                                          for k, (src, shape) in expected.items()})
        self._local: dict[Key, torch.Tensor] = {}
        self._started: set[int] = set()
        self._live: dict[int, int] = {}
        self._adm_next, self._mem = 0, 0.0
        self._decisions: list[float] = []
        self._it = it
        self._agree_s, self._agree_rounds, self._agree_tasks = 0.0, 0, 0
        self._deferred: int | None = None       # after a disagreement: the change count of this rank's pick
        self._poll_s = 1e-4 if self.job.wiring.backend == "nccl" else 0.05   # NCCL rounds are polled, gloo's notify
        dist.barrier()
        begin, cpu = time.perf_counter(), time.process_time()
        pending, done = list(self.ranked if self.dispatch == "ready_first" else self.row), set()
        for n in range(len(self.row)):
            self.control.report(self.rank, it, n, min(map(self.rowpos.__getitem__, pending)), waiting=True)
            a = self._next(pending, done, self._local)
            x = self._input(a, self._local)
            self.control.report(self.rank, it, n, self.row.index(a), waiting=False)
            self._inject(a, it)
            t0 = time.perf_counter()
            self._account(a, True)
            self._run(a, x, it)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            self.events.append({"it": it, "action": str(a), "start": t0, "end": time.perf_counter()})
            self._account(a, False)
            if self.grad_sync is not None:
                self.grad_sync.done(a)
            pending.remove(a)
            done.add(a)
        if self.delayed is not None:
            self.delayed.drain()
        self.transport.finish_sends()
        if self.grad_sync is not None:
            self.grad_sync.finish()
        self.compute.sync_replicas(self.groups, self.rank)
        self.events.append({"it": it, "begin": begin, "finish": time.perf_counter(),
                            "cpu_s": time.process_time() - cpu,     # every thread of this rank
                            "dispatch_us": 1e6 * float(np.mean(self._decisions)) if self._decisions else None,
                            "agree_us": 1e6 * self._agree_s / self._agree_rounds if self._agree_rounds else None,
                            "agree_rounds": self._agree_rounds, "agree_tasks": self._agree_tasks,
                            "saved_peak_bytes": self.compute.saved_peak_bytes,
                            "state_bytes": self.compute.state_bytes(),
                            **({"dp_sync_start": dict(self.grad_sync.started), "dp_wait_s": self.grad_sync.wait_s}
                               if self.grad_sync is not None else {})})
        for key, dst, t, nbytes, held in self.transport.sent:
            self.events.append({"it": it, "send": tuple(key), "dst": dst, "start": t, "bytes": nbytes,
                                "held": held})
        for key, t in self.transport.inbox.arrivals.items():
            self.events.append({"it": it, "recv": tuple(key), "end": t})
        self.control.report(self.rank, it, len(self.row), -1, waiting=False)


def keep_heap() -> bool:
    """Ask glibc to keep freed memory for reuse (mmap threshold 64 MiB, trim threshold 1 GiB):
    by default a block above 128 KiB is mapped fresh and unmapped when freed, so every iteration
    page-faults its activations in again (6.5x the page faults of torch's own schedule processes on
    the same work here). Returns whether it applied (glibc only)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    return bool(mallopt(m_mmap_threshold, 64 << 20)) and bool(mallopt(m_trim_threshold, 1 << 30))


def report_failure(control: Control, rank: int, e: BaseException) -> None:
    """Tell the launcher why this rank stops: an abort (another rank failed first), a lost
    connection (a consequence) or its own error, with the traceback."""
    if isinstance(e, Aborted):
        control.fail(rank, "stopped because another rank failed", "", peer=True)
        return
    first = next((line.strip() for line in str(e).splitlines() if line.strip()), "")
    control.fail(rank, f"{type(e).__name__}: {first}", traceback.format_exc(),
                 peer=isinstance(e, ConnectionError))


def join(rank: int, job: RankJob) -> None:
    """A rank process's set-up: the allocator, its threads, its core, its GPU and the process
    group (unless torchrun's entry joined it already)."""
    keep_heap()
    torch.set_num_threads(job.compute.threads)
    if job.compute.cpus:
        os.sched_setaffinity(0, {job.compute.cpus[rank]})
    if job.wiring.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count())
    if not dist.is_initialized():
        dist.init_process_group(job.wiring.backend, init_method=job.wiring.init_method, rank=rank,
                                world_size=job.wiring.world)


def run_iterations(rank: int, job: RankJob, control: Control) -> None:
    """The runtime's own program: `job.iterations` iterations of the table (SGD after each at
    `job.lr`), then this rank's losses, gradients, events and weights into rank<R>.pt."""
    join(rank, job)
    worker = Rank(job, rank, control)
    losses, grads, shards = [], {}, {}
    for it in range(job.iterations):
        getattr(worker.compute, "inner", worker.compute).metering = job.metered is None or it in job.metered
        worker.iteration(it)
        losses.append(dict(worker.compute.losses))
        if it == job.iterations - 1 and worker.blocks is None:
            grads = worker.compute.named_grads()
        elif it == job.iterations - 1:
            shards = rank_shards(worker.compute.copies.values(), worker.blocks, job.seed,
                                 lambda p: p.grad if p.grad is not None else torch.zeros_like(p))
        if worker.opt is not None:
            worker.opt.step()
    stash = getattr(worker.compute, "weights", None)
    torch.save({"losses": losses, "grads": grads, "grad_shards": shards, "events": worker.events,
                "weights": stash.state() if stash is not None else {}},
               os.path.join(job.result_dir, f"rank{rank}.pt"))
    dist.barrier()
    control.finished(rank)


# what a rank process runs: program(rank, payload, control), e.g. `run_iterations` or a training loop
RankProgram = Callable[[int, Any, Control], None]


def rank_main(rank: int, payload: Any, control: Control, program: RankProgram = run_iterations) -> None:
    """Process entry point (the launcher passes the rank first): `program`, every failure
    reported to the launcher, then the process exits."""
    try:
        program(rank, payload, control)
    except BaseException as e:
        report_failure(control, rank, e)
        os._exit(1)
    os._exit(0)
