"""ModelSpec from a model config (a `conf/model/*.yaml` preset, after Hydra overrides).

A preset gives the training shape, a layer pattern (see `octopipe.model.pattern`) and, under
`blocks:`, the shape of each letter's layer:

    name: llama3_8b
    seq_len: 8192
    vocab: 128256
    hidden: 4096
    pattern: "(*-)x32"
    blocks:
      attention: {heads: 32, kv_heads: 8, head_dim: 128}
      mlp: {ffn: 14336, activation: swiglu}

The built model is: [vision front end], token embedding, the pattern's layers, head (final
norm + LM head + loss), each a separate layer. An optional `vision:` section adds a patch
embedding, `depth` ViT blocks and a projector in front; the language layers then carry the
image tokens plus `seq_len` text tokens (the image tokens come first, as the runtime does).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from octopipe.config.convert import convert
from octopipe.config.model import ModelConfig
from octopipe.errors import ConfigError
from octopipe.model.layer import LayerKind, LayerSpec
from octopipe.model.pattern import BLOCKS, LETTER_NAMES, LETTERS, parse_pattern
from octopipe.model.spec import ModelSpec
from octopipe.model.validate import validate_layer, validate_model

VISION_KEYS = ("hidden", "tokens", "patch", "temporal_patch", "channels", "depth", "heads",
               "ffn", "activation", "bias", "merge", "projector_ffn")
_LAYER_FIELDS = {f.name for f in fields(LayerSpec)} - {"kind", "name", "tokens", "vocab",
                                                        "piece", "pieces"}


def _int(where: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value:
        raise ConfigError(f"{where}={value!r}: must be an integer")
    return int(value)


def _check_keys(where: str, got: Mapping, allowed) -> None:
    unknown = sorted(set(got) - set(allowed))
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r}; valid keys: {', '.join(sorted(allowed))}")


def _block_layer(letter: str, block: str, shape: Mapping, hidden: int, tokens: int) -> LayerSpec:
    where = f"model.blocks.{block}"
    _check_keys(where, shape, _LAYER_FIELDS)
    kw: dict[str, Any] = {"hidden": hidden}
    for key, value in shape.items():
        if isinstance(value, (bool, str)):
            kw[key] = value
        else:
            kw[key] = _int(f"{where}.{key}", value)
    if letter == "S" and kw.get("window", 0) <= 0:
        raise ConfigError(f"{where}.window={kw.get('window', 0)}: sliding-window attention ('S') "
                          f"needs a positive window")
    if letter == "*" and kw.get("window", 0) != 0:
        raise ConfigError(f"{where}.window={kw['window']}: full attention ('*') has no window; "
                          f"use a sliding_attention block with the letter 'S'")
    if LETTERS[letter] is LayerKind.ATTENTION and "head_dim" not in kw and kw.get("heads", 0) > 0:
        kw["head_dim"] = _head_dim(where, hidden, kw["heads"])
    layer = LayerSpec(kind=LETTERS[letter], name=block, tokens=tokens, **kw)
    return validate_layer(layer, where)


def _head_dim(where: str, hidden: int, heads: int) -> int:
    if hidden % heads:
        raise ConfigError(f"{where}.heads={heads}: must divide hidden={hidden} when head_dim is not "
                          f"given")
    return hidden // heads


def _vision_layers(v: Mapping, text_hidden: int) -> tuple[list[LayerSpec], int]:
    """Patch embedding, ViT blocks and projector; returns them and the image tokens they emit."""
    _check_keys("model.vision", v, VISION_KEYS)
    missing = [k for k in ("hidden", "tokens", "patch", "depth", "heads", "ffn", "projector_ffn")
               if k not in v]
    if missing:
        raise ConfigError(f"model.vision.{missing[0]}: missing; a vision section needs "
                          f"hidden, tokens, patch, depth, heads, ffn and projector_ffn")
    n = {k: _int(f"model.vision.{k}", v[k]) for k in v if k not in ("activation", "bias")}
    hidden, tokens, merge = n["hidden"], n["tokens"], n.get("merge", 1)
    bias, act = bool(v.get("bias", True)), str(v.get("activation", "gelu"))
    if hidden <= 0:
        raise ConfigError(f"model.vision.hidden={hidden}: must be a positive width")
    if n["heads"] <= 0:
        raise ConfigError(f"model.vision.heads={n['heads']}: must be positive")
    if merge <= 0 or tokens % merge:
        raise ConfigError(f"model.vision.merge={merge}: must be positive and divide "
                          f"model.vision.tokens={tokens}")
    head_dim = _head_dim("model.vision", hidden, n["heads"])
    patch = LayerSpec(LayerKind.PATCH_EMBED, hidden, name="patch_embed", patch=n["patch"],
                      channels=n.get("channels", 3), temporal_patch=n.get("temporal_patch", 1),
                      tokens=tokens, bias=False)
    block = LayerSpec(LayerKind.VIT_BLOCK, hidden, name="vit_block", heads=n["heads"],
                      kv_heads=n["heads"], head_dim=head_dim, causal=False, ffn=n["ffn"],
                      activation=act, bias=bias, tokens=tokens)
    proj = LayerSpec(LayerKind.PROJECTOR, text_hidden, name="projector",
                     in_hidden=hidden * merge, ffn=n["projector_ffn"], activation="gelu",
                     bias=True, tokens=tokens // merge)
    layers = [patch] + [block] * n["depth"] + [proj]
    for x in layers:
        validate_layer(x, f"model.vision({x.name})")
    return layers, tokens // merge


def build_model(cfg: ModelConfig) -> ModelSpec:
    """Build and validate the ModelSpec a model config describes (a mapping is converted first,
    for callers that still hold a preset's raw mapping)."""
    c = convert(ModelConfig, cfg, "model.")
    if c.factory or c.hf:
        raise ConfigError(f"model.{'factory' if c.factory else 'hf'}={c.factory or c.hf}: a user's module "
                          f"has no layer pattern to plan from; mode=train profiles and plans it")
    seq_len, mbs, vocab, hidden = c.seq_len, c.micro_batch_size, c.vocab, c.hidden
    blocks = c.blocks
    _check_keys("model.blocks", blocks, BLOCKS.values())
    letters = parse_pattern(c.pattern, "model.pattern")

    front: list[LayerSpec] = []
    image_tokens = 0
    if c.vision:
        front, image_tokens = _vision_layers(c.vision, hidden)
    text_tokens = seq_len + image_tokens if image_tokens else 0

    by_letter: dict[str, LayerSpec] = {}
    for letter in dict.fromkeys(letters):
        block = BLOCKS[letter]
        if block not in blocks:
            raise ConfigError(f"model.blocks.{block}: the pattern uses {letter!r} "
                              f"({LETTER_NAMES[letter]}) but no such block is defined; defined: "
                              f"{', '.join(blocks) or '(none)'}")
        by_letter[letter] = _block_layer(letter, block, blocks[block] or {}, hidden, text_tokens)

    layers = (front
              + [LayerSpec(LayerKind.EMBEDDING, hidden, name="embedding", vocab=vocab,
                           tokens=text_tokens)]
              + [by_letter[c_] for c_ in letters]
              + [LayerSpec(LayerKind.HEAD, hidden, name="head", vocab=vocab)])
    spec = ModelSpec(name=c.name, layers=tuple(layers), seq_len=seq_len,
                     micro_batch_size=mbs, vocab=vocab, source=c.source)
    return validate_model(spec)
