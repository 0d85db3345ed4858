"""Candidate.with_ is `dataclasses.replace`: the same fields, hash and frozenness, whichever
field changes (its fast path skips `__init__` for the fields that need no conversion)."""
from dataclasses import FrozenInstanceError, fields, replace

import pytest

from octopipe.plan import Partition
from octopipe.tune.candidate import Candidate


@pytest.mark.parametrize("kw", [{"inflight": 2.0}, {"kind_rank": (0, 1, 2)}, {"origin": "moved", "w_pressure": 0.5},
                                {"split_backward": False, "f_tiebreak": 1, "b_tiebreak": 1},
                                {"placement": [1, 0]}, {"partition": (3, 1)}, {"warmup": [1, 0]}])
def test_with_is_replace(kw):
    c = Candidate(Partition((2, 2)), (0, 1), origin="start")
    hash(c)                                                   # a hash kept by `c` is not the copy's
    got, want = c.with_(**kw), replace(c, **kw)
    assert type(got) is Candidate and got == want and hash(got) == hash(want)
    assert [getattr(got, f.name) for f in fields(c)] == [getattr(want, f.name) for f in fields(c)]
    assert c.inflight == 1.0 and c.origin == "start"          # the original is unchanged
    with pytest.raises(FrozenInstanceError):
        got.inflight = 3.0


def test_with_refuses_an_unknown_field():
    with pytest.raises(TypeError):
        Candidate((2, 2), (0, 1)).with_(inflght=2.0)
