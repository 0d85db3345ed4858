"""`sim`: the simulator's policy, communication semantics and variability."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from octopipe.config.fields import setting


@dataclass(frozen=True)
class SimConfig:
    """How `mode=simulate` (and the simulations of plan and compare) run a table."""

    semantics: Literal["eager", "rendezvous", "batched"] = setting(
        "eager", "communication semantics: buffered sends | a send waits for its receive | "
                 "NCCL-style groups")
    policy: Literal["strict", "ready_first"] = setting(
        "strict", "strict: each device runs its row in order | ready_first: the row ranks the "
                  "ready actions")
    hint: Literal["table", "bf", "bfw"] = setting("table", "ready_first ranking")
    jitter_cv: float = setting(0.0, "coefficient of variation of lognormal compute/transfer "
                                    "jitter", ge=0)
    slow_prob: float = setting(0.0, "probability that a device is slow for the whole run",
                               ge=0, le=1)
    slow_factor: float = setting(2.0, "how much slower a slow device is", ge=1)
    monte_carlo: int = setting(0, "N > 0: N seeded jittered runs, makespan mean/std/percentiles",
                               ge=0)
    max_inflight: int | Literal["plan"] | None = setting(
        "plan", "ready_first: cap on the micro-batches live on a device at once (from their first "
                "F there to their last backward there; a V-shaped device's two stages of one "
                "micro-batch hold one slot), admitted in the order the row names them: plan (each "
                "device its own row's need, as the runtime) | an integer for every device | null "
                "(none)", ge=1)
    max_actions: int = setting(
        100_000, "mode=simulate and compare refuse a table estimated above this many compute "
                 "actions, with the estimate (time and memory grow with it); raise it to go on",
        ge=1)
    memory_limit: bool = setting(False, "ready_first: hold an F back when it would exceed "
                                        "device memory")
    tp_agreement_s: float | None = setting(
        None, "ready_first with cost.tp > 1: seconds of RRFP's agreement before each task with TP "
              "collectives (one scalar all-gather, octopipe/sim/agreement.py); null: (tp - 1) x the "
              "TP link's latency + 8 (tp - 1) bytes over its bandwidth; 0: not charged", ge=0)
    check_memory: bool = setting(False, "error (exit 2) when a device's peak exceeds its capacity")
    seeds: int = setting(5, "mode=compare: seeds per jitter level", ge=1)
    jitter_levels: tuple[float, ...] = setting(
        (0.1, 0.3), "mode=compare: coefficients of variation for strict vs ready_first", gt=0)
