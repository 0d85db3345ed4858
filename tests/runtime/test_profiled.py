"""cost=profiled: measured per-layer times feed a CostTable, cached by layer shape and device."""
from __future__ import annotations

import numpy as np
import pytest
from omegaconf import OmegaConf

from octopipe.cluster import Link
from octopipe.cost.profiled import profiled_costs
from octopipe.errors import ConfigError
from octopipe.runtime.calibrate import local_cluster
from octopipe.runtime.layers import carry_shape
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
