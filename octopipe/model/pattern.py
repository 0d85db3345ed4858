"""A compact layer-pattern notation, so a preset of a hundred layers stays one line.

One character per residual sub-layer, after NVIDIA's `hybrid_override_pattern` for Nemotron-H
(`M` Mamba-2, `*` attention, `-` MLP, `E` MoE), extended with the other kinds OctoPipe knows.
`(...)xN` repeats a group N times; spaces and `|` are ignored, so `(*-)x32` is Llama-3 8B's
decoder and `M-M-M-M*-(M-M-M-M-M*-)x9M-M-M-M-M-` is Nemotron-H 56B's.

The token embedding and the LM head are not letters: the model builder adds them first and
last as separate layers, so partitioning can move them like any other layer.
"""
from __future__ import annotations

from octopipe.errors import ConfigError
from octopipe.model.layer import LayerKind

LETTERS: dict[str, LayerKind] = {
    "M": LayerKind.MAMBA2,
    "m": LayerKind.MAMBA1,
    "*": LayerKind.ATTENTION,           # full causal softmax attention (GQA)
    "S": LayerKind.ATTENTION,           # sliding-window softmax attention (needs `window`)
    "A": LayerKind.MLA,
    "L": LayerKind.LINEAR_ATTENTION,
    "-": LayerKind.MLP,
    "E": LayerKind.MOE,
}

LETTER_NAMES: dict[str, str] = {
    "M": "Mamba-2", "m": "Mamba-1", "*": "attention", "S": "sliding-window attention",
    "A": "MLA attention", "L": "lightning attention", "-": "MLP", "E": "MoE",
}


# The preset's `blocks:` entry that gives each letter's shape (a name, so CLI overrides such as
# `model.blocks.attention.heads=16` stay plain dotted keys).
BLOCKS: dict[str, str] = {
    "M": "mamba2", "m": "mamba1", "*": "attention", "S": "sliding_attention",
    "A": "mla", "L": "linear_attention", "-": "mlp", "E": "moe",
}


def valid_letters() -> str:
    return ", ".join(f"{c!r}={n}" for c, n in LETTER_NAMES.items())


def parse_pattern(pattern: str, field: str = "pattern") -> tuple[str, ...]:
    """Expand a pattern into one letter per layer; ConfigError names a bad letter or bracket."""
    text = "".join(c for c in str(pattern) if not c.isspace() and c != "|")
    letters, pos = _parse_seq(text, 0, field, depth=0)
    if pos != len(text):
        raise ConfigError(f"{field}: unmatched ')' at position {pos} in {pattern!r}")
    if not letters:
        raise ConfigError(f"{field}: the pattern {pattern!r} has no layers; give at least one of "
                          f"{valid_letters()}")
    return tuple(letters)


def _parse_seq(text: str, pos: int, field: str, depth: int) -> tuple[list[str], int]:
    out: list[str] = []
    while pos < len(text):
        c = text[pos]
        if c == ")":
            if depth == 0:
                raise ConfigError(f"{field}: unmatched ')' at position {pos} in {text!r}")
            return out, pos
        if c == "(":
            inner, end = _parse_seq(text, pos + 1, field, depth + 1)
            if end >= len(text) or text[end] != ")":
                raise ConfigError(f"{field}: '(' at position {pos} is never closed in {text!r}")
            count, pos = _parse_repeat(text, end + 1, field)
            out.extend(inner * count)
            continue
        if c not in LETTERS:
            raise ConfigError(f"{field}: unknown layer letter {c!r} in {text!r}; valid letters: "
                              f"{valid_letters()}, plus '(...)xN' to repeat")
        out.append(c)
        pos += 1
    return out, pos


def _parse_repeat(text: str, pos: int, field: str) -> tuple[int, int]:
    if pos >= len(text) or text[pos] != "x":
        raise ConfigError(f"{field}: a group '(...)' must be followed by 'xN' (a repeat count) "
                          f"at position {pos} in {text!r}")
    end = pos + 1
    while end < len(text) and text[end].isdigit():
        end += 1
    if end == pos + 1 or int(text[pos + 1:end]) < 1:
        raise ConfigError(f"{field}: repeat count after 'x' at position {pos} must be a positive "
                          f"integer in {text!r}")
    return int(text[pos + 1:end]), end


def format_pattern(letters: tuple[str, ...] | list[str]) -> str:
    """The plain (unrepeated) string of a letter sequence; parse_pattern's inverse."""
    return "".join(letters)
