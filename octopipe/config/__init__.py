"""The typed config schema: one frozen dataclass per config group.

Field docs, types and defaults live here and only here; YAML presets under conf/ override them.
`register` stores the schemas in Hydra's ConfigStore; `load` turns a composed DictConfig into a
`Config` once, with every range checked (`convert` does it per section)."""
from octopipe.config.cluster import ClusterConfig
from octopipe.config.convert import convert, defaults_of
from octopipe.config.cost import AnalyticCost, CostConfig, FileCost, ProfiledCost
from octopipe.config.experiment import ExperimentConfig, OctoPipeAuthorsExperiment, TabularExperiment
from octopipe.config.loader import cost_config, load
from octopipe.config.model import ModelConfig
from octopipe.config.presets import preset
from octopipe.config.runtime import RuntimeConfig
from octopipe.config.schedule import ScheduleConfig
from octopipe.config.schema import Config
from octopipe.config.sim import SimConfig
from octopipe.config.solver import SolverCompare, SolverConfig
from octopipe.config.store import register
from octopipe.config.tuner import TunerConfig

__all__ = ["AnalyticCost", "ClusterConfig", "Config", "CostConfig", "ExperimentConfig",
           "FileCost", "ModelConfig", "OctoPipeAuthorsExperiment", "ProfiledCost", "RuntimeConfig",
           "ScheduleConfig", "SimConfig", "SolverCompare", "SolverConfig", "TabularExperiment",
           "TunerConfig", "convert", "cost_config", "defaults_of", "load", "preset", "register"]
