"""Named schedule generators: every shape validates, constraints are enforced exactly, and the
validator catches random corruptions of random valid tables."""
from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from octopipe.errors import ScheduleError
from octopipe.schedule.action import Action, B, F, I, W
from octopipe.schedule.generators import forward_version, pipedream, weight_versions
from octopipe.schedule.library import SCHEDULES, build_schedule
from octopipe.schedule.table import ScheduleTable, loop_placement, v_placement
from octopipe.schedule.validate import data_predecessors, validate

DEVICES = (1, 2, 3, 4, 5, 8)
MICROBATCHES = (1, 2, 3, 4, 5, 7, 8, 9, 12, 16)
CHUNKS = (1, 2, 3, 4)


def allowed(name: str, p: int, m: int, v: int) -> bool:
    """The documented constraints of each schedule (SCHEDULES[name].constraints)."""
    return {
        "gpipe": v == 1, "1f1b": v == 1 and m >= p, "interleaved": True, "looped_bfs": True,
        "zbh1": True, "zbh2": v == 1, "zbv": v == 2, "dualpipev": v == 2 and m >= 2 * p,
        "chimera": v == 1 and p % 2 == 0 and m % 2 == 0, "hanayo": v % 2 == 0, "pipedream": v == 1,
        "pipedream_vsync": v == 1, "pipedream_2bw": v == 1 and m % p == 0,
    }[name]


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_every_shape_validates_or_is_refused_by_its_documented_constraint(name):
    built = 0
    for p in DEVICES:
        for m in MICROBATCHES:
            for v in CHUNKS:
                if not allowed(name, p, m, v):
                    with pytest.raises(ScheduleError):
                        build_schedule(name, p, m, v)
                    continue
                t = build_schedule(name, p, m, v)
                validate(t)
                assert t.n_devices == p and t.n_stages == p * v and t.n_microbatches == m
                assert t.name == name
                built += 1
    assert built > 0


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_natural_chunks_placement_and_split_backward_match_the_registry(name):
    info = SCHEDULES[name]
    p, m = 4, 8
    t = build_schedule(name, p, m)
    assert t.n_stages == p * info.default_chunks
    expected = {"loop": loop_placement(p, info.default_chunks),
                "v": v_placement(p, info.default_chunks),
                "bidirectional": tuple(range(p))}[info.placement]
    assert t.placement == expected
    assert t.splits_backward == info.split_backward
    if info.placement == "bidirectional":
        assert t.replicas == (tuple(reversed(range(p))),)
        assert sorted(t.mb_replica) == [0] * (m // 2) + [1] * (m // 2)


@pytest.mark.parametrize("name,args,needle", [
    ("zbv", (4, 8, 3), "exactly 2 chunks"),
    ("dualpipev", (4, 8, 1), "exactly 2 chunks"),
    ("dualpipev", (4, 7, 2), "n_microbatches >= 8"),
    ("1f1b", (4, 3, 1), "n_microbatches >= 4"),
    ("1f1b", (4, 8, 2), "chunks=1"),
    ("chimera", (3, 8, 1), "even number of devices"),
    ("chimera", (4, 7, 1), "even count"),
    ("hanayo", (4, 8, 3), "chunks must be even"),
    ("gpipe", (4, 8, 2), "looped_bfs"),
    ("zbh2", (4, 8, 2), "chunks=1"),
    ("interleaved", (0, 8, 2), "n_devices must be a positive integer"),
    ("zbh1", (4, 0, 2), "n_microbatches must be a positive integer"),
    ("looped_bfs", (4, 8, 0), "chunks"),
])
def test_impossible_requests_say_which_constraint_fails(name, args, needle):
    with pytest.raises(ScheduleError, match=needle):
        build_schedule(name, *args)


def test_unknown_name_lists_the_valid_ones():
    with pytest.raises(ScheduleError) as err:
        build_schedule("zb-v", 4, 8)
    for name in SCHEDULES:
        assert name in str(err.value)


def test_interleaved_accepts_microbatch_counts_torch_refuses():
    # torch needs m divisible by max(1, m // p); 9 on 4 devices is not, and still validates.
    for m in (9, 11, 13, 14):
        validate(build_schedule("interleaved", 4, m, 3))
        validate(build_schedule("zbh1", 4, m, 2))


def test_pipedream_weight_versions_follow_the_stash_rule():
    p, m = 4, 12
    t = pipedream(p, m)
    versions = weight_versions(t)
    for s in range(p):
        for k in range(m):
            assert versions[Action(s, F, k)] == forward_version(p, s, k)
            assert versions[Action(s, B, k)] == versions[Action(s, F, k)]
    # Steady-state staleness p-1-s (Randomized PipeDream's per-stage delay).
    assert [m - 1 - versions[Action(s, F, m - 1)] for s in range(p)] == [3, 2, 1, 0]


# ------------------------------------------------------------------ random tables (hypothesis)

@st.composite
def random_tables(draw) -> ScheduleTable:
    """A random valid table: random placement, split set and a random topological order."""
    p = draw(st.integers(1, 4))
    n_stages = draw(st.integers(1, 6))
    placement = [draw(st.integers(0, p - 1)) for _ in range(n_stages)]
    m = draw(st.integers(1, 4))
    split = {(s, k) for s in range(n_stages) for k in range(m) if draw(st.booleans())}
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    todo = []
    for s in range(n_stages):
        for k in range(m):
            todo += [Action(s, F, k)] + ([Action(s, I, k), Action(s, W, k)] if (s, k) in split
                                         else [Action(s, B, k)])
    done: set[Action] = set()
    rows: list[list[Action]] = [[] for _ in range(p)]
    while todo:
        ready = [a for a in todo if all(q in done for q in data_predecessors(a, n_stages, split))]
        a = rng.choice(ready)
        todo.remove(a)
        done.add(a)
        rows[placement[a.stage]].append(a)
    return ScheduleTable.from_rows(rows, placement, m)


@settings(max_examples=60, deadline=None)
@given(random_tables())
def test_random_valid_tables_validate(t):
    validate(t)


@settings(max_examples=80, deadline=None)
@given(random_tables(), st.sampled_from(["drop", "duplicate", "move", "swap"]), st.randoms())
def test_random_corruptions_are_caught(t, corruption, rng):
    rows = [list(r) for r in t.rows]
    cells = [(d, c) for d, r in enumerate(rows) for c in range(len(r))]
    d, c = rng.choice(cells)
    a = rows[d][c]
    if corruption == "drop":
        del rows[d][c]
    elif corruption == "duplicate":
        rows[d].insert(rng.randrange(len(rows[d]) + 1), a)
    elif corruption == "move":
        if t.n_devices == 1:
            rows[d].insert(rng.randrange(len(rows[d]) + 1), a)  # nowhere to move: duplicate
        else:
            del rows[d][c]
            other = rng.choice([x for x in range(t.n_devices) if x != d])
            rows[other].insert(rng.randrange(len(rows[other]) + 1), a)
    else:
        split = {(x.stage, x.microbatch) for r in rows for x in r if x.kind is I}
        pairs = [(dd, i, j) for dd, r in enumerate(rows) for j, y in enumerate(r)
                 for i, x in enumerate(r[:j]) if x in data_predecessors(y, t.n_stages, split)]
        dd, i, j = rng.choice(pairs)  # F and its own backward always share a device
        rows[dd][i], rows[dd][j] = rows[dd][j], rows[dd][i]
    with pytest.raises(ScheduleError):
        validate(t.with_rows(rows))


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_corrupting_a_named_table_is_caught(name):
    t = build_schedule(name, 4, 8).compact()
    rng = random.Random(name)
    for _ in range(5):
        rows = [list(r) for r in t.rows]
        d = rng.randrange(t.n_devices)
        c = rng.randrange(len(rows[d]))
        rows[d].insert(rng.randrange(len(rows[d])), rows[d][c])
        with pytest.raises(ScheduleError, match="appears twice"):
            validate(t.with_rows(rows))
        rows = [list(r) for r in t.rows]
        del rows[d][c]
        with pytest.raises(ScheduleError, match="missing|no matching"):
            validate(t.with_rows(rows))


@pytest.mark.parametrize("p,m", [(2, 4), (3, 5), (4, 8), (4, 16), (8, 16)])
def test_zbh2_is_the_papers_parallelogram_at_unit_costs(p, m):
    # With m >= 2p-1, device d is busy for 3m consecutive unit slots from slot d: no bubble inside.
    t = build_schedule("zbh2", p, m)
    assert max(len(r) for r in t.rows) == 3 * m + p - 1
    for d, row in enumerate(t.rows):
        busy = [c for c, a in enumerate(row) if a is not None]
        assert busy == list(range(d, d + 3 * m))


def test_chimera_sends_half_the_microbatches_up_the_reversed_pipeline():
    p, m = 4, 8
    t = build_schedule("chimera", p, m)
    for k in range(m):
        for s in range(p):
            assert t.device_of(s, k) == (p - 1 - s if k % 2 else s)
    # Every device holds one stage of each direction and runs both.
    for d in range(p):
        assert {a.stage for a in t.actions(d)} == {d, p - 1 - d}


def test_looped_bfs_also_runs_on_a_v_placement_and_others_refuse_a_foreign_one():
    for p in (2, 3, 4):
        for m in (1, 3, 8):
            t = build_schedule("looped_bfs", p, m, 4, placement="v")
            assert t.placement == v_placement(p, 4)
            validate(t)
    assert build_schedule("zbv", 4, 8, placement="v") == build_schedule("zbv", 4, 8)
    assert build_schedule("1f1b", 4, 8, placement="v") == build_schedule("1f1b", 4, 8)
    with pytest.raises(ScheduleError, match="interleaved uses placement 'loop' only"):
        build_schedule("interleaved", 4, 8, placement="v")
    with pytest.raises(ScheduleError, match="supports placement 'loop' or 'v'"):
        build_schedule("looped_bfs", 4, 8, placement="zigzag")
