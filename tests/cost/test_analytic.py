"""Analytic cost model against hand-computed values and published formulas (models-and-hardware.md §3)."""
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from octopipe.cluster import Cluster, DeviceKind, Link
from octopipe.cost.analytic import AnalyticCostModel
from octopipe.errors import ConfigError
from octopipe.model.build import build_model
from octopipe.model.layer import LayerKind, LayerSpec
from octopipe.model.params import layer_params
from octopipe.model.spec import ModelSpec

CONF = Path(__file__).resolve().parents[2] / "conf" / "model"
H100 = DeviceKind("H100-SXM", 989.4e12, 80e9, 3350e9)
A100 = DeviceKind("A100-80GB", 312e12, 80e9, 2039e9)
NV = Link("nv", 450e9, 3e-6)
ONE = Cluster("one", (H100,), (0,), (0,), NV, NV)
MIXED = Cluster("mixed", (H100, A100), (0, 1), (0, 1), NV, NV)


def preset(name):
    return build_model(OmegaConf.load(CONF / f"{name}.yaml"))


def gflop_per_token(model, kind, nth=0, name=None):
    layers = [x for x in model.layers if x.kind is kind and (name is None or x.name == name)]
    w = AnalyticCostModel().work(layers[nth], model)
    return w.flops / (model.seq_len * model.micro_batch_size) / 1e9


def single(layer, seq=4096, b=1, vocab=0):
    return ModelSpec("one", (layer,), seq, b, vocab)


# §3.6: per-layer forward GFLOP/token, at each model's training sequence length.
K = LayerKind
TABLE_3_6 = [
    ("llama3_8b", K.ATTENTION, None, 0.151), ("llama3_8b", K.MLP, None, 0.352),
    ("llama3_8b", K.HEAD, None, 1.051),
    ("llama3_70b", K.ATTENTION, None, 0.436), ("llama3_70b", K.MLP, None, 1.409),
    ("llama3_70b", K.HEAD, None, 2.101),
    ("qwen3_8b", K.ATTENTION, None, 0.117), ("qwen3_8b", K.MLP, None, 0.302),
    ("qwen3_8b", K.HEAD, None, 1.245),
    ("nemotron_h_8b", K.MAMBA2, None, 0.226), ("nemotron_h_8b", K.ATTENTION, None, 0.151),
    ("nemotron_h_8b", K.MLP, None, 0.352), ("nemotron_h_8b", K.HEAD, None, 1.074),
    ("nemotron_h_56b", K.MAMBA2, None, 0.898), ("nemotron_h_56b", K.ATTENTION, None, 0.436),
    ("nemotron_h_56b", K.MLP, None, 1.074),
    ("nemotron_nano2_9b", K.MAMBA2, None, 0.303), ("nemotron_nano2_9b", K.ATTENTION, None, 0.194),
    ("nemotron_nano2_9b", K.MLP, None, 0.281),
    ("jamba15_mini", K.ATTENTION, None, 0.117), ("jamba15_mini", K.MAMBA1, None, 0.21),
    ("jamba15_mini", K.MLP, None, 0.352), ("jamba15_mini", K.MOE, None, 0.705),
    ("gpt_oss_120b", K.ATTENTION, "sliding_attention", 0.055),
    ("gpt_oss_120b", K.ATTENTION, "attention", 0.087), ("gpt_oss_120b", K.MOE, None, 0.200),
    ("gpt_oss_120b", K.HEAD, None, 1.158),
    ("qwen3_30b_a3b", K.ATTENTION, None, 0.071), ("qwen3_30b_a3b", K.MOE, None, 0.076),
    ("qwen3_235b_a22b", K.ATTENTION, None, 0.210), ("qwen3_235b_a22b", K.MOE, None, 0.303),
    ("minimax_text_01", K.ATTENTION, None, 0.361), ("minimax_text_01", K.LINEAR_ATTENTION, None, 0.51),
    ("minimax_text_01", K.MOE, None, 0.680), ("minimax_text_01", K.HEAD, None, 2.458),
    ("deepseek_v3", K.MLA, None, 0.542), ("deepseek_v3", K.MLP, None, 0.793),
    ("deepseek_v3", K.MOE, None, 0.796), ("deepseek_v3", K.HEAD, None, 1.853),
    ("kimi_k2", K.MLA, None, 0.286), ("kimi_k2", K.MLP, None, 0.793),
    ("kimi_k2", K.MOE, None, 0.798), ("kimi_k2", K.HEAD, None, 2.349),
]


@pytest.mark.parametrize("name, kind, label, expected", TABLE_3_6)
def test_per_layer_gflop_per_token_table(name, kind, label, expected):
    got = gflop_per_token(preset(name), kind, name=label)
    assert got == pytest.approx(expected, rel=0.01, abs=6e-4)


def test_attention_core_share_of_llama3_8b():
    m = preset("llama3_8b")
    w = AnalyticCostModel().work(next(x for x in m.layers if x.kind is K.ATTENTION), m)
    assert w.core_flops / 8192 / 1e9 == pytest.approx(0.067, abs=6e-4)
    # Megatron's GQA form 4·b·s·h·p·(h + h·g/a + s/2), p = a·d/h.
    h, a, g, s = 4096, 32, 8, 8192
    assert w.flops == pytest.approx(4 * s * h * 1.0 * (h + h * g / a + s / 2))


def test_dense_training_flops_are_6_n_tokens():
    m = build_model({**OmegaConf.to_container(OmegaConf.load(CONF / "llama3_8b.yaml")), "seq_len": 512})
    cm = AnalyticCostModel()
    works = [cm.work(x, m) for x in m.layers]
    train = sum(sum(cm.pass_work(w)[p][0] for p in "fiw") for w in works)
    # Each GEMM (2·params FLOPs per token) runs thrice (F, I, W); attention cores once forward
    # and 2.5x in backward.
    assert train == pytest.approx(sum(3 * w.gemm_flops + 3.5 * w.core_flops for w in works))
    matmul_params = sum(layer_params(x) for x in m.layers if x.kind is not K.EMBEDDING)
    assert train == pytest.approx(6 * matmul_params * 512, rel=0.02)


def gpt_block(h=1024, a=16, s=2048, b=2):
    attn = LayerSpec(K.ATTENTION, h, heads=a, kv_heads=a, head_dim=h // a)
    mlp = LayerSpec(K.MLP, h, ffn=4 * h, activation="gelu")
    return ModelSpec("gpt", (attn, mlp), s, b)


def block_act(model, **settings):
    cm = AnalyticCostModel(**settings)
    return sum(cm.stored_activation_bytes(cm.work(x, model)) for x in model.layers)


def test_korthikanti_activation_formula_without_flash_attention():
    h, a, s, b = 1024, 16, 2048, 2
    m = gpt_block(h, a, s, b)
    assert block_act(m, flash_attention=False, dropout=True) == 34 * s * b * h + 5 * a * s * s * b


def test_activation_formula_with_flash_attention_and_recomputation():
    h, a, s, b = 1024, 16, 2048, 2
    m = gpt_block(h, a, s, b)
    # Flash attention keeps Q, K, V, O and an fp32 log-sum-exp instead of the s x s scores.
    assert block_act(m, flash_attention=True, dropout=True) == 34 * s * b * h + 4 * a * s * b
    # Selective recomputation drops exactly the 5·a·s²·b scores.
    assert block_act(m, flash_attention=False, dropout=True, recompute="selective") == 34 * s * b * h
    # Full recomputation keeps each sub-layer's input.
    assert block_act(m, recompute="full") == 2 * (2 * s * b * h)
    # Tensor + sequence parallelism divide everything by t.
    t = 4
    assert block_act(m, flash_attention=False, dropout=True, tp=t) == \
        pytest.approx((34 * s * b * h + 5 * a * s * s * b) / t)


def test_modern_sub_layer_activation_bytes_per_token():
    m = preset("nemotron_h_8b")
    cm, h, tok = AnalyticCostModel(), 4096, 8192
    per = {x.kind: cm.work(x, m).act_bytes / tok for x in m.layers}
    # Mamba-2: 4h + 2(2 d_in + 2GN + H) + 2 d_in (mamba_ssm's saved zxbcdt and out_x) ~ 17h.
    assert per[K.MAMBA2] == 4 * h + 2 * (2 * 8192 + 2 * 1024 + 128) + 2 * 8192
    assert per[K.MAMBA2] / h == pytest.approx(17, rel=0.07)
    # Attention: 4h + 2(ad + 2gd) + 2ad (+ fp32 LSE) ~ 9h; ReLU² MLP: 4h + 4f ~ 25h.
    assert per[K.ATTENTION] == 4 * h + 2 * (4096 + 2 * 1024) + 2 * 4096 + 4 * 32
    assert per[K.MLP] == 4 * h + 4 * 21504
    swiglu = cm.work(LayerSpec(K.MLP, 64, ffn=256), single(LayerSpec(K.MLP, 64, ffn=256), 16))
    assert swiglu.act_bytes / 16 == 4 * 64 + 6 * 256
    moe = LayerSpec(K.MOE, 64, experts=8, top_k=2, expert_ffn=32, shared_experts=1, shared_ffn=16)
    assert cm.work(moe, single(moe, 16)).act_bytes / 16 == 4 * 64 + 2 * (2 * 64 + 6 * 32) + 6 * 16
    head = LayerSpec(K.HEAD, 64, vocab=1000)
    # Megatron's last stage: 4·s·b·h·(1 + V/h) (fp32 logits).
    assert cm.work(head, single(head, 16, 2, 1000)).act_bytes == 4 * 16 * 2 * 64 * (1 + 1000 / 64)


def split(layer, seq=1024):
    cm = AnalyticCostModel()
    w = cm.work(layer, single(layer, seq))
    return w, cm.pass_work(w)


def test_backward_split_into_input_and_weight_gradients():
    _mlp, p = split(LayerSpec(K.MLP, 256, ffn=1024))
    assert p["f"][0] == p["i"][0] == p["w"][0] == 6 * 256 * 1024 * 1024
    attn, p = split(LayerSpec(K.ATTENTION, 256, heads=4, kv_heads=2, head_dim=64))
    assert attn.core_flops == 4 * 256 * 512 * 1024
    assert p["i"][0] == attn.gemm_flops + 2.5 * attn.core_flops      # flash backward recomputes
    assert p["w"][0] == attn.gemm_flops
    ssm, p = split(LayerSpec(K.MAMBA2, 256, ssm_heads=8, ssm_head_dim=64, ssm_state=16, ssm_groups=2))
    assert ssm.core_flops == 7 * 512 * 16 * 1024 and p["i"][0] == ssm.gemm_flops + 2 * ssm.core_flops
    assert p["w"][0] == ssm.gemm_flops
    emb, p = split(LayerSpec(K.EMBEDDING, 256, vocab=1000))
    assert emb.flops == 0 and p["i"] == (0.0, 0.0) and p["w"][1] > 0   # token ids have no gradient
    moe, p = split(LayerSpec(K.MOE, 256, experts=16, top_k=2, expert_ffn=128))
    # Router plus k experts per token, in F, I and W alike (wgrad = k/E of the dense equivalent).
    assert p["w"][0] == moe.gemm_flops == (2 * 256 * 16 + 2 * 6 * 256 * 128) * 1024


def test_mamba1_lightning_mla_vision_flops_by_hand():
    m1, _ = split(LayerSpec(K.MAMBA1, 64, ssm_heads=1, ssm_head_dim=128, ssm_state=8, dt_rank=4), 32)
    assert m1.gemm_flops / 32 == 2 * 64 * 256 + 2 * 128 * (4 + 16) + 2 * 4 * 128 + 2 * 128 * 64
    assert m1.core_flops / 32 == 9 * 128 * 8
    la, _ = split(LayerSpec(K.LINEAR_ATTENTION, 64, heads=4, head_dim=16), 32)
    assert la.gemm_flops / 32 == 2 * 64 * 4 * 64 + 2 * 64 * 64 and la.core_flops / 32 == 4 * 4 * 16 ** 2
    mla_spec = LayerSpec(K.MLA, 64, heads=4, q_lora_rank=32, kv_lora_rank=16, qk_nope_dim=8,
                         qk_rope_dim=4, v_head_dim=8)
    mla, _ = split(mla_spec, 32)
    assert mla.gemm_flops / 32 == 2 * (64 * 32 + 32 * 4 * 12 + 64 * 20 + 16 * 4 * 16 + 4 * 8 * 64)
    assert mla.core_flops / 32 == 2 * 4 * (12 + 8) * 16
    vit_spec = LayerSpec(K.VIT_BLOCK, 64, heads=4, kv_heads=4, head_dim=16, ffn=256,
                         activation="gelu", causal=False, tokens=32)
    vit, _ = split(vit_spec, 99)
    assert vit.gemm_flops / 32 == 8 * 64 * 64 + 4 * 64 * 256 and vit.core_flops / 32 == 4 * 64 * 32
    pe, _ = split(LayerSpec(K.PATCH_EMBED, 64, patch=4, channels=3, temporal_patch=2, tokens=32), 99)
    assert pe.gemm_flops / 32 == 2 * 3 * 2 * 16 * 64
    pr, _ = split(LayerSpec(K.PROJECTOR, 96, in_hidden=256, ffn=128, tokens=8), 99)
    assert pr.gemm_flops / 8 == 2 * 256 * 128 + 2 * 128 * 96 and pr.out_bytes == 2 * 8 * 96


def test_qwen2_vl_vision_flops_match_reference():
    m = preset("qwen2_vl_7b")
    cm = AnalyticCostModel()
    vit = [cm.work(x, m) for x in m.layers if x.kind is K.VIT_BLOCK]
    assert sum(w.gemm_flops for w in vit) / 1024 / 1e9 == pytest.approx(1.26, rel=0.01)
    assert sum(w.core_flops for w in vit) / 1024 / 1e9 == pytest.approx(0.17, rel=0.02)


def test_llava_vision_tower_flops_match_reference():
    m = preset("llava15_7b")
    cm = AnalyticCostModel()
    vit = sum(cm.work(x, m).flops for x in m.layers if x.kind is K.VIT_BLOCK)
    assert vit / 1e12 == pytest.approx(0.38, rel=0.01)       # ≈0.38 TFLOP per 336² image


def test_sliding_window_caps_the_attention_core():
    full = LayerSpec(K.ATTENTION, 256, heads=4, kv_heads=4, head_dim=64)
    swa = LayerSpec(K.ATTENTION, 256, heads=4, kv_heads=4, head_dim=64, window=128)
    (wf, _), (ws, _) = split(full, 4096), split(swa, 4096)
    assert wf.core_flops == 4 * 256 * 2048 * 4096 and ws.core_flops == 4 * 256 * 128 * 4096
    assert wf.gemm_flops == ws.gemm_flops


def test_roofline_compute_and_memory_bound():
    cm = AnalyticCostModel(efficiency=0.5)
    m = preset("llama3_8b")
    t = cm.table(m, MIXED)
    j = next(i for i, x in enumerate(m.layers) if x.kind is K.MLP)
    flops = 6 * 4096 * 14336 * 8192
    assert t.f[j, 0] == pytest.approx(flops / (989.4e12 * 0.5))
    assert t.f[j, 1] == pytest.approx(flops / (312e12 * 0.5))
    # The embedding is a gather: memory-bound, time = bytes / (bandwidth · efficiency).
    w = cm.work(m.layers[0], m)
    nbytes = cm.pass_work(w)["f"][1]
    assert t.f[0, 0] == pytest.approx(nbytes / (3350e9 * 0.5)) and t.f[0, 0] > 0


def test_table_shape_memory_and_boundary_bytes():
    m = preset("llama3_8b")
    t = AnalyticCostModel().table(m, MIXED)
    assert t.kinds == ("H100-SXM", "A100-80GB") and t.f.shape == (m.n_layers, 2)
    assert np.array_equal(t.params, [layer_params(x) for x in m.layers])
    assert np.allclose(t.static_bytes, 18 * t.params)
    assert np.allclose(AnalyticCostModel(bytes_per_param=16).table(m, ONE).static_bytes, 16 * t.params)
    # s·b·h·2 bytes per stage boundary (67 MB for Llama-3-8B at s=8192), none after the head.
    assert t.out_bytes[1] == 8192 * 4096 * 2 and t.out_bytes[-1] == 0
    assert t.tokens_per_microbatch == 8192 and t.flops.sum() > 0
    assert np.all(t.w_act_bytes <= t.act_bytes + 1e-9)
    assert t.range_sum("f", 1, 5, 1) == pytest.approx(t.f[1:5, 1].sum())


def test_vlm_boundaries():
    m = preset("qwen2_vl_7b")
    t = AnalyticCostModel().table(m, ONE)
    kinds = [x.kind for x in m.layers]
    vit, proj = kinds.index(K.VIT_BLOCK), kinds.index(K.PROJECTOR)
    assert t.out_bytes[vit] == 1024 * 1280 * 2                 # ViT-internal: patch tokens
    assert t.out_bytes[proj] == 256 * 3584 * 2                 # ViT -> LLM: image tokens
    assert t.out_bytes[proj + 2] == (3840 + 256) * 3584 * 2    # text + image tokens


def test_tensor_parallel_divides_work_memory_and_messages():
    m = preset("llama3_8b")
    t1 = AnalyticCostModel().table(m, ONE)
    t4 = AnalyticCostModel(tp=4, tp_collectives=False).table(m, ONE)
    j = 2
    assert t4.f[j, 0] == pytest.approx(t1.f[j, 0] / 4)
    for name in ("static_bytes", "act_bytes", "out_bytes"):
        assert np.allclose(getattr(t4, name), getattr(t1, name) / 4)
    assert np.array_equal(t4.params, t1.params) and np.array_equal(t4.flops, t1.flops)


def test_recomputation_moves_forward_work_into_i():
    m = gpt_block()
    none = AnalyticCostModel(flash_attention=False).table(m, ONE)
    full = AnalyticCostModel(flash_attention=False, recompute="full").table(m, ONE)
    assert np.allclose(full.f, none.f) and np.allclose(full.w, none.w)
    assert np.all(full.i > none.i) and np.all(full.act_bytes < none.act_bytes)
    # Selective recomputation reruns only the attention core (the MLP is untouched).
    sel, base = (AnalyticCostModel(flash_attention=False, recompute=r) for r in ("selective", "none"))
    attn, mlp = (base.work(x, m) for x in m.layers)
    assert sel.pass_work(attn)["i"][0] == base.pass_work(attn)["i"][0] + attn.core_flops
    assert sel.pass_work(mlp) == base.pass_work(mlp)


@pytest.mark.parametrize("settings, field", [
    ({"efficiency": 0}, "cost.efficiency"), ({"tp": 0}, "cost.tp"),
    ({"recompute": "some"}, "cost.recompute"), ({"bytes_per_param": -1}, "cost.bytes_per_param"),
])
def test_bad_settings(settings, field):
    with pytest.raises(ConfigError, match=f"^{field}"):
        AnalyticCostModel(**settings)


def test_from_config_reads_the_shipped_yaml():
    cfg = OmegaConf.load(CONF.parent / "cost" / "analytic.yaml")
    cm = AnalyticCostModel.from_config(cfg)
    assert (cm.efficiency, cm.tp, cm.recompute, cm.bytes_per_param) == (0.5, 1, "none", 18)



@settings(max_examples=40, deadline=None)
@given(heads=st.sampled_from([1, 2, 4, 8]), group=st.sampled_from([1, 2, 4]),
       head_dim=st.sampled_from([8, 16, 64]), seq=st.integers(4, 512), b=st.integers(1, 4))
def test_work_scales_with_batch_and_sequence(heads, group, head_dim, seq, b):
    kv = max(heads // group, 1)
    attn = LayerSpec(K.ATTENTION, heads * head_dim, heads=heads, kv_heads=kv, head_dim=head_dim)
    cm = AnalyticCostModel()
    one, many = cm.work(attn, single(attn, seq, 1)), cm.work(attn, single(attn, seq, b))
    for name in ("gemm_flops", "core_flops", "act_bytes", "w_act_bytes", "out_bytes"):
        assert getattr(many, name) == pytest.approx(b * getattr(one, name))
    longer = cm.work(attn, single(attn, 2 * seq, 1))
    assert longer.gemm_flops == pytest.approx(2 * one.gemm_flops)     # linear in s
    assert longer.core_flops == pytest.approx(4 * one.core_flops)     # quadratic in s (causal)
    assert one.weight_bytes == 2 * layer_params(attn)
