"""Block-SGD methods on a block-partitioned objective (numpy; no process groups).

- `sgd`: sequential SGD, one micro-batch per step (the reference of LocalSGD with one replica);
- `block_sgd`: sample a stage and a batch, update that block at the current model;
- `pipedream`: PD exactly as its table dictates: a forward of micro-batch k at stage j stashes
  block j's current (or, for vsync/2BW, the rule's) version; each update of stage s applies
  grad_s f_k(z) at the stale mixed model z the stashes give (2BW: the window's mean, once);
- `rpd`: Randomized PipeDream: per step sample a stage, a batch and per-stage read delays
  (uniform in [0, delta], or rows of PD's own delays), read z = (w_j^{k-d_j})_j from the update
  history and update only the sampled block;
- `localsgd`: LocalSGD-1F1B: R replicas, H local steps, averaging at each round's end;
- `sync_1f1b`: synchronous 1F1B: one update of every block per flushed window of m micro-batches.

Every method takes a `Recorder` that evaluates the objective at checkpoints of both clocks and
keeps the largest stochastic gradient norm seen (G^2 of the bound).
"""
from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from octopipe.asynchronous.clocks import Clock
from octopipe.asynchronous.objectives import Objective
from octopipe.asynchronous.staleness import Delays
from octopipe.asynchronous.tables import AsyncSchedule, Rule
from octopipe.errors import ConfigError
from octopipe.schedule.action import Action, B, F


@dataclass
class Recorder:
    """Objective values at the tick checkpoints and the seconds checkpoints of one run.

    `step(tick, second)` is called before each update, with the update's time; the model as
    it stands is recorded for every checkpoint that time passes. `grad_norms` also records
    ||grad f||² at the tick checkpoints (for the bound).
    """

    objective: Objective
    tick_points: np.ndarray
    second_points: np.ndarray
    grad_norms: bool = False
    ticks_values: list[float] = field(default_factory=list)
    seconds_values: list[float] = field(default_factory=list)
    grad_sq: list[float] = field(default_factory=list)
    g2: float = 0.0
    updates_in_budget: int = 0

    def step(self, w: np.ndarray, tick: float, second: float) -> None:
        while len(self.ticks_values) < len(self.tick_points) and self.tick_points[len(self.ticks_values)] < tick:
            self._tick_record(w)
        while (len(self.seconds_values) < len(self.second_points)
               and self.second_points[len(self.seconds_values)] < second):
            self.seconds_values.append(self.objective.value(w))
        if len(self.tick_points) and tick <= self.tick_points[-1]:
            self.updates_in_budget += 1

    def _tick_record(self, w: np.ndarray) -> None:
        self.ticks_values.append(self.objective.value(w))
        if self.grad_norms:
            g = self.objective.full_grad(w)
            self.grad_sq.append(float(g @ g))

    def seen(self, g: np.ndarray) -> None:
        self.g2 = max(self.g2, float(g @ g))

    def finish(self, w: np.ndarray) -> Run:
        while len(self.ticks_values) < len(self.tick_points):
            self._tick_record(w)
        while len(self.seconds_values) < len(self.second_points):
            self.seconds_values.append(self.objective.value(w))
        return Run(np.asarray(self.ticks_values), np.asarray(self.seconds_values),
                   np.asarray(self.grad_sq), self.g2, self.updates_in_budget, w)


@dataclass(frozen=True)
class Run:
    """A method's objective at the checkpoints of each clock, and what the bound needs."""

    ticks_values: np.ndarray
    seconds_values: np.ndarray
    grad_sq: np.ndarray
    g2: float
    updates: int
    final_w: np.ndarray


def no_recorder(objective: Objective) -> Recorder:
    """A recorder with no checkpoints (tests compare final weights)."""
    return Recorder(objective, np.zeros(0), np.zeros(0))


def _check_lr(lr: float) -> None:
    if not lr > 0:
        raise ConfigError(f"lr must be positive, got {lr}")


def sgd(obj: Objective, lr: float, batches: Sequence[int], rec: Recorder | None = None) -> Run:
    """w <- w - lr·grad f_b(w) for each batch b in order."""
    _check_lr(lr)
    rec = rec or no_recorder(obj)
    w = obj.init()
    for k, b in enumerate(batches):
        rec.step(w, k, k)
        g = obj.grad(w, b)
        rec.seen(g)
        w = w - lr * g
    return rec.finish(w)


def block_sgd(obj: Objective, lr: float, steps: int, seed: int = 0) -> np.ndarray:
    """Synchronous randomized block SGD: sample a stage and a batch, update that block."""
    _check_lr(lr)
    rng = np.random.default_rng(seed)
    w = obj.init()
    S = len(obj.blocks)
    for _ in range(steps):
        s = int(rng.integers(0, S))
        b = int(rng.integers(0, obj.n_batches))
        blk = obj.blocks[s]
        w = w.copy()
        w[blk] -= lr * obj.grad(w, b)[blk]
    return w


def pipedream(obj: Objective, sched: AsyncSchedule, lr: float, batches: Sequence[int],
              clock: Clock, rec: Recorder | None = None) -> Run:
    """PD (or vsync / 2BW) replayed from its table: stashes, stale mixed models, updates."""
    _check_lr(lr)
    rec = rec or no_recorder(obj)
    S, blocks = sched.n_stages, obj.blocks
    w = obj.init()
    versions: list[list[np.ndarray | None]] = [[w[blk].copy()] for blk in blocks]  # by number
    keep = 2 * (S + sched.window) + 2     # reads lag the current version by less than this
    stash: dict[int, list[np.ndarray | None]] = {}
    grads: dict[int, np.ndarray] = {}
    acc: list[np.ndarray | None] = [None] * S
    for e in sched.events:
        a = e.action
        mb = a.microbatch
        if a.kind is F:
            stash.setdefault(mb, [None] * S)[a.stage] = versions[a.stage][e.version]
            continue
        if a.kind is not B:
            raise ConfigError("the optimizers run full backwards (B); split tables run on the runtime")
        if mb not in grads:
            z = np.concatenate(stash[mb])
            grads[mb] = obj.grad(z, batches[mb])
            rec.seen(grads[mb])
        g = grads[mb][blocks[a.stage]]
        acc[a.stage] = g if acc[a.stage] is None else acc[a.stage] + g
        if a.stage == 0:
            del grads[mb], stash[mb]
        if e.update < 0:
            continue
        rec.step(w, clock.ticks[a], clock.seconds[a])
        step = acc[a.stage] / (sched.window if sched.rule is Rule.TWO_BW else 1)
        acc[a.stage] = None
        new = versions[a.stage][-1] - lr * step
        versions[a.stage].append(new)
        if len(versions[a.stage]) > keep:
            versions[a.stage][-keep - 1] = None
        w = w.copy()
        w[blocks[a.stage]] = new
    return rec.finish(w)


@dataclass(frozen=True)
class RPDSampling:
    """How RPD draws each step: `delta` for uniform delays in [0, delta], or `pd_delays` (the
    steady rows of PD's own delays; a row is drawn for the sampled stage); with `replay`, step
    k takes stage, batch and delays of PD's k-th update exactly (then RPD is PD)."""

    delta: int = 0
    pd_delays: Delays | None = None
    replay: bool = False


def rpd(obj: Objective, lr: float, steps: int, sampling: RPDSampling, seed: int = 0,
        rec_and_times: tuple[Recorder, Sequence[tuple[float, float]]] | None = None,
        batches: Sequence[int] = ()) -> Run:
    """Randomized PipeDream: stale mixed reads from the update history, one block per step.

    `rec_and_times`: a recorder and the (tick, second) of each step (RPD runs on PD's clock).
    `batches`: the micro-batch → batch map for `replay`."""
    _check_lr(lr)
    if sampling.delta < 0:
        raise ConfigError(f"delta must be >= 0, got {sampling.delta}")
    rng = np.random.default_rng(seed)
    rec, times = rec_and_times if rec_and_times is not None else (no_recorder(obj), None)
    S, blocks = len(obj.blocks), obj.blocks
    w = obj.init()
    hist_k: list[list[int]] = [[0] for _ in range(S)]          # history index each version starts at
    hist_w: list[list[np.ndarray]] = [[w[blk].copy()] for blk in blocks]
    pd = sampling.pd_delays
    reach = int(pd.delays.max()) if pd is not None else sampling.delta
    rows_by_stage = ({s: np.flatnonzero(pd.stage == s) for s in range(S)} if pd is not None else {})
    for k in range(steps):
        if sampling.replay:
            s, b, d = int(pd.stage[k]), batches[int(pd.microbatch[k])], pd.delays[k]
        else:
            s = int(rng.integers(0, S))
            b = int(rng.integers(0, obj.n_batches))
            if pd is not None:
                d = pd.delays[rng.choice(rows_by_stage[s])]
            elif sampling.delta:
                d = rng.integers(0, sampling.delta + 1, size=S)
            else:                      # delta = 0 draws nothing: the same draws as block_sgd
                d = np.zeros(S, dtype=np.int64)
        z = np.concatenate([_version_at(hist_k[j], hist_w[j], max(0, k - int(d[j]))) for j in range(S)])
        g = obj.grad(z, b)
        rec.seen(g)
        if times is not None:
            rec.step(w, *times[k])
        new = hist_w[s][-1] - lr * g[blocks[s]]
        hist_k[s].append(k + 1)
        hist_w[s].append(new)
        w = w.copy()
        w[blocks[s]] = new
        if k % 64 == 63:
            _trim(hist_k, hist_w, k + 1 - reach)
    return rec.finish(w)


def _trim(starts: list[list[int]], values: list[list[np.ndarray]], oldest: int) -> None:
    """Drop the versions no read at history index >= `oldest` can reach."""
    for j in range(len(starts)):
        i = bisect.bisect_right(starts[j], oldest) - 1
        if i > 0:
            del starts[j][:i], values[j][:i]


def _version_at(starts: list[int], values: list[np.ndarray], h: int) -> np.ndarray:
    """Block value at history index h: the latest version that started at or before h."""
    return values[bisect.bisect_right(starts, h) - 1]


def localsgd(obj: Objective, lr: float, rows: Sequence[Sequence[Action | None]], replicas: int,
             local_steps: int, batches: Sequence[int], clock: Clock,
             rec: Recorder | None = None) -> Run:
    """LocalSGD-1F1B replayed from its tick table: replica k mod R runs exact SGD; at the end
    of each round (stage 0's last backward of it) all replicas are averaged. The recorded
    model is the replicas' mean."""
    _check_lr(lr)
    rec = rec or no_recorder(obj)
    S, blocks, R = len(rows), obj.blocks, replicas
    rnd = R * local_steps
    models = [obj.init() for _ in range(R)]
    stash: dict[int, list[np.ndarray | None]] = {}
    grads: dict[int, np.ndarray] = {}
    n_mb = max(a.microbatch for r in rows for a in r if a is not None) + 1
    for t in range(max(len(r) for r in rows)):
        for s in range(S):
            a = rows[s][t] if t < len(rows[s]) else None
            if a is None:
                continue
            mb, r = a.microbatch, a.microbatch % R
            if a.kind is F:
                stash.setdefault(mb, [None] * S)[s] = models[r][blocks[s]].copy()
                continue
            if mb not in grads:
                grads[mb] = obj.grad(np.concatenate(stash[mb]), batches[mb])
                rec.seen(grads[mb])
            rec.step(sum(models) / R, clock.ticks[a], clock.seconds[a])
            models[r] = models[r].copy()
            models[r][blocks[s]] -= lr * grads[mb][blocks[s]]
            if s == 0:
                del grads[mb], stash[mb]
                if (mb + 1) % rnd == 0 or mb == n_mb - 1:
                    mean = sum(models) / R
                    models = [mean.copy() for _ in range(R)]
    return rec.finish(sum(models) / R)


def sync_1f1b(obj: Objective, lr: float, window: int, batches: Sequence[int],
              window_time: tuple[float, float], rec: Recorder | None = None) -> Run:
    """Synchronous 1F1B: per flushed window of `window` micro-batches, one step of every block
    with the window's mean gradient at the current model; `window_time` = (ticks, seconds)."""
    _check_lr(lr)
    rec = rec or no_recorder(obj)
    w = obj.init()
    for i in range(len(batches) // window):
        g = sum(obj.grad(w, b) for b in batches[i * window:(i + 1) * window]) / window
        rec.seen(g)
        rec.step(w, (i + 1) * window_time[0], (i + 1) * window_time[1])
        w = w - lr * g
    return rec.finish(w)


def theory_bound(S: int, lr: float, K: int, L: float, G2: float, delta: float, gap: float) -> float:
    """The paper's RPD bound on (1/K)·sum_k E||grad f(w^k)||²:
    2S(f(w0) - f*)/(lr·K) + lr·S·L·G² + lr²·L²·delta²·G²."""
    return float(2 * S * gap / (lr * K) + lr * S * L * G2 + lr ** 2 * L ** 2 * delta ** 2 * G2)


__all__ = ["RPDSampling", "Recorder", "Run", "block_sgd", "localsgd", "no_recorder", "pipedream",
           "rpd", "sgd", "sync_1f1b", "theory_bound"]
