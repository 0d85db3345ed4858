"""Sub-layer splitting: pieces add up to the layer (parameters, FLOPs), bad pieces are refused."""
from dataclasses import replace

import numpy as np
import pytest

from octopipe.cluster_presets import cluster_from_config
from octopipe.cost.analytic import AnalyticCostModel
from octopipe.errors import ConfigError
from octopipe.model import LayerKind, LayerSpec, ModelSpec, layer_params, model_params, validate_model
from octopipe.model.pieces import carry_width, choose_counts, piece_map, piece_span, split_layer, split_model

H = 64
LAYERS = (
    LayerSpec(LayerKind.EMBEDDING, H, name="embedding", vocab=1000),
    LayerSpec(LayerKind.ATTENTION, H, heads=4, kv_heads=2, head_dim=16),
    LayerSpec(LayerKind.MLP, H, ffn=171, activation="swiglu", bias=True),
    LayerSpec(LayerKind.MOE, H, experts=7, top_k=2, expert_ffn=32, shared_experts=1, shared_ffn=48),
    LayerSpec(LayerKind.MLP, H, ffn=100, activation="relu2"),
    LayerSpec(LayerKind.MAMBA2, H, ssm_heads=8, ssm_head_dim=8, ssm_state=16, ssm_groups=4,
              conv_kernel=4, ssm_chunk=32),
    LayerSpec(LayerKind.ATTENTION, H, heads=6, kv_heads=6, head_dim=8, bias=True),
    LayerSpec(LayerKind.HEAD, H, name="head", vocab=1000),
)
QK_NORM = LayerSpec(LayerKind.ATTENTION, H, heads=4, kv_heads=2, head_dim=16, qk_norm=True)
DIM = {LayerKind.HEAD: "vocab", LayerKind.MLP: "ffn", LayerKind.MOE: "experts",
       LayerKind.ATTENTION: "kv_heads", LayerKind.MAMBA2: "ssm_groups"}
MODEL = ModelSpec("toy", LAYERS, seq_len=256, micro_batch_size=2, vocab=1000)


@pytest.mark.parametrize("index", [1, 2, 3, 4, 5, 6, 7])
@pytest.mark.parametrize("k", [2, 3, 7])
def test_pieces_cover_the_split_dimension_and_add_up(index, k):
    x = LAYERS[index]
    dim = getattr(x, DIM[x.kind])
    k = min(k, dim)
    pieces = split_layer(x, k)
    spans = [piece_span(p) for p in pieces]
    assert spans[0][0] == 0 and all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    assert spans[-1][1] == dim
    assert sum(layer_params(p) for p in pieces) == layer_params(x)
    assert abs(sum(layer_params(p, active=True) for p in pieces) - layer_params(x, active=True)) <= k


def test_split_model_keeps_parameters_and_flops():
    counts = {1: 2, 2: 3, 3: 2, 5: 4, 6: 3, 7: 4}
    sm = validate_model(split_model(MODEL, counts))
    assert sm.n_layers == MODEL.n_layers + 1 + 2 + 1 + 3 + 2 + 3
    assert model_params(sm) == model_params(MODEL)
    cl = cluster_from_config({"name": "x", "nodes": 1, "gpus_per_node": 2, "device": "H100-SXM"})
    whole, split = AnalyticCostModel().table(MODEL, cl), AnalyticCostModel().table(sm, cl)
    assert split.flops.sum() == pytest.approx(whole.flops.sum(), rel=1e-9)
    assert split.static_bytes.sum() == pytest.approx(whole.static_bytes.sum(), rel=1e-9)
    idx = piece_map(MODEL.n_layers, counts)
    for i in counts:          # the pieces of a layer are cheaper than it, one by one
        assert (split.flops[idx == i] < whole.flops[i]).all()
    # a piece that is not the last sends its carry; the last piece sends what the layer sent
    j = int(np.flatnonzero(idx == 2)[0])
    assert split.out_bytes[j] == 2.0 * carry_width(sm.layers[j]) * MODEL.tokens_per_microbatch
    assert split.out_bytes[int(np.flatnonzero(idx == 2)[-1])] == whole.out_bytes[2]
    assert split.out_bytes[-1] == 0.0


def test_bad_pieces_are_refused():
    with pytest.raises(ConfigError, match="cannot be split .its QK-norm"):
        split_layer(QK_NORM, 2)
    with pytest.raises(ConfigError, match="kv_heads=2 allows 1 to 2"):
        split_layer(LAYERS[1], 3)
    with pytest.raises(ConfigError, match="ssm_groups=4 allows 1 to 4"):
        split_layer(LAYERS[5], 8)
    with pytest.raises(ConfigError, match="experts=7 allows 1 to 7"):
        split_layer(LAYERS[3], 8)
    with pytest.raises(ConfigError, match="layer 9 does not exist"):
        split_model(MODEL, {9: 2})
    with pytest.raises(ConfigError, match="pieces"):
        validate_model(ModelSpec("bad", (LayerSpec(LayerKind.ATTENTION, H, heads=4, kv_heads=2,
                                                   head_dim=16, pieces=3),), 16))
    with pytest.raises(ConfigError, match="QK-norm attention does not split"):
        validate_model(ModelSpec("bad", (replace(QK_NORM, pieces=2),), 16))


def test_choose_counts_pieces_only_heavy_splittable_layers():
    work = np.array([1.0, 1.0, 1.0, 9.0, 6.0])
    ok = [True, True, True, True, False]
    counts = choose_counts(work, ok, n_devices=3, max_share=0.5)   # cap = 0.5 * 18 / 3 = 3
    assert counts == {3: 3}                                        # 9 / 3 pieces; row 4 may not be split
    assert choose_counts(work, ok, 3, 0.5, max_pieces=[1, 1, 1, 2, 1]) == {3: 2}
    assert choose_counts(work, ok, 1, 0.5) == {}
