"""Megatron-LM's `--pipeline-model-parallel-layout` string: parse, format and validate it.

The grammar is megatron-core's own (`PipelineParallelLayerLayout.parse_str_to_list`): commas are
dropped, every `(...)*N` group is unrolled (one left-to-right pass, no nesting), then every `X*N`
(any single character X), then the string is split on '|' into stages of the symbols E (embedding),
L (loss), t (decoder layer) and m (MTP layer). Stage i runs on pp rank i % pp as virtual stage i // pp.
megatron-core itself is not imported here; the tests compare against it when it is installed.
"""
from __future__ import annotations

import bisect
import re
from collections.abc import Sequence

from octopipe.errors import ConfigError

SYMBOLS = ("E", "t", "m", "L")
_GROUP = re.compile(r"\(([^)]+)\)\*(\d+)")  # as megatron: the body may hold '(' but never ')'
_REPEAT = re.compile(r"(.)\*(\d+)")  # as megatron: '.' is any character but a newline
_MAX_SYMBOLS = 1_000_000  # no real model has this many layers; guards against 't*99999999999'


class LayoutError(ConfigError):
    """A Megatron pipeline layout string or its stages are invalid; the message is one line."""


Stages = tuple[tuple[str, ...], ...]


def _unroll(pattern: re.Pattern[str], s: str, pos: list[int], text: str, field: str) -> tuple[str, list[int]]:
    """One re.sub-style pass of `pattern` over `s`, carrying each character's position in `text`."""
    out: list[str] = []
    out_pos: list[int] = []
    last = 0
    for m in pattern.finditer(s):
        out.append(s[last:m.start()])
        out_pos += pos[last:m.start()]
        digits = m.group(2)
        body, body_pos = m.group(1), pos[m.start(1):m.end(1)]
        n = int(digits) if len(digits) <= 7 else _MAX_SYMBOLS + 1
        if len(body) * n + len(out_pos) > _MAX_SYMBOLS:
            raise LayoutError(f"{field}: pipeline layout {text!r}: position {pos[m.start(2)]}: repeat count "
                              f"{digits} unrolls to more than {_MAX_SYMBOLS} symbols; use a smaller count")
        out.append(body * n)
        out_pos += body_pos * n
        last = m.end()
    out.append(s[last:])
    out_pos += pos[last:]
    return "".join(out), out_pos


def _explain(s: str, pos: list[int], j: int, n: int) -> tuple[int, str]:
    """Position (in the original string, of length n) and reason for s[j], a character left over after
    unrolling; `s` is the original without commas and `pos` maps its indices back."""
    def at(k: int) -> tuple[int, str]:
        return (pos[k], repr(s[k])) if k < len(s) else (n, "the end of the string")

    c = s[j]
    if c == "*":
        if j + 1 >= len(s) or not s[j + 1].isdecimal():
            p, got = at(j + 1)
            return p, f"'*' must be followed by a repeat count, got {got}"
        return pos[j], "'*' must follow one symbol or a '(...)' group, not a repeat count"
    if c == "(":
        close = s.find(")", j)
        if close < 0:
            return pos[j], "'(' is never closed; write '(...)*N'"
        inner = s.find("(", j + 1, close)
        if inner >= 0:
            return pos[inner], "nested parentheses are not supported; unroll the inner group"
        if close == j + 1:
            return pos[j], "empty group '()'; put at least one symbol or '|' inside"
        if close + 1 >= len(s) or s[close + 1] != "*":
            p, got = at(close + 1)
            return p, f"a '(...)' group must be followed by '*' and a repeat count, got {got}"
        if close + 2 >= len(s) or not s[close + 2].isdecimal():
            p, got = at(close + 2)
            return p, f"'*' must be followed by a repeat count, got {got}"
        return pos[j], "nested parentheses are not supported; unroll the inner group"
    if c == ")":
        return pos[j], "')' has no matching '('"
    if c.isdecimal():
        return pos[j], f"digit {c!r} outside a repeat count; write 'X*N' or '(...)*N'"
    if c.isspace():
        return pos[j], "whitespace is not allowed; remove it (use ',' to separate layers)"
    return pos[j], f"unknown layer symbol {c!r}; use E (embedding), t (decoder), m (MTP), L (loss), '|' between stages"


def parse_layout(text: str, field: str = "megatron_layout") -> Stages:
    """The stages of a layout string, each a tuple of 'E', 't', 'm', 'L' (stages may be empty).

    Accepts exactly the strings megatron-core's parser accepts and gives the same stages; anything
    else raises LayoutError naming a 0-based position in `text`.
    """
    if not isinstance(text, str):
        raise LayoutError(f"{field}: a pipeline layout must be a string, got {type(text).__name__}")
    pos0 = [i for i, c in enumerate(text) if c != ","]
    s0 = text.replace(",", "")
    s, pos = _unroll(_GROUP, s0, pos0, text, field)
    s, pos = _unroll(_REPEAT, s, pos, text, field)
    for j, c in enumerate(s):
        if c not in SYMBOLS and c != "|":
            p, why = _explain(s0, pos0, bisect.bisect_left(pos0, pos[j]), len(text))
            raise LayoutError(f"{field}: pipeline layout {text!r}: position {p}: {why}")
    return tuple(tuple(stage) for stage in s.split("|"))


def _format_stage(stage: Sequence[str]) -> str:
    """One stage with runs of 3 or more of one symbol written as X*N."""
    out: list[str] = []
    i = 0
    while i < len(stage):
        k = i
        while k < len(stage) and stage[k] == stage[i]:
            k += 1
        n = k - i
        out.append(f"{stage[i]}*{n}" if n >= 3 else stage[i] * n)
        i = k
    return "".join(out)


def format_layout(stages: Sequence[Sequence[str]]) -> str:
    """A compact layout string that parses (here and in megatron-core) back to `stages`.

    Runs of one symbol become `t*N`; runs of identical non-last stages become `(stage|)*N` where
    that is shorter. Stage separators around groups are written inside the group, never doubled.
    """
    if not stages:
        raise LayoutError("megatron_layout: a pipeline layout needs at least one stage")
    for stage in stages:
        for sym in stage:
            if sym not in SYMBOLS:
                raise LayoutError(f"megatron_layout: unknown layer symbol {sym!r}; use one of {', '.join(SYMBOLS)}")
    texts = [_format_stage(st) for st in stages]
    parts: list[str] = []
    i, last = 0, len(texts) - 1
    while i < last:  # each part but the last ends with '|'; the last stage is never in a group
        k = i
        while k < last and texts[k] == texts[i] and stages[k]:
            k += 1
        n = k - i
        plain = (texts[i] + "|") * n
        group = f"({texts[i]}|)*{n}"
        if n >= 2 and len(group) < len(plain):
            parts.append(group)
            i = k
        else:
            parts.append(texts[i] + "|")
            i += 1
    parts.append(texts[last])
    return ",".join(p for p in parts if p).replace("|,", "|")


def stage_to_rank(n_stages: int, pp: int) -> tuple[int, ...]:
    """The pp rank of each stage: stage i runs on rank i % pp (as virtual stage i // pp)."""
    if pp < 1:
        raise LayoutError(f"megatron_layout: pipeline parallel size must be at least 1, got {pp}")
    return tuple(i % pp for i in range(n_stages))


def validate_layout(stages: Sequence[Sequence[str]], pp: int, num_layers: int, mtp_layers: int = 0,
                    field: str = "megatron_layout") -> int:
    """Megatron-core's checks (`PipelineParallelLayerLayout.__init__` and `validate_layer_layout`);
    returns the number of virtual stages per rank (len(stages) // pp)."""
    def fail(why: str) -> LayoutError:
        try:
            shown = repr(format_layout(stages))
        except LayoutError:
            shown = repr([list(st) for st in stages])
        return LayoutError(f"{field}: pipeline layout {shown}: {why}")

    if pp < 1:
        raise fail(f"pipeline parallel size must be at least 1, got {pp}")
    if not stages or len(stages) % pp:
        raise fail(f"{len(stages)} stages is not a multiple of pp={pp}; give pp×vpp stages separated by '|'")
    vpp = len(stages) // pp
    flat = [sym for stage in stages for sym in stage]
    bad = [sym for sym in flat if sym not in SYMBOLS]
    if bad:
        raise fail(f"unknown layer symbol {bad[0]!r}; use one of {', '.join(SYMBOLS)}")
    if not flat or flat[0] != "E":
        raise fail("the first layer must be the embedding; start the first non-empty stage with 'E'")
    if flat[-1] != "L":
        raise fail("the last layer must be the loss; end the last non-empty stage with 'L'")
    if flat.count("E") != 1:
        raise fail(f"embedding 'E' appears {flat.count('E')} times; give it exactly once, first")
    if flat.count("L") != 1:
        raise fail(f"loss 'L' appears {flat.count('L')} times; give it exactly once, last")
    if flat.count("t") != num_layers:
        raise fail(f"{flat.count('t')} decoder layers 't' but the model has num_layers={num_layers}")
    if flat.count("m") != mtp_layers:
        raise fail(f"{flat.count('m')} MTP layers 'm' but the model has mtp_layers={mtp_layers}")
    if "m" in flat and "t" in flat[flat.index("m"):]:
        raise fail("decoder layers 't' must all come before the MTP layers 'm'")
    for i, stage in enumerate(stages):
        if "m" not in stage:
            continue
        if i // pp < vpp - 1:
            raise fail(f"stage {i} (pp rank {i % pp}, virtual stage {i // pp}) holds MTP layers; MTP must be "
                       f"in the last virtual stage ({vpp - 1}) of its rank")
        if stage.count("m") != mtp_layers:
            raise fail(f"stage {i} holds {stage.count('m')} of the {mtp_layers} MTP layers; put them all in one stage")
    return vpp
