"""Megatron-LM's pipeline layout string: parse, format, validate; compared with megatron-core where installed."""
from __future__ import annotations

import random
import warnings

import pytest

from octopipe.errors import ConfigError
from octopipe.interop.megatron_layout import (
    LayoutError,
    format_layout,
    parse_layout,
    stage_to_rank,
    validate_layout,
)


def _megatron():
    """megatron-core's layout module (an optional dependency), its import warnings silenced."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return pytest.importorskip("megatron.core.transformer.pipeline_parallel_layer_layout")


_SYM = {"embedding": "E", "loss": "L", "decoder": "t", "mtp": "m"}


def _mc_parse(mc, s: str):
    """megatron's stages as lists of symbols, or None where it rejects the string.

    megatron returns LayerType members, not strings; they are mapped back to E/L/t/m here."""
    try:
        stages = mc.PipelineParallelLayerLayout.parse_str_to_list(s)
    except Exception:
        return None
    return [[_SYM[x.name] for x in st] for st in stages]


def _ours(s: str):
    try:
        return [list(st) for st in parse_layout(s)]
    except LayoutError:
        return None


def _random_stage(rng: random.Random) -> list[str]:
    return [rng.choice("tttm") for _ in range(rng.randint(0, 5))]


def _random_text(rng: random.Random, stages: list[list[str]]) -> str:
    """A string for `stages` written with random repeats, groups and commas."""
    parts = []
    for st in stages:
        out = ""
        for sym in st:
            out += rng.choice([sym, sym, f"{sym}*1", f",{sym}"])
        parts.append(out)
    text = "|".join(parts)
    if rng.random() < 0.5:
        body = "".join(rng.choice("tm|,") for _ in range(rng.randint(1, 4)))
        cut = rng.randint(0, len(text))
        text = text[:cut] + f"({body})*{rng.randint(0, 3)}" + text[cut:]
    if rng.random() < 0.5:
        cut = rng.randint(0, len(text))
        text = text[:cut] + f"t*{rng.randint(0, 12)}" + text[cut:]
    return text


def _mutate(rng: random.Random, text: str) -> str:
    for _ in range(rng.randint(1, 3)):
        cut = rng.randint(0, len(text))
        text = text[:cut] + rng.choice("EtmL|()*,0123 x") + text[cut:]
    return text


def test_megatron_help_example():
    assert parse_layout("E|(t|)*3,m|m||L") == (("E",), ("t",), ("t",), ("t",), ("m",), ("m",), (), ("L",))
    assert parse_layout("Ettt|(tt|)*29,m|L") == (("E", "t", "t", "t"),) + (("t", "t"),) * 29 + (("m",), ("L",))


@pytest.mark.parametrize("text, stages", [
    ("", ((),)),
    ("E||tL", (("E",), (), ("t", "L"))),
    ("t*0", ((),)),
    ("t*,3", (("t", "t", "t"),)),
    ("(t|)*0,E", (("E",),)),
    ("E,t*2,|,L", (("E", "t", "t"), ("L",))),
])
def test_parse_edge_cases(text, stages):
    assert parse_layout(text) == stages


@pytest.mark.parametrize("text, pos, words", [
    ("E|t*x|L", 4, "'*' must be followed by a repeat count, got 'x'"),
    ("E|t*", 4, "got the end of the string"),
    ("E|t t|L", 3, "whitespace"),
    ("E|tq|L", 3, "unknown layer symbol 'q'"),
    ("E|(tt|L", 2, "never closed"),
    ("E|tt)|L", 4, "no matching '('"),
    ("((t)*2)*3", 1, "nested"),
    ("E|()*2", 2, "empty group"),
    ("E|(t)x", 5, "must be followed by '*'"),
    ("t*2*3", 3, "'*' must follow"),
    ("Et3", 2, "digit '3'"),
    ("E,,|t*x", 6, "repeat count"),  # positions count the commas of the original string
])
def test_parse_errors_name_the_position(text, pos, words):
    with pytest.raises(LayoutError) as info:
        parse_layout(text)
    msg = str(info.value)
    assert isinstance(info.value, ConfigError)
    assert "\n" not in msg
    assert msg.startswith(f"megatron_layout: pipeline layout {text!r}: position {pos}: ")
    assert words in msg


def test_error_message_example():
    with pytest.raises(LayoutError, match=r"^megatron_layout: pipeline layout 'E\|t\*x\|L': position 4: '\*' must be"):
        parse_layout("E|t*x|L")


def test_huge_repeat_is_refused():
    with pytest.raises(LayoutError, match="more than"):
        parse_layout("E|t*99999999999|L")


def test_format_is_compact():
    assert format_layout([["E", "t", "t", "t", "t"], ["t", "t"], ["t"], ["L"]]) == "Et*4|tt|t|L"
    stages = [["E", "t", "t"]] + [["t", "t", "t"]] * 6 + [["t", "L"]]
    assert format_layout(stages) == "Ett|(t*3|)*6,tL"
    assert format_layout([["E"], [], [], ["L"]]) == "E|||L"
    with pytest.raises(LayoutError):
        format_layout([["E", "x"]])


def test_format_round_trips():
    rng = random.Random(1)
    for _ in range(300):
        stages = [_random_stage(rng) for _ in range(rng.randint(1, 10))]
        if rng.random() < 0.5:
            stages = stages[:1] * rng.randint(1, 6) + stages
        text = format_layout(stages)
        assert [list(s) for s in parse_layout(text)] == stages, text


def test_stage_to_rank():
    assert stage_to_rank(8, 4) == (0, 1, 2, 3, 0, 1, 2, 3)
    assert stage_to_rank(3, 1) == (0, 0, 0)
    with pytest.raises(LayoutError):
        stage_to_rank(4, 0)


def test_validate():
    assert validate_layout(parse_layout("Et*4|(t*4|)*6,t*4,L"), 4, 32) == 2
    assert validate_layout(parse_layout("Ett|tt|tm|L"), 2, 5, 1) == 2
    cases = [
        ("Ett|tL", 3, 4, 0, "not a multiple of pp=3"),
        ("tE|tL", 2, 2, 0, "first layer must be the embedding"),
        ("Et|Lt", 2, 2, 0, "last layer must be the loss"),
        ("Et|tL", 2, 3, 0, "num_layers=3"),
        ("Et|tmL", 2, 2, 0, "mtp_layers=0"),
        ("Em|tL", 2, 1, 1, "before the MTP"),
        ("Et|t|m|L", 1, 2, 1, "last virtual stage"),
        ("Et|t|m|mL", 2, 2, 2, "all in one stage"),
        ("EEt|L", 2, 1, 0, "exactly once"),
    ]
    for text, pp, n, mtp, words in cases:
        with pytest.raises(LayoutError, match=words) as info:
            validate_layout(parse_layout(text), pp, n, mtp)
        assert "\n" not in str(info.value)


def test_parse_matches_megatron():
    mc = _megatron()
    rng = random.Random(0)
    fixed = ["", "E||tL", "((t)*2)*3", "((t)*0", "t)*0", "t**0", "t(*3)*1", "()*2", "(t*)*2", "t*2*3",
             "(t|)*0", "E|t t|L", " *0t", "t*02", "(|)*2", "((t|)*2", "E|(t|)*3,m|m||L", "|*0tL"]
    texts = fixed[:]
    while len(texts) < 500:
        stages = [_random_stage(rng) for _ in range(rng.randint(1, 6))]
        stages[0].insert(0, "E")
        stages[-1].append("L")
        text = _random_text(rng, stages)
        texts.append(_mutate(rng, text) if rng.random() < 0.6 else text)
    accepted = 0
    for s in texts:
        theirs, ours = _mc_parse(mc, s), _ours(s)
        assert ours == theirs, s
        accepted += ours is not None
    assert 100 < accepted < 450  # both kinds of input are well represented


def test_validate_matches_megatron():
    # PipelineParallelLayerLayout(layout, pp) and validate_layer_layout(num_layers, mtp_num_layers) run
    # in-process without torch.distributed; both raise AssertionError (or IndexError on an empty layout).
    mc = _megatron()
    rng = random.Random(0)
    outcomes = set()
    for _ in range(400):
        stages = [[rng.choice("ttttmEL") for _ in range(rng.randint(0, 4))] for _ in range(rng.randint(1, 8))]
        if rng.random() < 0.7:
            stages[0].insert(0, "E")
            stages[-1].append("L")
        if rng.random() < 0.5:  # tidy: embedding and loss once, MTP after the decoder layers
            flat = [s for st in stages for s in st if s not in "EL"]
            stages = [[s for s in st if s not in "EL"] for st in stages]
            stages[0].insert(0, "E")
            stages[-1].append("L")
            if "m" in flat and rng.random() < 0.7:
                stages = [[s for s in st if s != "m"] for st in stages]
                stages[rng.randrange(len(stages))][-1:-1] = ["m"] * flat.count("m")
        text = format_layout(stages)
        pp = rng.choice([1, 1, 2, 2, 3, 4])
        n = sum(st.count("t") for st in stages) + rng.choice([0, 0, 0, 1])
        mtp = sum(st.count("m") for st in stages) + rng.choice([0, 0, 0, -1])
        try:
            mc.PipelineParallelLayerLayout(text, pp).validate_layer_layout(num_layers=n, mtp_num_layers=mtp)
            theirs = True
        except (AssertionError, IndexError):
            theirs = False
        try:
            vpp = validate_layout(parse_layout(text), pp, n, mtp)
            ours = True
            assert vpp == len(stages) // pp
        except LayoutError:
            ours = False
        assert ours == theirs, (text, pp, n, mtp)
        outcomes.add(ours)
    assert outcomes == {True, False}
