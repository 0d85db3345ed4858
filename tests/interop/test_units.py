"""A model's modules as the stacks cut it: names, symbols, and costs that add up."""
from __future__ import annotations

import numpy as np
import pytest

from octopipe.errors import ConfigError
from octopipe.interop.units import block_units, hf_names, preset_units
from octopipe.plan import Partition, Plan
from octopipe.schedule.library import build_schedule
from octopipe.tune.candidate import Problem
from octopipe.tune.evaluate import evaluate
from tests.interop.helpers import SSM, case, small_model


def test_a_decoder_layer_is_attention_with_its_mlp():
    u = preset_units(small_model("(*-)x3"))
    assert u.names == (("tok_embeddings",), ("layers.0",), ("layers.1",), ("layers.2",), ("norm", "output"))
    assert u.bounds == (0, 1, 3, 5, 7, 8)
    assert u.symbols == ("E", "t", "t", "t", "L") and u.decoder_count == 3 and not u.hybrid


def test_hybrid_models_keep_every_layer_with_megatron_symbols():
    u = preset_units(small_model("M-*-", SSM))
    assert u.bounds == (0, 1, 2, 3, 4, 5, 6)
    assert u.symbols == ("E", "M", "-", "*", "-", "L") and u.hybrid


def test_the_vision_encoder_rides_with_the_embedding():
    m = small_model("(*-)x2", vision={"hidden": 64, "tokens": 64, "patch": 4, "channels": 3, "depth": 2,
                                      "heads": 4, "ffn": 128, "merge": 4, "projector_ffn": 128})
    u = preset_units(m)
    assert u.names[0] == ("vision_encoder", "tok_embeddings")
    assert u.bounds[1] == [layer.kind.value for layer in m.layers].index("embedding") + 1


def test_stage_names_and_alignment():
    u = preset_units(small_model("(*-)x3"))
    part = Partition((3, 2, 3))
    assert u.aligned(part) and u.stage_names(part) == [["tok_embeddings", "layers.0"], ["layers.1"],
                                                       ["layers.2", "norm", "output"]]
    assert u.misaligned(Partition((2, 3, 3))) == [2]
    with pytest.raises(ConfigError, match="cuts inside"):
        u.to_units(Partition((2, 3, 3)))
    assert u.to_layers(u.to_units(part)) == part


@pytest.mark.parametrize("sizes", [(1, 3), (2, 2), (3, 1)])
def test_merged_costs_price_an_aligned_plan_as_the_layers_do(sizes):
    """The oracle: the same plan simulated on the per-layer costs and on the merged modules."""
    model = small_model("(*-)x3")
    c = case(model, 2, 4)
    u = c.units
    table = build_schedule("1f1b", 2, 4)
    unit_part = Partition((sizes[0], sizes[1] + 1))
    plan = Plan(u.to_layers(unit_part), table)
    on_layers = evaluate(Problem.build(c.costs, c.cluster, 2, 4), "x", "x", plan)
    on_units = evaluate(Problem.build(u.merge(c.costs), c.cluster, 2, 4), "x", "x",
                        Plan(unit_part, table))
    assert on_units.makespan_s == pytest.approx(on_layers.makespan_s, rel=1e-12)
    assert np.allclose(on_units.sim.peak_memory, on_layers.sim.peak_memory, rtol=1e-12)


def test_user_blocks_and_transformers_names():
    assert hf_names(4) == [("model.embed_tokens",), ("model.layers.0",), ("model.layers.1",),
                           ("model.norm", "lm_head")]
    u = block_units(hf_names(4), "transformers")
    assert u.n_units == 4 and u.symbols == ("E", "t", "t", "L")
