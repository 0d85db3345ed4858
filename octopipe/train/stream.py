"""Asynchronous training in mode=train: `schedule=pipedream | pipedream_vsync | pipedream_2bw`.

The steps `start .. steps-1` run as ONE stream of (steps - start) x microbatches micro-batches
in PipeDream's 1F1B order, with no flush inside it: micro-batch k of the stream is micro-batch
k mod M of step start + k // M (the synchronous run's data order). Each rank keeps the weight
versions its stage's in-flight micro-batches read (`asynchronous.runtime.WeightStash`) and
applies the trainer's AdamW to its stage after every backward (PD, vsync) or once per window of
W = pp micro-batches with the window's mean gradient (2BW); each update clips by its own
stage's norm (there is no global norm mid-stream) and runs at the learning rate of the step
its micro-batches belong to. The stream drains only at its end, so a checkpoint is written
there (one version per stage: nothing in flight) and a resumed run is a new stream; the
checkpoint's `streams` lists the streams so far, which the single-process replay repeats.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from octopipe.asynchronous.runtime import Replay, replay_stream
from octopipe.asynchronous.tables import ASYNC_SCHEDULES, AsyncSchedule, Rule, async_schedule
from octopipe.config.schema import Config
from octopipe.errors import ConfigError
from octopipe.runtime.stage import StageModule
from octopipe.train.optim import OptimSettings, StageOptimizers
from octopipe.train.tied import ModelNames


def rule_of(cfg: Config) -> Rule | None:
    """The asynchronous rule `schedule=<name>` asks for, or None (a synchronous schedule)."""
    return ASYNC_SCHEDULES.get(cfg.schedule.name or "")


@dataclass(frozen=True)
class Stream:
    """Steps `start .. steps-1` of `microbatches` micro-batches each on `stages` stages as one
    stream under `rule` (2BW: window `window`)."""

    rule: Rule
    stages: int
    microbatches: int
    start: int
    steps: int
    window: int = 1

    @property
    def length(self) -> int:
        return (self.steps - self.start) * self.microbatches

    @property
    def updates_per_step(self) -> int:
        return self.microbatches // self.window

    def schedule(self) -> AsyncSchedule:
        return async_schedule(self.rule, self.stages, self.length,
                              self.window if self.rule is Rule.TWO_BW else None)


def stream_of(cfg: Config, start: int) -> Stream:
    rule = rule_of(cfg)
    t = cfg.train
    return Stream(rule, t.pp, t.microbatches, start, t.steps, t.pp if rule is Rule.TWO_BW else 1)


def check_async(cfg: Config, start: int | None = 0) -> None:
    """Refuse, one line each naming the field, what an asynchronous stream cannot train
    (`start`: the step the stream begins at; None before it is known: checkpoints not checked)."""
    rule, t = rule_of(cfg), cfg.train
    if rule is None:
        return
    name = cfg.schedule.name
    if t.pp < 2:
        raise ConfigError(f"train.pp={t.pp}: schedule={name} pipelines stages across ranks; set train.pp >= 2")
    if t.microbatches < t.pp:
        raise ConfigError(f"train.microbatches={t.microbatches}: schedule={name} needs at least train.pp={t.pp} "
                          f"micro-batches per step (its stream reaches a steady state); set train.microbatches >= "
                          f"{t.pp}")
    if rule is Rule.TWO_BW and t.microbatches % t.pp:
        raise ConfigError(f"train.microbatches={t.microbatches}: pipedream_2bw's window W = train.pp = {t.pp} must "
                          f"divide it (one update per window); set train.microbatches to a multiple of {t.pp}")
    if cfg.runtime.tp > 1:
        raise ConfigError(f"runtime.tp={cfg.runtime.tp}: schedule={name} trains one rank per stage (no tensor "
                          f"parallelism); set runtime.tp=1")
    if t.tp > 1:
        raise ConfigError(f"train.tp={t.tp}: schedule={name} trains one rank per stage (no tensor parallelism); "
                          f"set train.tp=1")
    if t.dp > 1:
        raise ConfigError(f"train.dp={t.dp}: schedule={name} trains one asynchronous pipeline (its replicas' "
                          f"weight versions would part); set train.dp=1")
    if t.dispatch != "strict":
        raise ConfigError(f"train.dispatch={t.dispatch}: schedule={name} needs train.dispatch=strict (each forward "
                          f"must find the weight version its table assigns)")
    if t.precision != "fp32":
        raise ConfigError(f"train.precision={t.precision}: schedule={name} trains in fp32 only; set "
                          f"train.precision=fp32")
    if cfg.schedule.file:
        raise ConfigError(f"schedule.file={cfg.schedule.file}: schedule={name} runs its own stream table (full "
                          f"backwards; split I/W tables are not trained asynchronously); drop schedule.file")
    if start is not None and t.checkpoint_every and t.checkpoint_every < t.steps - start:
        raise ConfigError(f"train.checkpoint_every={t.checkpoint_every}: schedule={name} trains steps {start + 1}-"
                          f"{t.steps} as one stream without a flush, and a checkpoint inside it would need the "
                          f"in-flight micro-batches' stashed versions and activations; asynchronous runs checkpoint "
                          f"at the stream's end only: set train.checkpoint_every=0 or >= {t.steps - start}")


class StreamBatches:
    """Micro-batch k of the stream: micro-batch k mod M of step start + k // M."""

    def __init__(self, batches, microbatches: int, start: int) -> None:
        self.base, self.m, self.start = batches, microbatches, start

    def batch(self, iteration: int, k: int) -> dict:
        return self.base.batch(self.start + k // self.m, k % self.m)


class AdamWUpdate:
    """`WeightStash.update` through the trainer's AdamW: the master module of each stage takes
    the mean accumulated gradient, clips by its stage's norm, steps at the rate of the step
    the update belongs to, and its parameters (cloned) become the new version.
    `on_update(stage, index, norm)` is called after each."""

    def __init__(self, opt: StageOptimizers, stream: Stream,
                 on_update: Callable[[int, int, float], None] | None = None) -> None:
        self.opt, self.stream, self.on_update = opt, stream, on_update
        self.updates: dict[int, int] = {}

    def __call__(self, stage: int, cur: dict[str, torch.Tensor], acc: dict[str, torch.Tensor],
                 count: int) -> dict[str, torch.Tensor]:
        mod = self.opt.stages[(0, stage)]
        for n, p in mod.named_parameters():
            p.grad = acc[n] / count
        norm = self.opt.clip_stage(stage)
        u = self.updates.get(stage, 0)
        self.opt.step_stage(stage, self.stream.start + u // self.stream.updates_per_step)
        self.updates[stage] = u + 1
        for p in mod.parameters():
            p.grad = None
        if self.on_update is not None:
            self.on_update(stage, u, norm)
        return {n: p.detach().clone() for n, p in mod.named_parameters()}


@dataclass(frozen=True)
class StreamReplay:
    """The single-process replay of the streams: the mean loss of every step, the loss of
    every micro-batch of the last stream, the final weights."""

    losses: list[float]
    microbatch_losses: dict[int, float]
    params: dict[str, torch.Tensor]


def replay_training(blocks, partition, streams: list[Stream], batches, optim: OptimSettings,
                    seed: int = 0) -> StreamReplay:
    """The same streams in one process: stage modules seeded as the ranks' are, each stream's
    version assignment replayed (`asynchronous.runtime.replay_stream`) with the same AdamW
    updates and data order, the AdamW state carried from stream to stream."""
    mods = {(0, s): StageModule(blocks, lo, hi, seed) for s, (lo, hi) in enumerate(partition)}
    opt = StageOptimizers(mods, optim)
    losses: list[float] = []
    last: Replay | None = None
    for st in streams:
        feed = StreamBatches(batches, st.microbatches, st.start)
        last = replay_stream([mods[(0, s)] for s in range(len(partition))], st.schedule(),
                             lambda k, feed=feed: feed.batch(0, k), AdamWUpdate(opt, st))
        losses += step_losses(last.losses, st.microbatches)
    names = ModelNames.of(blocks, seed)
    return StreamReplay(losses, last.losses if last else {},
                        {names(n): w for n, w in last.weights.items()} if last else {})


def step_losses(losses: dict[int, float], microbatches: int) -> list[float]:
    """Mean loss of each step from the stream's per-micro-batch losses."""
    n = len(losses) // microbatches
    return [sum(losses[k] for k in range(i * microbatches, (i + 1) * microbatches)) / microbatches
            for i in range(n)]


__all__ = ["AdamWUpdate", "Stream", "StreamBatches", "StreamReplay", "check_async", "replay_training",
           "rule_of", "step_losses", "stream_of"]
