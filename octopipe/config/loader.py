"""`load`: the composed Hydra config (a DictConfig) as typed values, once.

This is the only reader of raw config in the project: every other module receives a `Config`
or one of its sections. Each violation is a ConfigError of one line naming the field, the value
and the valid range."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from octopipe.config.convert import convert, to_plain
from octopipe.config.cost import COST_SOURCES, CostConfig
from octopipe.config.experiment import EXPERIMENTS, ExperimentConfig
from octopipe.config.schema import Config
from octopipe.config.store import GROUP_SCHEMAS
from octopipe.errors import ConfigError


def cost_config(raw: Any) -> CostConfig:
    """The `cost` section as the dataclass its `source` names."""
    raw = to_plain(raw) or {}
    if isinstance(raw, (*COST_SOURCES.values(),)):
        return raw
    if not isinstance(raw, Mapping):
        raise ConfigError(f"cost={raw!r}: expected a mapping; choose cost=analytic, file or profiled")
    source = raw.get("source", "analytic")
    if source not in COST_SOURCES:
        raise ConfigError(f"cost.source={source!r}: choose one of {', '.join(COST_SOURCES)}")
    return convert(COST_SOURCES[source], raw, "cost.")


def experiment_config(raw: Any) -> ExperimentConfig | None:
    """The `experiment` section as the dataclass of its `name` (the common part if it has none)."""
    raw = to_plain(raw)
    if raw is None or isinstance(raw, ExperimentConfig):
        return raw
    if not isinstance(raw, Mapping):
        raise ConfigError(f"experiment={raw!r}: expected a mapping; choose experiment=<preset>")
    return convert(EXPERIMENTS.get(str(raw.get("name")), ExperimentConfig), raw, "experiment.")


def load(cfg: Any) -> Config:
    """The typed `Config` of a composed config (DictConfig or mapping); ConfigError otherwise."""
    raw = dict(to_plain(cfg) or {})
    raw.pop("hydra", None)
    if raw.get("model") is None:
        raise ConfigError("model: no model preset selected; pass model=<preset>")
    if raw.get("cluster") is None:
        raise ConfigError("cluster: no cluster preset selected; pass cluster=<preset>")
    values = dict(raw)
    for group, cls in GROUP_SCHEMAS.items():
        if group in raw:
            values[group] = convert(cls, raw[group], f"{group}.")
    if "cost" in raw:
        values["cost"] = cost_config(raw["cost"])
    values["experiment"] = experiment_config(raw.get("experiment"))
    return convert(Config, values)
