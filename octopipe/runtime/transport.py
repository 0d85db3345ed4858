"""Point-to-point messages keyed by (stage, micro-batch, direction), one tag per message.

Every receive a rank will need in an iteration is posted up front (each has its own tag and
buffer), and each gets a waiter thread: gloo's irecv only reports completion through wait(), so
the thread's return is how the dispatcher learns of an arrival, in whatever order messages come.
Sends are posted as soon as their tensor exists and never wait for anything else. Since every
receive is already posted and no send waits on another, the only waits left are the table's own
data dependencies: a valid table cannot deadlock here.
"""
from __future__ import annotations

import threading
import time
from typing import NamedTuple

import torch
import torch.distributed as dist

FWD, BWD = 0, 1


class Key(NamedTuple):
    """A message into `stage`: its input activation (FWD) or its output's gradient (BWD)."""

    stage: int
    microbatch: int
    direction: int


def tag_of(key: Key, iteration: int, n_stages: int, n_microbatches: int) -> int:
    return ((iteration % 64 * n_stages + key.stage) * n_microbatches + key.microbatch) * 2 + key.direction


class Inbox:
    """Arrived tensors by key, plus a condition the dispatcher waits on."""

    def __init__(self) -> None:
        self.cv = threading.Condition()
        self.items: dict[Key, torch.Tensor] = {}
        self.arrivals: dict[Key, float] = {}
        self.error: BaseException | None = None

    def put(self, key: Key, tensor: torch.Tensor) -> None:
        with self.cv:
            self.items[key] = tensor
            self.arrivals[key] = time.perf_counter()
            self.cv.notify_all()

    def fail(self, error: BaseException) -> None:
        with self.cv:
            if self.error is None:
                self.error = error
            self.cv.notify_all()

    def pop(self, key: Key) -> torch.Tensor:
        with self.cv:
            return self.items.pop(key)


class Transport:
    """Posts the receives of one iteration and the sends as they come, for one rank."""

    def __init__(self, rank: int, n_stages: int, n_microbatches: int, device: torch.device) -> None:
        self.rank, self.s, self.m, self.device = rank, n_stages, n_microbatches, device
        self.inbox = Inbox()
        self.sends: list[tuple[dist.Work, torch.Tensor]] = []
        self.sent: list[tuple[Key, int, float, int]] = []      # key, peer, post time, bytes

    def post_receives(self, iteration: int, expected: dict[Key, tuple[int, tuple[int, ...]]]) -> None:
        """`expected[key] = (source rank, shape)` for every message this rank will consume."""
        for key, (src, shape) in expected.items():
            buf = torch.empty(shape, device=self.device)
            work = dist.irecv(buf, src=src, tag=tag_of(key, iteration, self.s, self.m))
            threading.Thread(target=self._wait, args=(key, work, buf, src), daemon=True,
                             name=f"recv{key}").start()

    def _wait(self, key: Key, work, buf: torch.Tensor, src: int) -> None:
        try:
            work.wait()
        except BaseException as e:  # noqa: BLE001 - handed to the dispatcher, which reports it
            self.inbox.fail(ConnectionError(f"receive of {key} from rank {src} failed: {e}"))
            return
        self.inbox.put(key, buf)

    def send(self, key: Key, tensor: torch.Tensor, dst: int, iteration: int) -> None:
        tensor = tensor.contiguous()
        self.sent.append((key, dst, time.perf_counter(), tensor.numel() * tensor.element_size()))
        self.sends.append((dist.isend(tensor, dst=dst, tag=tag_of(key, iteration, self.s, self.m)), tensor))

    def finish_sends(self) -> None:
        for work, _ in self.sends:
            work.wait()
        self.sends.clear()
