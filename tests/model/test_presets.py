"""Every preset builds, puts embedding first and head last, and matches its published size."""
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from octopipe.model.build import build_model
from octopipe.model.layer import LayerKind
from octopipe.model.params import layer_params, model_params

CONF = Path(__file__).resolve().parents[2] / "conf" / "model"

# Published totals (model cards / official counts, models-and-hardware.md §1 and §5.1).
PUBLISHED_TOTAL = {
    "llama3_8b": 8.03e9,
    "llama3_70b": 70.55e9,
    "qwen3_8b": 8.2e9,
    "nemotron_h_8b": 8.0e9,
    "nemotron_h_56b": 56.0e9,
    "nemotron_nano2_9b": 9.0e9,
    "jamba15_mini": 52.0e9,
    "gpt_oss_20b": 20.9e9,
    "gpt_oss_120b": 116.8e9,
    "qwen3_30b_a3b": 30.5e9,
    "qwen3_235b_a22b": 235.0e9,
    "minimax_text_01": 456.0e9,
    "deepseek_v3": 671.0e9,
    "qwen2_vl_7b": 8.29e9,
    "llava15_7b": 7.06e9,
}

# Published active parameters (what one token touches).
PUBLISHED_ACTIVE = {
    "jamba15_mini": 12.0e9,
    "qwen3_30b_a3b": 3.3e9,
    "qwen3_235b_a22b": 22.0e9,
    "deepseek_v3": 37.0e9,
}


def load(name):
    return build_model(OmegaConf.load(CONF / f"{name}.yaml"))


ALL = sorted(p.stem for p in CONF.glob("*.yaml")    # layer-pattern presets (module, hf: a user's blocks)
             if not (OmegaConf.load(p).get("factory") or OmegaConf.load(p).get("hf")))
TINY = [n for n in ALL if n.startswith("tiny_")]


def test_every_required_preset_exists():
    assert set(PUBLISHED_TOTAL) | {"kimi_k2"} <= set(ALL)
    assert len(TINY) >= 3


@pytest.mark.parametrize("name", sorted(PUBLISHED_TOTAL))
def test_total_matches_published_within_2_percent(name):
    total = model_params(load(name))
    assert abs(total / PUBLISHED_TOTAL[name] - 1) < 0.02, f"{name}: {total / 1e9:.2f}B"


def test_kimi_k2_total_rounds_to_the_published_1t():
    total = model_params(load("kimi_k2"))
    # The card's "1T" is rounded; the config gives 1.026T (models-and-hardware.md §5.1).
    assert round(total / 1e12) == 1 and abs(total / 1.026e12 - 1) < 0.005


@pytest.mark.parametrize("name", sorted(PUBLISHED_ACTIVE))
def test_active_matches_published_within_2_percent(name):
    active = model_params(load(name), active=True)
    assert abs(active / PUBLISHED_ACTIVE[name] - 1) < 0.02, f"{name}: {active / 1e9:.2f}B"


def test_minimax_and_gpt_oss_active_excluding_embedding_and_head():
    # The cards quote active parameters without the input embedding (and MiniMax without the head).
    m = load("minimax_text_01")
    body = sum(layer_params(x, True) for x in m.layers if x.kind not in (LayerKind.EMBEDDING, LayerKind.HEAD))
    assert abs(body / 45.9e9 - 1) < 0.01
    for name, active in (("gpt_oss_120b", 5.1e9), ("gpt_oss_20b", 3.6e9)):
        m = load(name)
        no_embed = sum(layer_params(x, True) for x in m.layers if x.kind is not LayerKind.EMBEDDING)
        assert abs(no_embed / active - 1) < 0.02


def test_qwen2_vl_vision_encoder_is_675m():
    m = load("qwen2_vl_7b")
    vit = sum(layer_params(x) for x in m.layers
              if x.kind in (LayerKind.PATCH_EMBED, LayerKind.VIT_BLOCK, LayerKind.PROJECTOR))
    assert abs(vit / 675e6 - 1) < 0.01


@pytest.mark.parametrize("name", ALL)
def test_embedding_first_head_last_as_separate_layers(name):
    m = load(name)
    kinds = [x.kind for x in m.layers]
    assert kinds[-1] is LayerKind.HEAD and kinds.count(LayerKind.HEAD) == 1
    assert kinds.count(LayerKind.EMBEDDING) == 1
    first_text = kinds.index(LayerKind.EMBEDDING)
    assert all(k in (LayerKind.PATCH_EMBED, LayerKind.VIT_BLOCK, LayerKind.PROJECTOR)
               for k in kinds[:first_text])
    assert m.layers[first_text].vocab == m.layers[-1].vocab == m.vocab


def test_published_layouts():
    nh = load("nemotron_h_8b")
    assert nh.n_layers == 52 + 2
    jamba = load("jamba15_mini").layers[1:-1]
    mixers, ffns = jamba[0::2], jamba[1::2]
    assert [i for i, x in enumerate(mixers) if x.kind is LayerKind.ATTENTION] == [4, 12, 20, 28]
    assert [i for i, x in enumerate(ffns) if x.kind is LayerKind.MOE] == list(range(1, 32, 2))
    oss = load("gpt_oss_120b").layers[1:-1:2]
    assert [x.window for x in oss[:4]] == [128, 0, 128, 0] and len(oss) == 36
    mm = load("minimax_text_01").layers[1:-1:2]
    assert [i for i, x in enumerate(mm) if x.kind is LayerKind.ATTENTION] == list(range(7, 80, 8))
    ds = load("deepseek_v3").layers[2:-1:2]
    assert [x.kind for x in ds[:4]] == [LayerKind.MLP] * 3 + [LayerKind.MOE] and len(ds) == 61


def test_vlm_front_end_and_token_counts():
    m = load("qwen2_vl_7b")
    kinds = [x.kind for x in m.layers]
    assert kinds[:3] == [LayerKind.PATCH_EMBED, LayerKind.VIT_BLOCK, LayerKind.VIT_BLOCK]
    assert kinds.count(LayerKind.VIT_BLOCK) == 32
    proj = m.layers[kinds.index(LayerKind.PROJECTOR)]
    assert (proj.tokens, proj.in_hidden, proj.hidden) == (256, 5120, 3584)
    attn = next(x for x in m.layers if x.kind is LayerKind.ATTENTION)
    assert attn.tokens == m.seq_len + 256


def test_tiny_presets_cover_every_layer_kind_and_stay_small():
    kinds, windows, acts = set(), set(), set()
    for name in TINY:
        m = load(name)
        assert model_params(m) < 5e6 and m.seq_len <= 128
        assert all(x.hidden <= 128 for x in m.layers)
        kinds |= {x.kind for x in m.layers}
        windows |= {x.window > 0 for x in m.layers if x.kind is LayerKind.ATTENTION}
        acts |= {x.activation for x in m.layers if x.kind is LayerKind.MLP}
    assert kinds == set(LayerKind)
    assert windows == {True, False}
    assert acts == {"swiglu", "gelu", "relu2"}
