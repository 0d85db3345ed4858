"""Point-to-point messages keyed by (stage, micro-batch, direction), in two transports.

`tagged` (gloo): every receive a rank will need in an iteration is posted up front, each with
its own tag and buffer, and each gets a waiter (a pooled thread blocked in its wait(), `Waiters`):
gloo's irecv only reports completion through wait(), so the waiter's return is how the dispatcher
learns of an arrival, in whatever order messages come. Sends are posted as soon as their tensor exists. gloo matches
messages by
tag, so no transfer waits on another and the only waits left are the table's own data
dependencies.

`ordered` (NCCL, and gloo on request): NCCL ignores tags and matches the point-to-point
messages between two ranks by posting order, and a posted, unmatched receive blocks every later
operation of that communicator. So each ordered pair (src, dst) that carries messages gets a
process group of its own (a pending receive from B never blocks a send to B), and both ends
post that pair's messages in one canonical order (`pair_orders` in worker.py: the order in
which src's row produces them). The receiver posts all of its receives up front in that order;
the sender holds a message produced early (ready_first) until every message canonically before
it on the pair has been posted, then releases them together. Arrivals: a waiter thread per
receive on gloo; on NCCL, where wait() only makes the current CUDA stream wait, one poller
thread asks is_completed() (which queries the CUDA event) and the dispatcher calls wait() before
it uses the buffer.

Why no valid table deadlocks under `ordered`: take a minimal unfinished action x in the acyclic
graph of row order plus data dependencies (validate() proves it acyclic). All its predecessors
have finished. Every message canonically before x's input on that pair was produced by an
action earlier in the sender's row than x's producer, hence a predecessor of x, hence finished;
so x's input was released, and since receives are posted up front in the same order (FIFO per
pair) it arrives. x is then its row's first unfinished action and ready, so strict and
ready_first both run it.

Devices: receive buffers live where the backend communicates (CUDA for NCCL, CPU for gloo); with
gloo and CUDA compute (gloo's send/recv take CPU tensors only) a send copies its tensor to the
CPU and `take` moves an arrived tensor to the compute device.
"""
from __future__ import annotations

import queue
import threading
import time
from collections import deque
from typing import NamedTuple

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import _get_default_group

from octopipe.errors import ScheduleError

FWD, BWD = 0, 1
TRANSPORTS = ("auto", "tagged", "ordered")
DEVICES = ("auto", "cpu", "cuda")


class Key(NamedTuple):
    """A message into `stage`: its input activation (FWD) or its output's gradient (BWD)."""

    stage: int
    microbatch: int
    direction: int


class Pairs(NamedTuple):
    """The ordered pairs (src, dst) of ranks that exchange messages on the `ordered` transport:
    each pair's canonical message order and its process group."""

    orders: dict[tuple[int, int], list[Key]]
    groups: dict[tuple[int, int], object]


def tag_of(key: Key, iteration: int, n_stages: int, n_microbatches: int) -> int:
    return ((iteration % 64 * n_stages + key.stage) * n_microbatches + key.microbatch) * 2 + key.direction


def choose_transport(backend: str, transport: str = "auto", device: str = "auto",
                     cuda_available: bool | None = None) -> tuple[str, str]:
    """Resolve `auto` and reject combinations that cannot work: returns (transport, device)."""
    if backend not in ("gloo", "nccl"):
        raise ScheduleError(f"runtime.backend={backend!r}: choose gloo or nccl")
    if transport not in TRANSPORTS:
        raise ScheduleError(f"runtime.transport={transport!r}: choose one of {', '.join(TRANSPORTS)}")
    if device not in DEVICES:
        raise ScheduleError(f"runtime.device={device!r}: choose one of {', '.join(DEVICES)}")
    if transport == "auto":
        transport = "ordered" if backend == "nccl" else "tagged"
    if transport == "tagged" and backend == "nccl":
        raise ScheduleError("runtime.transport=tagged with backend=nccl: NCCL matches messages by order; "
                            "use transport=ordered or auto")
    if device == "auto":
        device = "cuda" if backend == "nccl" else "cpu"
    if backend == "nccl" and device == "cpu":
        raise ScheduleError("runtime.device=cpu with backend=nccl: NCCL moves CUDA tensors only; "
                            "use device=cuda (or auto), or backend=gloo for CPU ranks")
    if device == "cuda" and not (torch.cuda.is_available() if cuda_available is None else cuda_available):
        if backend == "nccl":
            raise ScheduleError("runtime.backend=nccl needs CUDA devices and this machine has none; "
                                "use backend=gloo (device=cpu)")
        raise ScheduleError("runtime.device=cuda but CUDA is not available on this machine; "
                            "use device=cpu (or auto) with backend=gloo")
    return transport, device


def _default_group():
    return _get_default_group()


class Waiters:
    """Long-lived threads that each block in one receive's wait(), one per outstanding receive.

    Starting a thread per receive made every iteration pay a thread start per message (the
    caller blocks until the new thread has run), which on ranks that share cores is CPU the
    compute needs. The pool grows to the most receives outstanding at once and then reuses its
    threads; a job is only queued when an idle thread is reserved for it (or a new one started),
    so no receive ever waits behind another's wait()."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.idle = 0
        self.started = 0

    def submit(self, job) -> None:
        with self._lock:
            if self.idle > 0:
                self.idle -= 1
            else:
                self.started += 1
                threading.Thread(target=self._loop, daemon=True, name=f"recv-waiter-{self.started}").start()
        self._jobs.put(job)

    def _loop(self) -> None:
        while True:
            self._jobs.get()()
            with self._lock:
                self.idle += 1


WAITERS = Waiters()


class Inbox:
    """Arrived tensors by key, plus a condition the dispatcher waits on."""

    def __init__(self) -> None:
        self.cv = threading.Condition()
        self.items: dict[Key, torch.Tensor] = {}
        self.works: dict[Key, dist.Work] = {}     # NCCL: wait() before the buffer is read
        self.arrivals: dict[Key, float] = {}
        self.error: BaseException | None = None

    def put(self, key: Key, tensor: torch.Tensor, work: dist.Work | None = None) -> None:
        with self.cv:
            self.items[key] = tensor
            if work is not None:
                self.works[key] = work
            self.arrivals[key] = time.perf_counter()
            self.cv.notify_all()

    def fail(self, error: BaseException) -> None:
        with self.cv:
            if self.error is None:
                self.error = error
            self.cv.notify_all()

    def pop(self, key: Key) -> tuple[torch.Tensor, dist.Work | None]:
        with self.cv:
            return self.items.pop(key), self.works.pop(key, None)


class Transport:
    """The `tagged` transport: posts the receives of one iteration, and the sends as they come.

    `device` is where compute happens; `comm_device` where the backend reads and writes
    tensors. When they differ (gloo with CUDA compute) messages are staged through the CPU.
    """

    def __init__(self, rank: int, n_stages: int, n_microbatches: int, device: torch.device,
                 comm_device: torch.device | None = None, inline: bool = False) -> None:
        self.rank, self.s, self.m, self.device = rank, n_stages, n_microbatches, device
        self.comm_device = comm_device or device
        self.inbox = Inbox()
        self.inline = inline     # strict dispatch: the dispatcher itself waits for each receive
        self.posted: dict[Key, tuple] = {}
        self.sends: list[tuple[dist.Work, torch.Tensor]] = []
        self.sent: list[tuple[Key, int, float, int, bool]] = []   # key, peer, post time, bytes, held

    def _group(self, src: int, dst: int):
        return None

    def _endpoint(self, src: int, dst: int, peer: int):
        """The process group carrying src -> dst and `peer`'s rank in it. Posting on the group
        object directly skips torch.distributed's per-call checks (a few percent of a rank's time
        on tiny stages)."""
        group = self._group(src, dst)
        if group is None:
            return _default_group(), peer
        return group, dist.get_group_rank(group, peer)

    def post_receives(self, iteration: int, expected: dict[Key, tuple[int, tuple[int, ...]]]) -> None:
        """`expected[key] = (source rank, shape)` for every message this rank will consume."""
        for key, (src, shape) in expected.items():
            self._wait_on(key, self._irecv(key, src, shape, iteration), src)

    def _irecv(self, key: Key, src: int, shape: tuple[int, ...], iteration: int):
        buf = torch.empty(shape, device=self.comm_device)
        group, peer = self._endpoint(src, self.rank, src)
        return group.recv([buf], peer, tag_of(key, iteration, self.s, self.m)), buf

    def _wait_on(self, key: Key, posted, src: int) -> None:
        work, buf = posted
        if self.inline:
            self.posted[key] = (work, buf, src)
            return
        WAITERS.submit(lambda: self._wait(key, work, buf, src))

    def _wait(self, key: Key, work, buf: torch.Tensor, src: int) -> None:
        try:
            work.wait()
        except BaseException as e:
            self.inbox.fail(ConnectionError(f"receive of {key} from rank {src} failed: {e}"))
            return
        self.inbox.put(key, buf)

    def expects(self, key: Key) -> bool:
        """Whether `take(key)` can be called now: arrived, or (inline) posted and waited for there."""
        return key in self.inbox.items or key in self.posted

    def take(self, key: Key) -> torch.Tensor:
        """An arrived message, on the compute device; an inline receive is waited for here."""
        if key in self.posted:
            work, tensor, src = self.posted.pop(key)
            try:
                work.wait()
            except BaseException as e:
                raise ConnectionError(f"receive of {key} from rank {src} failed: {e}") from e
            self.inbox.arrivals[key] = time.perf_counter()
        else:
            tensor, work = self.inbox.pop(key)
            if work is not None:
                work.wait()
        return tensor.to(self.device) if tensor.device != self.device else tensor

    def _stage(self, tensor: torch.Tensor) -> torch.Tensor:
        tensor = tensor.detach()
        if tensor.device != self.comm_device:
            tensor = tensor.to(self.comm_device)
        return tensor.contiguous()

    def _post(self, key: Key, tensor: torch.Tensor, dst: int, iteration: int, held: bool) -> None:
        self.sent.append((key, dst, time.perf_counter(), tensor.numel() * tensor.element_size(), held))
        group, peer = self._endpoint(self.rank, dst, dst)
        work = group.send([tensor], peer, tag_of(key, iteration, self.s, self.m))
        self.sends.append((work, tensor))

    def send(self, key: Key, tensor: torch.Tensor, dst: int, iteration: int) -> None:
        self._post(key, self._stage(tensor), dst, iteration, held=False)

    def finish_sends(self) -> None:
        for work, _ in self.sends:
            work.wait()
        self.sends.clear()


class OrderedTransport(Transport):
    """The `ordered` transport: per-pair process groups, each pair's messages in canonical order.

    `pairs.groups[(src, dst)]` is the process group of that ordered pair; `pairs.orders[(src,
    dst)]` the canonical message order on it (`pair_orders`). `poll=True` (NCCL) learns of
    arrivals by polling is_completed() instead of a thread blocked in wait() per receive.
    """

    def __init__(self, rank: int, n_stages: int, n_microbatches: int, device: torch.device, pairs: Pairs,
                 comm_device: torch.device | None = None, poll: bool = False, inline: bool = False) -> None:
        super().__init__(rank, n_stages, n_microbatches, device, comm_device, inline and not poll)
        self.groups, self.orders, self.poll = pairs.groups, pairs.orders, poll
        self._next = {pair: 0 for pair in self.orders if pair[0] == rank}
        self._held: dict[tuple[int, int], dict[Key, tuple[torch.Tensor, bool]]] = \
            {pair: {} for pair in self._next}
        self.n_held = 0

    def _group(self, src: int, dst: int):
        return self.groups[(src, dst)]

    def post_receives(self, iteration: int, expected: dict[Key, tuple[int, tuple[int, ...]]]) -> None:
        queues = []
        for (src, dst), order in sorted(self.orders.items()):
            if dst != self.rank:
                continue
            if set(order) != {k for k, (s, _) in expected.items() if s == src}:
                raise RuntimeError(f"rank {self.rank}: the canonical order from rank {src} does not list "
                                   f"the messages this rank expects from it")
            posted = [(key, *self._irecv(key, src, expected[key][1], iteration)) for key in order]
            if self.poll:
                queues.append(deque(posted))
            else:
                for key, work, buf in posted:
                    self._wait_on(key, (work, buf), src)
        if queues:
            threading.Thread(target=self._poll, args=(queues,), daemon=True, name="recv-poller").start()

    def _poll(self, queues: list[deque]) -> None:
        """Receives on one pair complete in posting order: watch the head of each pair's queue."""
        try:
            while queues:
                for q in queues:
                    while q and q[0][1].is_completed():
                        key, work, buf = q.popleft()
                        self.inbox.put(key, buf, work)
                queues = [q for q in queues if q]
                time.sleep(1e-4)
        except BaseException as e:
            self.inbox.fail(ConnectionError(f"rank {self.rank}: polling receives failed: {e}"))

    def send(self, key: Key, tensor: torch.Tensor, dst: int, iteration: int) -> None:
        pair = (self.rank, dst)
        order, held = self.orders[pair], self._held[pair]
        early = self._next[pair] >= len(order) or order[self._next[pair]] != key
        self.n_held += early
        held[key] = (self._stage(tensor), early)
        while self._next[pair] < len(order) and order[self._next[pair]] in held:
            k = order[self._next[pair]]
            t, was_held = held.pop(k)
            self._post(k, t, dst, iteration, was_held)
            self._next[pair] += 1

    def finish_sends(self) -> None:
        stuck = {pair: list(h) for pair, h in self._held.items() if h}
        if stuck:
            raise RuntimeError(f"rank {self.rank}: messages produced but never released: {stuck}")
        super().finish_sends()
