"""Layer-pattern notation: expansion, the published Nemotron-H layouts, and bad input."""
import pytest
from hypothesis import given
from hypothesis import strategies as st

from octopipe.errors import ConfigError
from octopipe.model.pattern import LETTERS, format_pattern, parse_pattern

NEMOTRON_H_8B = "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"
NANO_9B = "M-M-M-MM-M-M-M*-M-M-M*-M-M-M-M*-M-M-M-M*-M-MM-M-M-M-M-M-"


def _counts(letters):
    return tuple(letters.count(c) for c in "M*-")


def test_nemotron_h_8b_layout_matches_published_counts_and_attention_indices():
    letters = parse_pattern(NEMOTRON_H_8B)
    assert len(letters) == 52 and _counts(letters) == (24, 4, 24)
    assert [i for i, c in enumerate(letters) if c == "*"] == [7, 18, 29, 40]


def test_repeat_groups_reproduce_nemotron_h_56b():
    letters = parse_pattern("M-M-M-M*-(M-M-M-M-M*-)x9M-M-M-M-M-")
    assert len(letters) == 118 and _counts(letters) == (54, 10, 54)
    assert [i for i, c in enumerate(letters) if c == "*"] == list(range(7, 107, 11))


def test_irregular_nano_9b_pattern():
    letters = parse_pattern(NANO_9B)
    assert len(letters) == 56 and _counts(letters) == (27, 4, 25)
    assert [i for i, c in enumerate(letters) if c == "*"] == [14, 21, 30, 39]
    pairs = [i for i in range(55) if letters[i] == letters[i + 1] == "M"]
    assert pairs == [6, 43]


def test_nested_groups_spaces_and_bars():
    assert parse_pattern("((LE)x2 *E)x2") == tuple("LELE*ELELE*E")
    assert parse_pattern("M- | *-") == tuple("M-*-")
    assert parse_pattern("(*-)x32") == tuple("*-" * 32)


@given(st.text(alphabet="".join(LETTERS), min_size=1, max_size=40))
def test_plain_strings_round_trip(s):
    assert format_pattern(parse_pattern(s)) == s


@pytest.mark.parametrize("bad, words", [
    ("M-Q-", ["'Q'", "'M'=Mamba-2", "'E'=MoE"]),
    ("(M-", ["never closed"]),
    ("M-)", ["unmatched ')'"]),
    ("(M-)", ["xN"]),
    ("(M-)x0", ["positive integer"]),
    ("  ", ["no layers"]),
])
def test_bad_patterns_name_the_problem(bad, words):
    with pytest.raises(ConfigError) as e:
        parse_pattern(bad, "model.pattern")
    msg = str(e.value)
    assert msg.startswith("model.pattern") and "\n" not in msg
    for w in words:
        assert w in msg
