"""The dispatcher's inputs: config → ModelSpec, Cluster (pp ranks of tp GPUs), CostTable by
cost.source, built once and only when a mode asks for them."""
import pytest
from hydra import compose, initialize_config_dir

from octopipe.config import load, register
from octopipe.errors import ConfigError
from octopipe.io import CONF_DIR
from octopipe.modes.inputs import Inputs
from octopipe.schedule.library import SCHEDULE_PRESETS


def inputs(*overrides) -> Inputs:
    register(SCHEDULE_PRESETS)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return Inputs(load(compose("config", overrides=list(overrides))))


def test_default_config_loads_a_consistent_triple():
    x = inputs("model=llama3_8b", "cluster=h100_4x8", "pp=4", "cost.tp=8")
    model, cluster, costs = x.costed_model, x.cluster, x.costs
    assert model.name == "llama3_8b" and cluster.n_devices == 4 and cluster.node == (0, 1, 2, 3)
    assert costs.n_layers == model.n_layers and costs.kinds == ("H100-SXM",)
    assert costs.static_bytes[1] == pytest.approx(18 * costs.params[1] / 8)


def test_pp_beyond_the_cluster_is_a_config_error():
    with pytest.raises(ConfigError, match=r"^pp=9"):
        _ = inputs("cluster=h100_1x8", "pp=9").cluster


def test_unknown_cost_source():
    with pytest.raises(ConfigError, match=r"^cost.source='guess'"):
        inputs("cost.source=guess")


def test_profile_file_defines_the_layers_when_counts_differ():
    x = inputs("model=gpt_oss_20b", "cost=file", "cost.preset=gpt_oss_20b")
    assert x.costed_model.n_layers == x.costs.n_layers == 24


def test_inputs_are_built_once_and_only_when_asked():
    x = inputs("model=tiny_hybrid", "pp=2")
    assert "model" not in x.__dict__ and "costs" not in x.__dict__
    assert x.costs is x.costs and x.model is x.model
    assert x.splitter is not None and x.piece_costs({}) is x.costs
