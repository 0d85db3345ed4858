"""`model`: a model preset (conf/model/*.yaml), turned into a ModelSpec by octopipe.model.build."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from octopipe.config.fields import REQUIRED, setting


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """The training shape and the layer pattern; `blocks` and `vision` have open-ended shapes
    (one mapping per block kind) and are validated where the model is built."""

    name: str = setting(REQUIRED, "the preset's name (used in reports and plan files)")
    source: str = setting("", "where the figures come from (a model card, a config.json)")
    seq_len: int = setting(REQUIRED, "tokens per sequence (text tokens with a vision front end)",
                           ge=1)
    micro_batch_size: int = setting(1, "sequences per micro-batch", ge=1)
    vocab: int = setting(REQUIRED, "vocabulary size (embedding and LM head)", ge=1)
    hidden: int = setting(REQUIRED, "residual-stream width", ge=1)
    pattern: str = setting(REQUIRED, "layer pattern, e.g. '(*-)x32' (see octopipe.model.pattern)")
    blocks: dict[str, Any] = setting(REQUIRED, "shape of each block kind the pattern uses, e.g. "
                                               "attention: {heads: 32, kv_heads: 8}")
    factory: str = setting("", "model=module: the user's block factory, PKG.MOD:FUNC or "
                               "path/to/file.py:FUNC (octopipe/model/user_module.py)")
    hf: str = setting("", "model=hf: a transformers config, a family (llama, qwen2, qwen3, mistral, "
                          "mixtral: tiny shapes) or a local config.json (octopipe/model/hf.py)")
    vision: dict[str, Any] | None = setting(
        None, "optional vision front end: hidden, tokens, patch, depth, heads, ffn, projector_ffn, "
              "and optionally temporal_patch, channels, activation, bias, merge")
