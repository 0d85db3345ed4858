"""Runtime variability: each action's time scaled by the shared jitter model, sends delayed.

`Jittered` wraps a rank's compute. Each iteration draws from `octopipe.sim.variability`
(`Variability.draws` on `numpy.random.default_rng((seed, iteration))`, what the simulator's
`run(jitter=..., seed=(seed, iteration))` draws). Emulated compute sleeps its modelled time times
the action's factor; real compute runs the action, then does `(factor - 1)` times its measured
time of extra work (matrix products on the rank's core, so the core is really busy; factors
below 1 are floored at 1 by the model's `floor`). On the CPU that time is the compute thread's
CPU time (`time.thread_time`), the work the action did: it leaves out time blocked in a
collective or descheduled, so the TP ranks of a stage, which run the same work, do the same
extra work, as one device would (their wall times differ by how long each waited in the
all-reduces); on a GPU it is the wall time after a synchronize. `DelayedSender` posts a send after its drawn
delay from a thread of its own, so the rank keeps computing meanwhile.
"""
from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Callable

import numpy as np
import torch

from octopipe.sim.variability import Draws, Variability

F, I, W, B = 0, 1, 2, 3


def busy_work(seconds: float, device: torch.device, clock: Callable[[], float] = time.perf_counter) -> int:
    """Matrix products for `seconds` of `clock` on `device`; how many ran."""
    a = torch.full((96, 96), 1e-3, device=device)
    end = clock() + seconds
    n = 0
    while clock() < end:
        a = torch.tanh(a @ a)
        n += 1
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return n


class Jittered:
    """A compute (real or emulated) whose actions take their modelled or real time times the
    draws' factor for (stage, kind, micro-batch, this rank)."""

    def __init__(self, inner, model: Variability, rank: int, seed: int, shape: tuple[int, int],
                 device: torch.device) -> None:
        self.inner, self.model, self.rank, self.seed = inner, model, rank, seed
        self.n_stages, self.n_mb = shape
        self.emulated = hasattr(inner, "durations")
        self.device = device
        self.draws: Draws | None = None
        self.factors: list[tuple[int, int, int, float]] = []   # stage, kind, mb, factor (this iteration)

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def start_iteration(self, iteration: int) -> None:
        self.draws = self.model.draws(np.random.default_rng((self.seed, iteration)), self.n_stages, self.n_mb)
        self.factors = []
        self.inner.start_iteration(iteration)

    def factor(self, stage: int, kind: int, mb: int) -> float:
        return float(self.model.compute_factor(self.draws, stage, kind, mb, self.rank))

    def _do(self, stage: int, kind: int, mb: int, call: Callable):
        f = self.factor(stage, kind, mb)
        self.factors.append((stage, kind, mb, f))
        if self.emulated:
            base = self.inner.durations[stage]
            self.inner.durations[stage] = tuple(v * f for v in base)
            try:
                return call()
            finally:
                self.inner.durations[stage] = base
        clock = time.perf_counter if self.device.type == "cuda" else time.thread_time
        t0 = clock()
        out = call()
        if f > 1.0:
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            busy_work((f - 1.0) * (clock() - t0), self.device, clock)
        return out

    def forward(self, stage: int, mb: int, x):
        return self._do(stage, F, mb, lambda: self.inner.forward(stage, mb, x))

    def backward(self, stage: int, mb: int, grad):
        return self._do(stage, B, mb, lambda: self.inner.backward(stage, mb, grad))

    def backward_input(self, stage: int, mb: int, grad):
        return self._do(stage, I, mb, lambda: self.inner.backward_input(stage, mb, grad))

    def backward_weight(self, stage: int, mb: int):
        return self._do(stage, W, mb, lambda: self.inner.backward_weight(stage, mb))


class DelayedSender:
    """Runs `post()` callables at their due times, in due order, from one thread (a rank with
    send delays posts every send through it)."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._heap: list[tuple[float, int, Callable]] = []
        self._n = 0
        self._pending = 0
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, daemon=True, name="octopipe-delay")
        self._thread.start()

    def later(self, due: float, post: Callable[[], None]) -> None:
        with self._cv:
            heapq.heappush(self._heap, (due, self._n, post))
            self._n += 1
            self._pending += 1
            self._cv.notify_all()

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._heap or self._heap[0][0] > time.perf_counter():
                    wait = None if not self._heap else self._heap[0][0] - time.perf_counter()
                    self._cv.wait(timeout=wait)
                _, _, post = heapq.heappop(self._heap)
            try:
                post()
            except BaseException as e:
                self.error = e
            with self._cv:
                self._pending -= 1
                self._cv.notify_all()

    def drain(self) -> None:
        """Wait until every delayed send has been posted."""
        with self._cv:
            while self._pending:
                self._cv.wait(timeout=0.05)
        if self.error is not None:
            raise self.error
