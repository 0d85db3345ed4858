"""Shared loaders: config → ModelSpec, Cluster (pp ranks of tp GPUs), CostTable by cost.source."""
import pytest
from hydra import compose, initialize_config_dir

from octopipe.errors import ConfigError
from octopipe.load import load_cluster, load_costs, load_inputs, load_model
from octopipe.run import CONF_DIR


def config(*overrides):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return compose("config", overrides=list(overrides))


def test_default_config_loads_a_consistent_triple():
    cfg = config("model=llama3_8b", "cluster=h100_4x8", "pp=4", "cost.tp=8")
    model, cluster, costs = load_inputs(cfg)
    assert model.name == "llama3_8b" and cluster.n_devices == 4 and cluster.node == (0, 1, 2, 3)
    assert costs.n_layers == model.n_layers and costs.kinds == ("H100-SXM",)
    assert costs.static_bytes[1] == pytest.approx(18 * costs.params[1] / 8)


def test_pp_beyond_the_cluster_is_a_config_error():
    with pytest.raises(ConfigError, match=r"^pp=9"):
        load_cluster(config("cluster=h100_1x8", "pp=9"))


def test_unknown_cost_source():
    cfg = config("cost.source=guess")
    with pytest.raises(ConfigError, match=r"^cost.source='guess'"):
        load_costs(cfg, load_model(cfg), load_cluster(cfg))


def test_profile_file_defines_the_layers_when_counts_differ():
    cfg = config("model=gpt_oss_20b", "cost=file", "cost.preset=gpt_oss_20b")
    model, _, costs = load_inputs(cfg)
    assert model.n_layers == costs.n_layers == 24
