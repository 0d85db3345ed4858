"""cost=profiled: measured per-layer times feed a CostTable, cached by layer shape and device."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from octopipe.cluster import Link
from octopipe.cost.profiled import profiled_costs
from octopipe.errors import ConfigError
from octopipe.layers import carry_shape
from octopipe.runtime.machine import local_cluster
from tests.runtime import tiny


def test_profiled_table_is_measured_cached_and_shaped_like_the_runtime(tmp_path):
    model = tiny.dense(1)
    cluster = local_cluster(2, Link("loop", 1e9, 1e-5))
    cfg = OmegaConf.create({"source": "profiled", "device": "cpu", "repeats": 2, "warmup": 0,
                            "cache_dir": str(tmp_path)})
    first = profiled_costs(cfg, model, cluster)
    assert first.f.shape == (model.n_layers, 1) and (first.f > 0).all() and (first.i[1:] > 0).all()
    assert len(list(tmp_path.glob("*.json"))) == model.n_layers      # every layer distinct here
    again = profiled_costs(cfg, model, cluster)
    assert np.array_equal(first.f, again.f) and np.array_equal(first.w, again.w)
    assert first.out_bytes[1] == 4 * np.prod(carry_shape(model, 1))
    with pytest.raises(ConfigError, match="cost.repeats"):
        profiled_costs(OmegaConf.merge(cfg, {"repeats": 0}), model, cluster)


def test_pieces_of_split_layers_are_measured_each_once_on_realistic_carries(tmp_path):
    """Identical pieces share a measurement; different pieces (other slice, other role) do not;
    a later MoE piece is timed on real top-k gates."""
    from octopipe.cost.profiled import layer_input
    from octopipe.model.pieces import split_model
    model = split_model(tiny.model([tiny.emb(), tiny.mlp(), tiny.moe(), tiny.mlp(), tiny.head()]),
                        {1: 2, 2: 2, 3: 2, 4: 3})
    cluster = local_cluster(1, Link("loop", 1e9, 1e-5))
    cfg = OmegaConf.create({"source": "profiled", "device": "cpu", "repeats": 1, "warmup": 0,
                            "cache_dir": str(tmp_path)})
    costs = profiled_costs(cfg, model, cluster)
    assert costs.f.shape == (10, 1) and (costs.f > 0).all()
    # embedding, MLP pieces 0 and 1 (both MLPs alike), MoE pieces 0 and 1, head pieces 0, 1, 2
    assert len(list(tmp_path.glob("*.json"))) == 8
    assert [costs.out_bytes[j] / 4 for j in (1, 3, 7, 9)] == [2 * 16 * 64, 2 * 16 * 68, 2 * 16 * 34, 1]
    gates = layer_input(model, 4, torch.device("cpu"))[..., 2 * tiny.H:].reshape(-1, 4)
    assert ((gates != 0).sum(-1) == 2).all() and torch.allclose(gates.sum(-1), torch.ones(len(gates)))
