"""Run-to-run variability: seeded lognormal jitter, occasional slow devices, Monte-Carlo runs."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from octopipe.errors import ConfigError
from octopipe.model.layer import LayerKind
from octopipe.model.spec import ModelSpec
from octopipe.sim.durations import Durations
from octopipe.sim.program import Program


def lognormal_factors(rng: np.random.Generator, cv: float, n: int) -> np.ndarray:
    """Multiplicative noise with mean 1 and coefficient of variation `cv`."""
    if cv <= 0:
        return np.ones(n)
    sigma2 = np.log1p(cv * cv)
    return rng.lognormal(-sigma2 / 2.0, np.sqrt(sigma2), n)


@dataclass(frozen=True)
class Jitter:
    """Compute times x lognormal(cv); transfers x lognormal(comm_cv, default cv); each device is
    slowed by `slow_factor` for the whole run with probability `slow_prob`."""

    cv: float = 0.0
    comm_cv: float | None = None
    slow_prob: float = 0.0
    slow_factor: float = 2.0

    def __post_init__(self) -> None:
        if self.cv < 0 or (self.comm_cv is not None and self.comm_cv < 0):
            raise ConfigError(f"sim.jitter_cv={self.cv} must be >= 0")
        if not 0 <= self.slow_prob <= 1:
            raise ConfigError(f"sim.slow_prob={self.slow_prob} must lie in [0, 1]")
        if self.slow_factor < 1:
            raise ConfigError(f"sim.slow_factor={self.slow_factor} must be >= 1 (a slowdown)")

    @property
    def active(self) -> bool:
        return self.cv > 0 or (self.comm_cv or 0) > 0 or self.slow_prob > 0

    def apply(self, program: Program, dur: Durations, rng: np.random.Generator) -> Durations:
        comp = dur.compute * lognormal_factors(rng, self.cv, len(dur.compute))
        if self.slow_prob > 0:
            slow = np.where(rng.random(program.n_devices) < self.slow_prob, self.slow_factor, 1.0)
            comp = comp * slow[program.c_dev]
        comm_cv = self.cv if self.comm_cv is None else self.comm_cv
        trans = dur.transfer * lognormal_factors(rng, comm_cv, len(dur.transfer))
        return dur.scaled(compute=comp, transfer=trans)


@dataclass(frozen=True, eq=False)
class MonteCarlo:
    """Makespans of `n` seeded runs and their spread."""

    makespans: np.ndarray
    bubble_ratios: np.ndarray

    @property
    def mean(self) -> float:
        return float(self.makespans.mean())

    @property
    def std(self) -> float:
        return float(self.makespans.std(ddof=1)) if len(self.makespans) > 1 else 0.0

    def percentile(self, q: float) -> float:
        return float(np.percentile(self.makespans, q))

    def summary(self) -> dict:
        return {"runs": len(self.makespans), "makespan_mean_s": self.mean,
                "makespan_std_s": self.std, "makespan_p50_s": self.percentile(50),
                "makespan_p90_s": self.percentile(90), "makespan_p99_s": self.percentile(99),
                "makespan_min_s": float(self.makespans.min()),
                "makespan_max_s": float(self.makespans.max()),
                "bubble_ratio_mean": float(self.bubble_ratios.mean())}


VISION_KINDS = frozenset({"patch_embed", "vit_block", "projector"})
"""Layer kinds whose time follows the images of a micro-batch (the rest follow its tokens)."""

SLOT = (0, 1, 2, 1)
"""The draw each kind code (F, I, W, B) reads: B reads I's (B is I + W in one pass)."""


@dataclass(frozen=True)
class Draws:
    """One iteration's random draws: `action[stage, mb, slot]` (slot 0 F, 1 I or B, 2 W)
    multiplicative compute noise, `length[mb]` and `images[mb]` data factors (mean 1),
    `delay[stage, mb, direction]` send delays in units of the mean stage F."""

    action: np.ndarray
    length: np.ndarray
    images: np.ndarray
    delay: np.ndarray


@dataclass(frozen=True)
class Variability:
    """The one jitter model the simulator and the runtime draw from (same seed, same draws).

    Per action: lognormal noise with coefficient of variation `cv`, times `straggler_factor`
    with probability `straggler_prob`; rank `slow_rank` (-1: none) is `slow_rank_factor` times
    slower all along. Per message: a delay before the send is posted, exponential with mean
    `transfer_delay` x the mean stage F. Per micro-batch (data): its sequence length is
    lognormal around the mean with `seq_len_cv` (clipped to [1/4, 4] x the mean) and, with
    `images_max` > 0, each of its `samples` samples carries 1..images_max images (uniform), so
    the share `vision_share[stage]` of a stage's time follows the micro-batch's image count and
    the rest its length (`image_share`: the vision layers, and the image tokens' part of the
    language layers' tokens, since those layers run on image plus text tokens). `floor` bounds every compute factor
    below (real compute cannot do less than the step itself: it uses floor=1)."""

    cv: float = 0.0
    straggler_prob: float = 0.0
    straggler_factor: float = 1.0
    slow_rank: int = -1
    slow_rank_factor: float = 1.0
    transfer_delay: float = 0.0
    seq_len_cv: float = 0.0
    images_max: int = 0
    samples: int = 1
    vision_share: tuple[float, ...] = ()
    floor: float = 0.0

    def __post_init__(self) -> None:
        checks = (("jitter_cv", self.cv, 0 <= self.cv <= 3, "in [0, 3]"),
                  ("straggler_prob", self.straggler_prob, 0 <= self.straggler_prob <= 1, "in [0, 1]"),
                  ("straggler_factor", self.straggler_factor, self.straggler_factor >= 1, ">= 1"),
                  ("slow_rank_factor", self.slow_rank_factor, self.slow_rank_factor >= 1, ">= 1"),
                  ("slow_rank", self.slow_rank, self.slow_rank >= -1, ">= -1 (-1: none)"),
                  ("transfer_delay", self.transfer_delay, self.transfer_delay >= 0, ">= 0"),
                  ("seq_len_cv", self.seq_len_cv, 0 <= self.seq_len_cv <= 3, "in [0, 3]"),
                  ("images_max", self.images_max, self.images_max >= 0, ">= 0"),
                  ("samples", self.samples, self.samples >= 1, ">= 1"))
        for name, value, ok, text in checks:
            if not ok:
                raise ConfigError(f"runtime.{name}={value} must be {text}")

    @property
    def active(self) -> bool:
        return (self.cv > 0 or (self.straggler_prob > 0 and self.straggler_factor > 1)
                or (self.slow_rank >= 0 and self.slow_rank_factor > 1) or self.transfer_delay > 0
                or self.seq_len_cv > 0 or self.images_max > 1)

    def draws(self, rng: np.random.Generator, n_stages: int, n_mb: int) -> Draws:
        """The iteration's draws, always in the same order (so a seed fixes every one of them)."""
        action = lognormal_factors(rng, self.cv, n_stages * n_mb * 3).reshape(n_stages, n_mb, 3)
        if self.straggler_prob > 0:
            hit = rng.random((n_stages, n_mb, 3)) < self.straggler_prob
            action = np.where(hit, action * self.straggler_factor, action)
        length = np.clip(lognormal_factors(rng, self.seq_len_cv, n_mb), 0.25, 4.0)
        images = np.ones(n_mb)
        if self.images_max > 1:
            counts = rng.integers(1, self.images_max + 1, (n_mb, self.samples)).sum(axis=1)
            images = counts / (self.samples * (self.images_max + 1) / 2.0)
        delay = rng.exponential(self.transfer_delay, (n_stages, n_mb, 2)) if self.transfer_delay > 0 \
            else np.zeros((n_stages, n_mb, 2))
        return Draws(action, length, images, delay)

    def compute_factor(self, d: Draws, stage, kind_code, mb, rank) -> np.ndarray:
        """The factor on the modelled time of actions (stage, kind code, mb) on `rank`
        (arrays or scalars)."""
        stage, kind_code, mb, rank = (np.asarray(x) for x in (stage, kind_code, mb, rank))
        share = np.asarray(self.vision_share or (0.0,), dtype=float)
        vis = share[np.minimum(stage, len(share) - 1)] if self.vision_share else np.zeros(stage.shape)
        data = (1.0 - vis) * d.length[mb] + vis * d.images[mb]
        f = d.action[stage, mb, np.asarray(SLOT)[kind_code]] * data
        if self.slow_rank >= 0:
            f = np.where(rank == self.slow_rank, f * self.slow_rank_factor, f)
        return np.maximum(f, self.floor)

    def send_delay(self, d: Draws, stage, mb, direction, base_s: float) -> np.ndarray:
        """Seconds a message out of (stage, mb) in `direction` (0 forward, 1 backward) waits."""
        return d.delay[np.asarray(stage), np.asarray(mb), np.asarray(direction)] * base_s

    def apply(self, program: Program, dur: Durations, rng: np.random.Generator) -> Durations:
        """`dur` under one iteration's draws: compute scaled, send delays added to transfers."""
        d = self.draws(rng, program.n_stages, program.n_microbatches)
        comp = dur.compute * self.compute_factor(d, program.c_stage, program.c_kind, program.c_mb,
                                                 program.c_dev)
        trans = dur.transfer
        if self.transfer_delay > 0 and program.n_transfers:
            prod = program.t_producer
            direction = (program.c_kind[prod] != 0).astype(np.int64)
            trans = trans + self.send_delay(d, program.c_stage[prod], program.c_mb[prod], direction,
                                            mean_stage_forward(program, dur))
        return dur.scaled(compute=comp, transfer=trans)


def mean_stage_forward(program: Program, dur: Durations) -> float:
    """The mean over stages of a stage's F seconds (the unit of send delays)."""
    fwd = program.c_kind == 0
    per = np.bincount(program.c_stage[fwd], weights=dur.compute[fwd], minlength=program.n_stages)
    cnt = np.bincount(program.c_stage[fwd], minlength=program.n_stages)
    return float(np.mean(per / np.maximum(cnt, 1)))


def vision_share(kinds: tuple[str, ...], f_costs: np.ndarray, partition) -> tuple[float, ...]:
    """Per stage, the share of its F time spent in vision layers (`kinds[layer]` names each
    layer's kind, `f_costs[layer]` its F seconds)."""
    out = []
    for lo, hi in partition:
        tot = float(np.sum(f_costs[lo:hi]))
        vis = sum(float(f_costs[k]) for k in range(lo, hi) if kinds[k] in VISION_KINDS)
        out.append(vis / tot if tot > 0 else 0.0)
    return tuple(out)


def image_share(model: ModelSpec, f_costs: np.ndarray, partition) -> tuple[float, ...]:
    """Per stage, the share of its F time that follows the micro-batch's image count: all of a
    vision layer's time (patch embedding, ViT blocks, projector: fixed patches per image, so their
    work is linear in images) and, in every other layer, the fraction of its tokens that are image
    tokens (`octopipe.model.build` feeds the projector's tokens to the language layers ahead of the
    text; the head's loss runs on text only). The modelled micro-batch is the mean one: its image
    tokens scale with `images` (mean 1) and its text with `length` (mean 1)."""
    image_tokens = sum(x.tokens for x in model.layers if x.kind is LayerKind.PROJECTOR)
    frac = np.array([1.0 if x.kind.value in VISION_KINDS
                     else (min(image_tokens / x.tokens, 1.0) if x.tokens > 0 else 0.0)
                     for x in model.layers])
    f = np.asarray(f_costs, dtype=float)
    out = []
    for lo, hi in partition:
        tot = float(np.sum(f[lo:hi]))
        out.append(float(np.sum(f[lo:hi] * frac[lo:hi])) / tot if tot > 0 else 0.0)
    return tuple(out)
