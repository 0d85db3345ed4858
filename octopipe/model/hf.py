"""A Hugging Face causal LM as pipeline blocks: `model=hf model.hf=llama` (or a local
config.json), random initialization from the config, nothing downloaded (`pip install
octopipe[hf]`).

For the decoder families with an embedding, a list of decoder layers, a final norm and a head
(Llama, Qwen2, Qwen3, Mistral, Mixtral), `build` returns [embedding, one block per decoder
layer, norm + head]: each decoder block computes its rotary embeddings (cos, sin) from the
positions itself and runs its layer with PyTorch's SDPA causal attention (no mask tensor
travels), so a stage hands on only the hidden states. The blocks follow the module-factory
contract of `octopipe.model.user_module` (ids in, logits out) and train like any user module.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from octopipe.errors import ConfigError

FAMILIES = ("llama", "qwen2", "qwen3", "mistral", "mixtral")
TINY: dict[str, Any] = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256,
                        "max_position_embeddings": 512, "head_dim": 16}
TINY_FAMILY: dict[str, dict[str, Any]] = {
    "mixtral": {"num_local_experts": 4, "num_experts_per_tok": 2},
    "mistral": {"sliding_window": None},
    "qwen2": {"use_sliding_window": False},
    "qwen3": {"use_sliding_window": False},
}


def _transformers():
    try:
        import transformers  # the optional `hf` extra
    except ImportError as e:
        raise ConfigError("model=hf needs the transformers package: pip install 'octopipe[hf]'") from e
    return transformers


def hf_config(ref: str, overrides: dict | None = None):
    """A transformers config: a family name (one of FAMILIES, tiny shapes) or a config.json path."""
    tf = _transformers()
    path = Path(ref)
    if ref in FAMILIES:
        cfg = tf.AutoConfig.for_model(ref, **{**TINY, **TINY_FAMILY.get(ref, {}), **(overrides or {})})
    elif path.suffix == ".json" or path.is_dir():
        if not path.exists():
            raise ConfigError(f"model.hf={ref}: no such config file")
        cfg = tf.AutoConfig.from_pretrained(str(path), **(overrides or {}))
    else:
        raise ConfigError(f"model.hf={ref!r}: a family ({', '.join(FAMILIES)}) or a local config.json")
    if cfg.model_type not in FAMILIES:
        raise ConfigError(f"model.hf={ref}: model_type {cfg.model_type!r} is not adapted; adapted: "
                          f"{', '.join(FAMILIES)}")
    cfg._attn_implementation = "sdpa"
    return cfg


class HFEmbed(nn.Module):
    def __init__(self, embed: nn.Module) -> None:
        super().__init__()
        self.embed = embed

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embed(ids)


class HFDecoder(nn.Module):
    """One decoder layer with its rotary embedding; causal SDPA attention, no mask tensor."""

    def __init__(self, layer: nn.Module, rotary: nn.Module) -> None:
        super().__init__()
        self.layer, self.rotary = layer, rotary

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(h.shape[1], device=h.device).unsqueeze(0).expand(h.shape[0], -1)
        cos_sin = self.rotary(h, pos)
        out = self.layer(h, attention_mask=None, position_ids=pos, position_embeddings=cos_sin)
        return out[0] if isinstance(out, tuple) else out


class HFHead(nn.Module):
    def __init__(self, norm: nn.Module, head: nn.Module) -> None:
        super().__init__()
        self.norm, self.head = norm, head

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(h))


def build(config: str = "llama", **overrides: Any) -> list[nn.Module]:
    """The blocks of a randomly initialized causal LM of `config` (see `hf_config`)."""
    tf = _transformers()
    lm = tf.AutoModelForCausalLM.from_config(hf_config(config, overrides))
    body = lm.model
    return [HFEmbed(body.embed_tokens), *(HFDecoder(layer, body.rotary_emb) for layer in body.layers),
            HFHead(body.norm, lm.lm_head)]


def vocab_of(config: str) -> int:
    return int(hf_config(config).vocab_size)
