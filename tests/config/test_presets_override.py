"""YAML presets start from their group's schema and keep only what they override; every
preset composes into typed values."""
from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from octopipe.config import Config, defaults_of, load, preset, register
from octopipe.config.cost import COST_SOURCES
from octopipe.config.experiment import EXPERIMENTS
from octopipe.config.schema import TOP_KEYS
from octopipe.config.sim import SimConfig
from octopipe.config.store import GROUP_SCHEMAS
from octopipe.io import CONF_DIR, preset_names
from octopipe.schedule.library import SCHEDULE_PRESETS

PRESETS = [(g, n) for g in (*GROUP_SCHEMAS, "cost", "experiment") for n in preset_names(g)]


def schema_of(group: str, name: str, raw: dict) -> dict:
    if group == "cost":
        return defaults_of(COST_SOURCES[name])
    if group == "experiment":
        return defaults_of(EXPERIMENTS[raw["experiment"]["name"]])
    return defaults_of(GROUP_SCHEMAS[group])


def _same(a, b) -> bool:
    return (a == b and type(a) is type(b)) or (isinstance(a, (int, float)) and isinstance(b, (int, float))
                                             and not isinstance(a, bool) and a == b)


@pytest.mark.parametrize("group, name", PRESETS, ids=[f"{g}/{n}" for g, n in PRESETS])
def test_presets_name_their_schema_and_repeat_no_default(group, name):
    raw = OmegaConf.to_container(OmegaConf.load(CONF_DIR / group / f"{name}.yaml"))
    kind = {"experiment": lambda: raw["experiment"]["name"],
            "cost": lambda: name}.get(group, lambda: group)()
    schema = f"{kind}_schema"
    assert any(str(d).startswith(schema) for d in raw["defaults"]), raw["defaults"]
    section = raw["experiment"] if group == "experiment" else raw
    for key, value in section.items():
        if key == "defaults":
            continue
        default = schema_of(group, name, raw).get(key, object())
        assert not _same(value, default), f"{group}/{name}: {key}={value!r} repeats the schema default"


def test_the_top_level_repeats_no_default():
    raw = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "config.yaml"))
    assert not set(raw) & {*TOP_KEYS, "sim"}
    assert raw["defaults"][0] == "config_schema"


@pytest.mark.parametrize("group, name", [(g, n) for g, n in PRESETS if g != "experiment"])
def test_every_preset_is_typed(group, name):
    assert preset(group, name) is not None


def test_every_experiment_composes_to_its_dataclass():
    register(SCHEDULE_PRESETS)
    for name, cls in EXPERIMENTS.items():
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
            cfg = load(compose("config", overrides=[f"experiment={name}"]))
        assert type(cfg.experiment) is cls and cfg.experiment.name == name


def test_defaults_compose_to_the_schema_defaults():
    register(SCHEDULE_PRESETS)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = load(compose("config"))
    assert isinstance(cfg, Config)
    assert (cfg.mode, cfg.pp, cfg.chunks, cfg.microbatches, cfg.seed) == ("plan", 8, None, 16, 0)
    assert cfg.sim == SimConfig() and cfg.tuner.time_budget_s == 300.0 and cfg.solver.name == "cbc"
    assert cfg.model.name == "nemotron_h_8b" and cfg.cluster.name == "h100_1x8"
