"""Register every group's schema in Hydra's ConfigStore, so YAML presets only override it.

OmegaConf has no `Literal`, so each schema is stored as the plain dict of its declared
defaults (`defaults_of`); `octopipe.config.load` checks types and ranges afterwards. A preset
names its schema first in its defaults list (`defaults: [analytic_schema, _self_]`)."""
from __future__ import annotations

from collections.abc import Sequence

from octopipe.config.cluster import ClusterConfig
from octopipe.config.convert import defaults_of
from octopipe.config.cost import COST_SOURCES
from octopipe.config.experiment import EXPERIMENTS
from octopipe.config.model import ModelConfig
from octopipe.config.runtime import RuntimeConfig
from octopipe.config.schedule import ScheduleConfig
from octopipe.config.schema import TOP_KEYS, Config
from octopipe.config.solver import SolverConfig
from octopipe.config.train import TrainConfig
from octopipe.config.tuner import TunerConfig

GROUP_SCHEMAS: dict[str, type] = {"model": ModelConfig, "cluster": ClusterConfig,
                                  "schedule": ScheduleConfig, "solver": SolverConfig,
                                  "tuner": TunerConfig, "runtime": RuntimeConfig, "train": TrainConfig}


def schema_nodes() -> list[tuple[str | None, str, dict]]:
    """(group, name, node) of every schema: `<group>_schema` per group, `<source>_schema` per
    cost source, `<name>_schema` per experiment, and `config_schema` for the top level."""
    out: list[tuple[str | None, str, dict]] = [
        (group, f"{group}_schema", defaults_of(cls)) for group, cls in GROUP_SCHEMAS.items()]
    out += [("cost", f"{source}_schema", defaults_of(cls)) for source, cls in COST_SOURCES.items()]
    out += [("experiment", f"{name}_schema", defaults_of(cls)) for name, cls in EXPERIMENTS.items()]
    top = defaults_of(Config)
    out.append((None, "config_schema", {k: top[k] for k in (*TOP_KEYS, "sim", "layout")}))
    return out


def schedule_nodes(schedules: Sequence[str]) -> list[tuple[str, str, dict]]:
    """(group, name, node) of a `schedule=<name>` preset per named schedule: the schedule
    registry (`octopipe.schedule.library.SCHEDULE_PRESETS`) is the list, so no YAML file per
    schedule exists to keep in step with it."""
    base = defaults_of(ScheduleConfig)
    return [("schedule", name, {**base, "name": name}) for name in schedules]


def register(schedules: Sequence[str] = ()) -> None:
    """Store the schemas and the `schedule=<name>` presets of `schedules` (idempotent); call
    before Hydra composes."""
    from hydra.core.config_store import ConfigStore  # hydra is the CLI's; the schema needs none
    cs = ConfigStore.instance()
    for group, name, node in schema_nodes() + schedule_nodes(schedules):
        cs.store(group=group, name=name, node=node)


def registered_presets(group: str) -> list[str]:
    """The presets of `group` stored in code (not the `<..>_schema` nodes), sorted."""
    from hydra.core.config_store import ConfigStore  # hydra is the CLI's; the schema needs none
    try:
        names = ConfigStore.instance().list(group)
    except OSError:      # nothing stored under this group
        return []
    return sorted(n.removesuffix(".yaml") for n in names if not n.endswith("_schema.yaml"))
