"""Megatron-LM's pipeline layout string (`--pipeline-model-parallel-layout`), read and written.

The grammar, as `PipelineParallelLayerLayout.parse_str_to_list` applies it: commas are dropped;
`(...)*N` repeats a group (no nesting), then `X*N` repeats one character; `|` ends a stage; every
remaining character is `E` (embedding), `t` (decoder layer), `m` (MTP layer) or `L` (loss).
Stage i runs on pipeline rank i mod pp (virtual stage i // pp). Errors name the position in the
string the user wrote, as a parser would.
"""
from __future__ import annotations

import re
from collections.abc import Sequence

from octopipe.errors import ConfigError

SYMBOLS = ("E", "t", "m", "L")
GROUP = re.compile(r"\(([^)]+)\)\*(\d+)")
SINGLE = re.compile(r"(.)\*(\d+)")


class LayoutError(ConfigError):
    """A layout string Megatron would refuse."""


def _first_bad(text: str) -> int:
    """The position in `text` of the first character that is neither a symbol, `|`, a comma nor
    part of a well-formed repeat (checked on the string as written)."""
    kept = [(j, c) for j, c in enumerate(text) if c != ","]
    flat = "".join(c for _, c in kept)
    covered = [False] * len(flat)
    for rx in (GROUP, SINGLE):
        for m in rx.finditer(flat):
            inner = m.span(1)
            for j in range(m.start(), m.end()):
                covered[j] = covered[j] or not (inner[0] <= j < inner[1]) or flat[j] in (*SYMBOLS, "|")
    for j, c in enumerate(flat):
        if c not in (*SYMBOLS, "|") and not covered[j]:
            return kept[j][0]
    return -1


def parse_layout(text: str, field: str = "megatron_layout") -> tuple[tuple[str, ...], ...]:
    """The stages of a layout string (possibly empty ones), or LayoutError with the position."""
    flat = text.replace(",", "")
    flat = GROUP.sub(lambda m: m.group(1) * int(m.group(2)), flat)
    flat = SINGLE.sub(lambda m: m.group(1) * int(m.group(2)), flat)
    bad = [c for c in flat if c not in (*SYMBOLS, "|")]
    if bad:
        pos = _first_bad(text)
        where = f"position {pos}: {text[pos]!r}" if pos >= 0 else f"{bad[0]!r} left after expanding the repeats"
        raise LayoutError(f"{field}={text!r}: {where} is not a layer symbol (E, t, m, L), '|', ',' or a "
                          "repeat '(...)*N' / 'x*N'")
    return tuple(tuple(stage) for stage in flat.split("|"))


def _runs(stage: Sequence[str]) -> str:
    """One stage's symbols with runs of three or more written `x*N`."""
    out, j = [], 0
    while j < len(stage):
        k = j
        while k < len(stage) and stage[k] == stage[j]:
            k += 1
        n = k - j
        out.append(f"{stage[j]}*{n}" if n >= 3 else stage[j] * n)
        j = k
    return "".join(out)


def format_layout(stages: Sequence[Sequence[str]]) -> str:
    """A compact string that parses back to `stages`: runs of one symbol as `t*N`, and runs of
    identical stages (neither first nor last) as `(stage|)*N`."""
    parts = [_runs(s) for s in stages]
    out, j = [], 0
    while j < len(parts):
        k = j
        while k < len(parts) and parts[k] == parts[j]:
            k += 1
        n = k - j
        if n >= 2 and parts[j] and k < len(parts):
            out.append(f"({parts[j]}|)*{n}")
        else:
            out.extend(p + "|" for p in parts[j:k])
        j = k
    text = "".join(out)
    return text[:-1] if text.endswith("|") else text


def validate_layout(stages: Sequence[Sequence[str]], pp: int, num_layers: int, mtp_layers: int = 0,
                    field: str = "megatron_layout") -> int:
    """Megatron's checks of a layout against pp and the layer counts; the virtual stages per rank."""
    if len(stages) % pp:
        raise LayoutError(f"{field}: {len(stages)} stages is not a multiple of pipeline_model_parallel_size={pp}")
    flat = [c for s in stages for c in s]
    if not flat or flat[0] != "E" or flat.count("E") != 1:
        raise LayoutError(f"{field}: the embedding E must come first, exactly once")
    if flat[-1] != "L" or flat.count("L") != 1:
        raise LayoutError(f"{field}: the loss L must come last, exactly once")
    if flat.count("t") != num_layers:
        raise LayoutError(f"{field}: {flat.count('t')} decoder layers t but the model has {num_layers}")
    if flat.count("m") != mtp_layers:
        raise LayoutError(f"{field}: {flat.count('m')} MTP layers m but the model has {mtp_layers}")
    if "m" in flat and "t" in flat[flat.index("m"):]:
        raise LayoutError(f"{field}: decoder layers must come before MTP layers")
    v = len(stages) // pp
    for i, s in enumerate(stages):
        if "m" in s and i // pp < v - 1:
            raise LayoutError(f"{field}: MTP layers go in a rank's last virtual stage")
        if "m" in s and s.count("m") != mtp_layers:
            raise LayoutError(f"{field}: all MTP layers must be in one stage")
    return v


def stage_to_rank(n_stages: int, pp: int) -> tuple[int, ...]:
    return tuple(i % pp for i in range(n_stages))
