"""`Config`: the whole typed configuration, one attribute per config group plus the top-level
keys of the command-line contract (mode, pp, chunks, microbatches, seed)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from octopipe.config.cluster import ClusterConfig
from octopipe.config.cost import AnalyticCost, CostConfig
from octopipe.config.experiment import ExperimentConfig
from octopipe.config.fields import REQUIRED, setting
from octopipe.config.layout import LayoutConfig
from octopipe.config.model import ModelConfig
from octopipe.config.runtime import RuntimeConfig
from octopipe.config.schedule import ScheduleConfig
from octopipe.config.sim import SimConfig
from octopipe.config.solver import SolverConfig
from octopipe.config.train import TrainConfig
from octopipe.config.tuner import TunerConfig

Mode = Literal["plan", "inspect", "simulate", "compare", "solvers", "execute", "layout", "train", "export"]
MODES: tuple[str, ...] = Mode.__args__
Target = Literal["octopipe", "torch", "torchtitan", "megatron", "deepspeed"]
TOP_KEYS = ("mode", "pp", "chunks", "microbatches", "seed", "target", "plan")


@dataclass(frozen=True, kw_only=True)
class Config:
    """What `python -m octopipe.run` was asked, as typed values."""

    mode: Mode = setting("plan", "plan | inspect | simulate | compare | solvers | execute | layout | train | export")
    target: Target = setting("octopipe", "the stack the plan must run on: octopipe | torch | torchtitan | "
                                         "megatron | deepspeed (mode=plan searches only plans it runs)")
    plan: str | None = setting(None, "mode=export: the plan.json to write for `target`")
    pp: int | None = setting(8, "devices in the pipeline; null: every rank of the cluster", ge=1)
    chunks: int | None = setting(None, "stages per device; null: the schedule's natural count "
                                       "(1, or 2 for V/interleaved)", ge=1)
    microbatches: int = setting(16, "micro-batches per iteration", ge=1)
    seed: int = setting(0, "every random choice follows it", ge=0, lt=2 ** 63)
    sim: SimConfig = setting(SimConfig(), "the simulator")
    layout: LayoutConfig = setting(LayoutConfig(), "mode=layout's search (tp x pp x dp x "
                                                   "micro-batching x recompute)")
    model: ModelConfig = setting(REQUIRED, "model=<preset> (conf/model)")
    cluster: ClusterConfig = setting(ClusterConfig(), "cluster=<preset> (conf/cluster)")
    cost: CostConfig = setting(AnalyticCost(), "cost=<source> (conf/cost)")
    schedule: ScheduleConfig = setting(ScheduleConfig(), "schedule=<name> (the schedule registry)")
    solver: SolverConfig = setting(SolverConfig(), "solver=<backend> (conf/solver)")
    tuner: TunerConfig = setting(TunerConfig(), "tuner=<preset> (conf/tuner)")
    runtime: RuntimeConfig = setting(RuntimeConfig(), "runtime=<preset> (conf/runtime)")
    train: TrainConfig = setting(TrainConfig(), "train=<preset> (conf/train; mode=train)")
    experiment: ExperimentConfig | None = setting(None, "experiment=<name> (conf/experiment)")
