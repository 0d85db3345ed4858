"""`tuner`: the bubble-aware tuner (octopipe.tune), its search budget and its checks."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from octopipe.config.convert import check
from octopipe.config.fields import setting
from octopipe.errors import ConfigError

Lever = Literal["partition", "placement", "schedule", "split_layers"]
LEVERS: tuple[str, ...] = ("partition", "placement", "schedule", "split_layers")


@dataclass(frozen=True)
class TunerConfig:
    """conf/tuner/*.yaml. Seeded by the top-level `seed`."""

    time_budget_s: float = setting(
        300.0, "safety cap, in wall-clock seconds, of one tune() call. The budgets below "
               "(evaluations, iterations, ILP nodes, polish simulations) are what end each stage, "
               "so the same inputs and seed give the same plan at any machine load; a stage the cap "
               "stops is reported as search.stopped_by=time_cap (that plan depends on the machine)",
        gt=0)
    max_evaluations: int = setting(16000, "list-scheduler estimates of the local search at most",
                                   ge=1)
    max_work: int = setting(32_000_000, "actions the local search's estimates may schedule in all "
                                        "(stages x micro-batches x 2 or 3 each): keeps large "
                                        "instances within about the default run's time", ge=1)
    max_iters: int = setting(400, "local-search iterations at most", ge=1)
    patience: int = setting(40, "iterations without a new best before the search stops", ge=1)
    candidates_per_iter: int = setting(8, "moves estimated per iteration at least (up to 400 on "
                                          "small instances)", ge=1)
    kick_strength: int = setting(3, "random moves per perturbation at a local optimum", ge=1)
    max_chunks: int = setting(8, "largest stages-per-device count among the loop/V starting "
                                 "points", ge=1)
    finalists: int = setting(6, "distinct best candidates fully simulated at the end", ge=1)
    link_contention: bool = setting(
        True, "the search's estimator lets each directed device pair carry one transfer at a "
              "time, in the order their producers end (as the simulator's links); false: "
              "transfers are pure delays")
    smt_max_actions: int = setting(
        32768, "SMT deadlock proof up to this many actions; larger: simulator detection (about "
               "0.1 ms per action)", ge=1)
    ilp: bool = setting(True, "start from the partition (+ placement) ILPs (solvers)")
    ilp_max_nodes: int = setting(100, "branch-and-bound nodes of each ILP start at most "
                                      "(deterministic; the time_budget_s cap is their only time limit)", ge=1)
    w_ilp_max_actions: int = setting(
        128, "the W-placement ILP (solvers.w_placement) polishes the best split-backward table "
             "of at most this many actions (0: never)", ge=0)
    polish_sims: int = setting(48, "full simulations of row moves (advance into bubbles) on the "
                                   "best table at most; 0: no polish", ge=0)
    polish_work: int = setting(100_000, "actions the polish's simulations may run in all (a large "
                                        "table gets fewer simulations)", ge=1)
    split_layers: Literal["auto", "force", "off"] = setting(
        "auto", "piece head, MLP, MoE, attention and Mamba-2 layers (cut into pieces). auto: of "
                "no pieces and pieces capped at 1, 1/2, 1/4 of split_share, the one with the best "
                "bound (of those within 1% of it, the one whose best starting point the estimator "
                "rates shortest, then the fewest pieces); "
                "force: every layer heavier than split_share; off: whole layers only")
    split_share: float = setting(0.5, "piece cap, as a fraction of a device's even share (total "
                                      "work / devices)", gt=0)

    memory_budget: float | None = setting(
        None, "activation memory each device may hold, as a multiple of S-1F1B's (uniform stages, "
              "one per device: the most activations any device holds under 1F1B); the schedule "
              "search then chooses how many forwards each device runs ahead and where each W goes "
              "within it. null: device memory only", gt=0)
    objective: Literal["nominal", "mean", "quantile"] = setting(
        "nominal", "what the finalists are ranked by: nominal (one simulation without variability), "
                   "mean or quantile (tuner.quantile) of tuner.samples simulations under the "
                   "variability sim.jitter_cv and runtime.* describe, dispatched by tuner.dispatch")
    quantile: float = setting(0.9, "the quantile of objective=quantile", gt=0, lt=1)
    samples: int = setting(32, "Monte Carlo simulations per finalist under objective=mean|quantile "
                               "(the same draws for every finalist)", ge=2, le=10_000)
    dispatch: Literal["strict", "ready_first"] = setting(
        "strict", "the dispatch the run will use, for objective=mean|quantile (ready_first: every "
                  "hint is tried and the best recorded in the plan)")
    levers: tuple[Lever, ...] = setting(
        LEVERS, "what the tuner may change, any non-empty subset of partition (layers per stage), "
                "placement (stage -> device), schedule (the policy and row moves) and split_layers "
                "(cut heavy layers into pieces); a lever left out stays at S-1F1B's (uniform "
                "stages, one per device, 1F1B order, whole layers)")

    def __post_init__(self) -> None:
        check(self, "tuner.")
        if not self.levers:
            raise ConfigError(f"tuner.levers=[]: choose at least one of {', '.join(LEVERS)}")
        object.__setattr__(self, "levers", tuple(dict.fromkeys(self.levers)))
