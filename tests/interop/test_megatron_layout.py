"""Megatron's layout grammar: our reader and writer against Megatron's own parser and checks."""
from __future__ import annotations

import random
import warnings

import pytest

from octopipe.interop.megatron_layout import LayoutError, format_layout, parse_layout, validate_layout


def _megatron():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return pytest.importorskip("megatron.core.transformer.pipeline_parallel_layer_layout")


def test_help_text_example():
    assert parse_layout("E|(t|)*3,m|m||L") == (("E",), ("t",), ("t",), ("t",), ("m",), ("m",), (), ("L",))


def test_error_names_the_position():
    with pytest.raises(LayoutError, match=r"position 3: 'x'"):
        parse_layout("Et|x|L")
    with pytest.raises(LayoutError, match=r"position 4: ' '"):
        parse_layout("E,t| t|L")


def test_format_round_trips_and_is_compact():
    stages = [["E", "t", "t"], ["t"] * 4, ["t"] * 4, ["t"] * 4, ["t", "t", "L"]]
    text = format_layout(stages)
    assert parse_layout(text) == tuple(tuple(s) for s in stages)
    assert len(text) < len("|".join("".join(s) for s in stages))


def _random_layout(rng: random.Random) -> str:
    stages = [["E"] + ["t"] * rng.randint(0, 3)]
    stages += [["t"] * rng.randint(0, 5) for _ in range(rng.randint(0, 6))]
    stages.append(["t"] * rng.randint(0, 3) + ["m"] * rng.randint(0, 1) + ["L"])
    if rng.random() < 0.5:
        return format_layout(stages)
    return ",".join("".join(s) for s in stages).replace(",", "|", len(stages) - 1)


def _mutate(rng: random.Random, text: str) -> str:
    for _ in range(rng.randint(1, 3)):
        j = rng.randint(0, len(text))
        text = text[:j] + rng.choice("EtmL|()*,0123 x") + text[j:]
    return text


def test_differential_against_megatron_parser():
    mod = _megatron()
    rng = random.Random(0)
    agree = 0
    for k in range(600):
        text = _random_layout(rng)
        if k % 2:
            text = _mutate(rng, text)
        try:
            theirs = mod.PipelineParallelLayerLayout.parse_str_to_list(text)
        except (AssertionError, ValueError, re_error()):
            theirs = None
        try:
            ours = parse_layout(text)
        except LayoutError:
            ours = None
        if theirs is None:
            assert ours is None, text
        else:
            assert ours is not None, text
            assert [[str(c) for c in s] for s in ours] == [[_sym(x) for x in s] for s in theirs], text
            agree += 1
    assert agree > 250


def re_error():
    import re
    return re.error


def _sym(layer_type) -> str:
    return {"embedding": "E", "decoder": "t", "mtp": "m", "loss": "L"}[layer_type.name]


def test_validation_agrees_with_megatron():
    mod = _megatron()
    rng = random.Random(1)
    for _ in range(300):
        text = _random_layout(rng)
        stages = parse_layout(text)
        pp = rng.choice([1, 2, 3, 4])
        n_t = sum(s.count("t") for s in stages) + rng.choice([0, 0, 1])
        n_m = sum(s.count("m") for s in stages)
        try:
            lay = mod.PipelineParallelLayerLayout(text, pp)
            lay.validate_layer_layout(num_layers=n_t, mtp_num_layers=n_m)
            theirs = lay.virtual_pipeline_model_parallel_size
        except AssertionError:
            theirs = None
        try:
            ours = validate_layout(stages, pp, n_t, n_m)
        except LayoutError:
            ours = None
        assert ours == theirs, (text, pp, n_t, n_m)
