"""ModelSpec from a config dict: layer shapes, hand-computed parameter counts, bad input."""
import pytest

from octopipe.errors import ConfigError
from octopipe.model.build import build_model
from octopipe.model.layer import LayerKind, LayerSpec
from octopipe.model.params import layer_params
from octopipe.model.validate import validate_layer

BASE = {
    "name": "t", "seq_len": 64, "vocab": 1000, "hidden": 64, "pattern": "*-E",
    "blocks": {
        "attention": {"heads": 8, "kv_heads": 2, "head_dim": 8},
        "mlp": {"ffn": 256, "activation": "swiglu"},
        "moe": {"experts": 4, "top_k": 2, "expert_ffn": 32, "shared_experts": 1, "shared_ffn": 16},
    },
}


def cfg(**changes):
    import copy
    c = copy.deepcopy(BASE)
    for path, value in changes.items():
        node = c
        keys = path.split("__")
        for k in keys[:-1]:
            node = node[k]
        node[keys[-1]] = value
    return c


def test_builds_embedding_pattern_head():
    m = build_model(cfg())
    assert [x.kind for x in m.layers] == [LayerKind.EMBEDDING, LayerKind.ATTENTION, LayerKind.MLP,
                                          LayerKind.MOE, LayerKind.HEAD]
    assert m.layers[1].hidden == 64 and m.layers[1].heads == 8
    assert m.tokens_per_microbatch == 64


def test_hand_computed_parameter_counts():
    h, V = 64, 1000
    m = build_model(cfg())
    emb, attn, mlp, moe, head = (layer_params(x) for x in m.layers)
    assert emb == V * h
    assert attn == h + h * 64 + 2 * h * 16 + 64 * h            # norm, Q, K, V, O
    assert mlp == h + 3 * h * 256
    assert moe == h + h * 4 + 4 * 3 * h * 32 + 3 * h * 16      # norm, router, experts, shared
    assert layer_params(m.layers[3], active=True) == h + h * 4 + 2 * 3 * h * 32 + 3 * h * 16
    assert head == h + h * V


def test_llama3_8b_layer_counts_by_hand():
    h = 4096
    attn = LayerSpec(LayerKind.ATTENTION, h, heads=32, kv_heads=8, head_dim=128)
    mlp = LayerSpec(LayerKind.MLP, h, ffn=14336)
    assert layer_params(attn) == h + 2 * h * h + 2 * h * 1024
    assert layer_params(mlp) == h + 3 * h * 14336


def test_mamba2_parameter_count_by_hand():
    # Nemotron-H-8B mixer: in_proj h->(2*d_in + 2*G*N + H), conv over d_in + 2GN, A/D/dt_bias, norm, out.
    x = LayerSpec(LayerKind.MAMBA2, 4096, ssm_heads=128, ssm_head_dim=64, ssm_state=128, ssm_groups=8)
    d_in, conv = 8192, 8192 + 2 * 8 * 128
    expect = 4096 + 4096 * (2 * d_in + 2 * 1024 + 128) + conv * 5 + 3 * 128 + d_in + d_in * 4096
    assert layer_params(x) == expect


def test_head_dim_defaults_to_hidden_over_heads():
    m = build_model(cfg(blocks__attention={"heads": 8, "kv_heads": 2}))
    assert m.layers[1].head_dim == 8


@pytest.mark.parametrize("changes, field", [
    ({"hidden": -64}, "model.hidden"),
    ({"seq_len": 0}, "model.seq_len"),
    ({"blocks__attention__kv_heads": 3}, "model.blocks.attention.kv_heads"),
    ({"blocks__attention__head_dim": -8}, "model.blocks.attention.head_dim"),
    ({"blocks__attention": {"heads": 7, "kv_heads": 7}}, "model.blocks.attention.heads"),
    ({"blocks__moe__top_k": 5}, "model.blocks.moe.top_k"),
    ({"blocks__moe__shared_ffn": 0}, "model.blocks.moe.shared_ffn"),
    ({"blocks__mlp__activation": "tanh"}, "model.blocks.mlp.activation"),
    ({"blocks__mlp__fnn": 3}, "model.blocks.mlp"),
    ({"pattern": "*-X"}, "model.pattern"),
    ({"pattern": "*-M"}, "model.blocks.mamba2"),
    ({"pattern": "S-"}, "model.blocks.sliding_attention"),
    ({"layers": 3}, "model"),
    ({"blocks__mlp__ffn": 2.5}, "model.blocks.mlp.ffn"),
])
def test_bad_config_names_the_field(changes, field):
    with pytest.raises(ConfigError) as e:
        build_model(cfg(**changes))
    msg = str(e.value)
    assert msg.startswith(field) and "\n" not in msg


def test_sliding_attention_needs_window_and_full_attention_refuses_one():
    c = cfg(pattern="S-", blocks__sliding_attention={"heads": 8, "kv_heads": 2, "head_dim": 8, "window": 16})
    assert build_model(c).layers[1].window == 16
    with pytest.raises(ConfigError, match="model.blocks.attention.window"):
        build_model(cfg(blocks__attention={"heads": 8, "kv_heads": 2, "head_dim": 8, "window": 4}))


def test_vision_section_errors():
    vision = {"hidden": 60, "tokens": 16, "patch": 4, "depth": 1, "heads": 7, "ffn": 8,
              "projector_ffn": 8, "merge": 4}
    with pytest.raises(ConfigError, match=r"^model.vision.heads=7: must divide hidden=60"):
        build_model(cfg(vision=vision))
    with pytest.raises(ConfigError, match=r"^model.vision.merge=3"):
        build_model(cfg(vision={**vision, "heads": 6, "merge": 3}))


def test_validate_layer_rejects_negative_and_missing_fields():
    with pytest.raises(ConfigError, match=r"^x.ffn=-1: must not be negative"):
        validate_layer(LayerSpec(LayerKind.MLP, 8, ffn=-1), "x")
    with pytest.raises(ConfigError, match=r"^x.ssm_state=0"):
        validate_layer(LayerSpec(LayerKind.MAMBA2, 8, ssm_heads=2, ssm_head_dim=4), "x")
    with pytest.raises(ConfigError, match=r"^x.ssm_groups=3: must divide ssm_heads=4"):
        validate_layer(LayerSpec(LayerKind.MAMBA2, 8, ssm_heads=4, ssm_head_dim=4, ssm_state=4,
                                 ssm_groups=3), "x")
