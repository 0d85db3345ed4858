"""Shared state between the launcher and its rank processes: where each rank is in its row,
who failed, and the abort flag every waiting rank polls."""
from __future__ import annotations

import queue
import sys
from dataclasses import dataclass

import torch.multiprocessing as mp

_FIELDS = 5   # iteration, actions done, row index of the current action, waiting, finished


@dataclass
class Failure:
    rank: int
    message: str
    traceback: str
    peer: bool          # a consequence of another rank's failure (lost connection, aborted)


class Control:
    """Created by the launcher in the spawn context and handed to every rank.

    Nothing here takes a lock the ranks share: a rank stopped (SIGSTOP, a debugger) while it
    held one would block the launcher's abort and every other rank's poll of it. The abort flag
    is a plain shared integer, as the positions and heartbeats are."""

    def __init__(self, world: int, ctx=None) -> None:
        ctx = ctx or mp.get_context("spawn")
        self.world = world
        self._abort = ctx.Value("i", 0, lock=False)
        self._status = ctx.Array("i", [0] * (world * _FIELDS), lock=False)
        self._beats = ctx.Array("i", [0] * world, lock=False)
        self._errors = ctx.Queue()

    # rank side -------------------------------------------------------------------------
    def report(self, rank: int, iteration: int, done: int, row_index: int, waiting: bool) -> None:
        base = rank * _FIELDS
        self._status[base:base + 4] = [iteration, done, row_index, int(waiting)]

    def aborted(self) -> bool:
        return bool(self._abort.value)

    def beat(self, rank: int) -> None:
        """The rank's process is alive and scheduled (its lifeline thread calls this)."""
        self._beats[rank] += 1

    def finished(self, rank: int) -> None:
        self._status[rank * _FIELDS + 4] = 1

    def fail(self, rank: int, message: str, tb: str, peer: bool) -> None:
        self._errors.put((rank, message, tb, peer))
        self._errors.close()
        self._errors.join_thread()
        self.abort()

    # launcher side ---------------------------------------------------------------------
    def abort(self) -> None:
        self._abort.value = 1

    def status(self, rank: int) -> tuple[int, int, int, bool, bool]:
        base = rank * _FIELDS
        it, done, idx, waiting, fin = self._status[base:base + _FIELDS]
        return it, done, idx, bool(waiting), bool(fin)

    def snapshot(self) -> tuple[int, ...]:
        return tuple(self._status[:])

    def beats(self) -> tuple[int, ...]:
        """Each rank's heartbeat count: one that stops moving is frozen (stopped, or stuck)."""
        return tuple(self._beats[:])

    def failures(self) -> list[Failure]:
        out = []
        while True:
            try:
                out.append(Failure(*self._errors.get_nowait()))
            except queue.Empty:
                return out


class TorchrunControl:
    """The same interface when torchrun launches the ranks: torchrun's agent watches the
    processes and tears the group down when one exits non-zero, so a failure is printed on
    stderr (rank, message, traceback) and the rank exits; positions are not shared."""

    def report(self, rank: int, iteration: int, done: int, row_index: int, waiting: bool) -> None:
        self.position = (iteration, done, row_index, waiting)

    def aborted(self) -> bool:
        return False

    def beat(self, rank: int) -> None:
        pass

    def finished(self, rank: int) -> None:
        pass

    def fail(self, rank: int, message: str, tb: str, peer: bool) -> None:
        where = getattr(self, "position", None)
        at = "" if where is None else f" (iteration {where[0]}, row position {where[2] + 1})"
        print(f"octopipe runtime: rank {rank} failed{at}: {message}\n{tb}", file=sys.stderr, flush=True)
