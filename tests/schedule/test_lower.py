"""Lowering: SEND/RECV pairing, order consistency, V-turns, replicas, and torch's own lowering."""
from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops
from torch.distributed.pipelining.schedules import _Action as TorchAction
from torch.distributed.pipelining.schedules import _add_send_recv

from octopipe.errors import DeadlockError, ScheduleError
from octopipe.schedule.action import RECV_B, RECV_F, SEND_B, SEND_F, Action, B, F, I, W
from octopipe.schedule.library import SCHEDULES, build_schedule
from octopipe.schedule.lower import lower, peer_of, validate_lowered
from octopipe.schedule.table import ScheduleTable, v_placement
from octopipe.schedule.validate import data_predecessors


def one_f_one_b(p: int, m: int) -> ScheduleTable:
    rows = []
    for d in range(p):
        warm = min(p - 1 - d, m)
        row = [Action(d, F, i) for i in range(warm)]
        f = warm
        for b in range(m):
            if f < m:
                row.append(Action(d, F, f))
                f += 1
            row.append(Action(d, B, b))
        rows.append(row)
    return ScheduleTable.from_rows(rows, range(p), m, "1f1b")


def v_gpipe(p: int, m: int) -> ScheduleTable:
    """A V placement (2 stages per device) run GPipe-style: all forwards, then all backwards."""
    place = v_placement(p, 2)
    n = len(place)
    rows: list[list[Action]] = [[] for _ in range(p)]
    for s in range(n):
        rows[place[s]] += [Action(s, F, i) for i in range(m)]
    for s in reversed(range(n)):
        rows[place[s]] += [Action(s, B, i) for i in range(m)]
    return ScheduleTable.from_rows(rows, place, m, "v-gpipe")


def chimera_2() -> ScheduleTable:
    """Two opposite 2-stage pipelines on 2 devices: mb 0 goes 0→1, mb 1 goes 1→0."""
    rows = [["0F0", "1F1", "1B1", "0B0"], ["0F1", "1F0", "1B0", "0B1"]]
    t = ScheduleTable.from_strings(rows, (0, 1), 2, "chimera-2")
    return ScheduleTable(t.rows, (0, 1), 2, "chimera-2", replicas=((1, 0),), mb_replica=(0, 1))


def torch_table(name: str, p: int, m: int, chunks: int | None) -> ScheduleTable:
    """torch's own compute table, OVERLAP_F_B expanded and REDUCE_GRAD dropped."""
    rows = []
    for r in get_schedule_ops(name, p, m, chunks):
        row = []
        for a in r:
            if a is None:
                continue
            for x in (a.sub_actions or (a,)):
                if x.microbatch_index is not None:
                    row.append(Action.parse(str(x)))
        rows.append(row)
    stage_dev = {a.stage: d for d, r in enumerate(rows) for a in r}
    return ScheduleTable.from_rows(rows, [stage_dev[s] for s in range(len(stage_dev))], m, name)


def test_one_f_one_b_lowered_row_reads_like_torch():
    low = lower(one_f_one_b(2, 2))
    assert [str(a) for a in low.rows[0]] == ["0F0", "0SEND_F0", "0F1", "0SEND_F1", "0RECV_B0",
                                             "0B0", "0RECV_B1", "0B1"]
    assert [str(a) for a in low.rows[1]] == ["1RECV_F0", "1F0", "1RECV_F1", "1B0", "1SEND_B0",
                                             "1F1", "1B1", "1SEND_B1"]
    validate_lowered(low)


@pytest.mark.parametrize("p,m", [(2, 1), (3, 5), (4, 8), (5, 3)])
def test_every_transfer_pairs_and_matches_in_order(p, m):
    low = lower(one_f_one_b(p, m))
    validate_lowered(low)
    assert low.compute_only() == one_f_one_b(p, m).compact()
    sends = {(d, peer_of(low, a)): [] for d in range(p) for a in low.rows[d] if a.kind in (SEND_F, SEND_B)}
    for d in range(p):
        for a in low.rows[d]:
            if a.kind in (SEND_F, SEND_B):
                sends[(d, peer_of(low, a))].append((a.kind, a.microbatch))
    for (src, dst), seq in sends.items():
        got = [(SEND_F if a.kind is RECV_F else SEND_B, a.microbatch)
               for a in low.rows[dst] if a.kind in (RECV_F, RECV_B) and peer_of(low, a) == src]
        assert got == seq
    n_transfers = sum(len(v) for v in sends.values())
    assert n_transfers == 2 * (p - 1) * m


def test_v_turn_exchanges_nothing():
    t = v_gpipe(3, 4)
    low = lower(t)
    validate_lowered(low)
    comm = {str(a) for _, a in low if a.kind.is_comm}
    turn = t.n_stages // 2 - 1
    assert not any(c.startswith(f"{turn}SEND_F") or c.startswith(f"{turn + 1}RECV_F")
                   or c.startswith(f"{turn + 1}SEND_B") or c.startswith(f"{turn}RECV_B") for c in comm)
    # (n_stages - 1) boundaries per micro-batch and direction, minus the turn
    assert len(comm) == 2 * 2 * (t.n_stages - 2) * 4


def test_replicas_route_each_microbatch_by_its_own_placement():
    low = lower(chimera_2())
    validate_lowered(low)
    assert [str(a) for a in low.rows[1]][:3] == ["1RECV_F0", "0F1", "0SEND_F1"]
    assert Action(1, RECV_F, 1) in low.rows[0]
    assert Action(0, RECV_B, 1) in low.rows[1]


@pytest.mark.parametrize("name,p,m,chunks", [
    ("GPipe", 3, 4, None), ("GPipe", 4, 6, None),
    ("Interleaved1F1B", 2, 4, 2), ("Interleaved1F1B", 4, 8, 2), ("Interleaved1F1B", 3, 6, 3),
    ("LoopedBFS", 3, 5, 3), ("InterleavedZeroBubble", 4, 8, 2),
    ("ZBVZeroBubble", 4, 8, 2), ("ZBVZeroBubble", 3, 5, 2),
    ("DualPipeV", 4, 8, 2), ("DualPipeV", 3, 10, 2),
])
def test_lowering_equals_torch_add_send_recv(name, p, m, chunks):
    """Same compute rows in, same rows out as torch's lowering (OVERLAP_F_B given expanded to both)."""
    t = torch_table(name, p, m, chunks)
    low = lower(t)
    validate_lowered(low)
    compute = {d: [TorchAction.from_str(str(a)) for a in t.actions(d)] for d in range(p)}
    ref = _add_send_recv(compute, lambda s: t.placement[s], t.n_stages)
    assert [[str(a) for a in low.rows[d]] for d in range(p)] == [[str(a) for a in ref[d]] for d in range(p)]


def test_lower_rejects_invalid_and_lowered_input():
    bad = ScheduleTable.from_strings([["0B0", "0F0"], ["1F0", "1B0"]], (0, 1), 1)
    with pytest.raises(ScheduleError, match="0B0 comes before 0F0"):
        lower(bad)
    with pytest.raises(ScheduleError, match="already holds SEND/RECV"):
        lower(lower(one_f_one_b(2, 2)))


def _edit(table: ScheduleTable, d: int, fn) -> ScheduleTable:
    rows = [list(r) for r in table.rows]
    rows[d] = fn(rows[d])
    return table.with_rows(rows)


def test_missing_recv_is_reported_with_its_cell():
    low = lower(one_f_one_b(2, 2))
    broken = _edit(low, 1, lambda r: [a for a in r if a != Action(1, RECV_F, 1)])
    with pytest.raises(ScheduleError, match="0F1 feeds device 1 but 1RECV_F1 is missing") as e:
        validate_lowered(broken)
    assert ">0F1<" in str(e.value)


def test_swapped_receives_break_message_order():
    low = lower(one_f_one_b(3, 3))
    row = list(low.rows[1])
    i, j = row.index(Action(1, RECV_F, 0)), row.index(Action(1, RECV_F, 1))
    # move 1RECV_F1 right before 1RECV_F0: the receiver now expects mb 1 first
    row.insert(i, row.pop(j))
    broken = low.with_rows([low.rows[0], row, low.rows[2]])
    with pytest.raises(ScheduleError, match="message 0 from device 0 to device 1 is 0SEND_F0") as e:
        validate_lowered(broken)
    assert ">1RECV_F1<" in str(e.value)


def test_transfer_between_colocated_stages_is_rejected():
    low = lower(v_gpipe(2, 1))
    row = list(low.rows[1])
    row.insert(row.index(Action(1, F, 0)) + 1, Action(1, SEND_F, 0))
    with pytest.raises(ScheduleError, match="share device 1; co-located stages exchange nothing"):
        validate_lowered(low.with_rows([low.rows[0], row]))


def test_send_before_its_compute_is_rejected():
    low = lower(one_f_one_b(2, 1))
    row = list(low.rows[0])
    row.insert(0, row.pop(row.index(Action(0, SEND_F, 0))))
    with pytest.raises(ScheduleError, match="0SEND_F0 comes before 0F0"):
        validate_lowered(low.with_rows([row, low.rows[1]]))


def test_cycle_of_receives_is_a_deadlock():
    """Each device receives before it sends what the other waits for: consistent order, no run."""
    t = one_f_one_b(2, 2)
    low = lower(t)
    row0 = list(low.rows[0])
    # device 0 waits for the gradient of mb 0 before it sends mb 0's activation
    row0.remove(Action(0, RECV_B, 0))
    row0.insert(0, Action(0, RECV_B, 0))
    with pytest.raises(DeadlockError, match="deadlocks"):
        validate_lowered(low.with_rows([row0, low.rows[1]]))


def test_recv_after_its_consumer_is_rejected():
    low = lower(one_f_one_b(2, 1))
    row = list(low.rows[1])
    row.append(row.pop(row.index(Action(1, RECV_F, 0))))
    with pytest.raises(ScheduleError, match="1F0 comes before 1RECV_F0"):
        validate_lowered(low.with_rows([low.rows[0], row]))


def test_lowered_cells_use_torch_strings():
    low = lower(one_f_one_b(3, 2))
    for _, a in low:
        assert str(TorchAction.from_str(str(a))) == str(a)
    assert any(a.kind is SEND_B for _, a in low) and any(a.kind is B for _, a in low)


# ------------------------------------------------------------- every named schedule

NAMED_SHAPES = [(2, 4), (3, 6), (4, 5), (4, 8), (6, 12)]


def _named(name: str):
    for p, m in NAMED_SHAPES:
        try:
            yield p, m, build_schedule(name, p, m)
        except ScheduleError:
            continue  # a shape this schedule refuses


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_every_named_schedule_lowers_consistently(name):
    built = list(_named(name))
    assert built, f"{name} builds none of {NAMED_SHAPES}"
    for _p, m, t in built:
        low = lower(t)
        validate_lowered(low)
        assert low.compute_only() == t.compact()
        crossings = sum(t.device_of(s, k) != t.device_of(s + 1, k)
                        for s in range(t.n_stages - 1) for k in range(m))
        assert sum(a.kind is SEND_F for _, a in low) == crossings
        assert sum(a.kind is SEND_B for _, a in low) == crossings
        assert sum(a.kind.is_comm for _, a in low) == 4 * crossings


@pytest.mark.parametrize("name", ["zbv", "dualpipev", "hanayo"])
def test_v_shaped_named_schedules_have_no_comm_at_the_turn(name):
    for _p, _m, t in _named(name):
        for s in range(t.n_stages - 1):
            if t.placement[s] == t.placement[s + 1]:
                low = lower(t)
                assert not any(a.kind in (SEND_F, RECV_B) and a.stage == s for _, a in low)
                assert not any(a.kind in (RECV_F, SEND_B) and a.stage == s + 1 for _, a in low)


@pytest.mark.parametrize("name", sorted(set(SCHEDULES) - {"chimera"}))
def test_named_schedules_lower_exactly_as_torch(name):
    for p, m, t in _named(name):
        compute = {d: [TorchAction.from_str(str(a)) for a in t.actions(d)] for d in range(p)}
        ref = _add_send_recv(compute, lambda s: t.placement[s], t.n_stages)
        assert lower(t).as_strings() == [[str(a) for a in ref[d]] for d in range(p)], (p, m)


def test_chimera_needs_per_microbatch_routing_that_torch_lacks():
    """torch's `_add_send_recv` maps a stage to one rank; Chimera's second pipeline runs stage s
    on another device, so torch cannot lower the table at all, while ours routes by replica."""
    t = build_schedule("chimera", 4, 8)
    assert t.replicas
    compute = {d: [TorchAction.from_str(str(a)) for a in t.actions(d)] for d in range(4)}
    with pytest.raises(AssertionError, match="Malformed compute schedule"):
        _add_send_recv(compute, lambda s: t.placement[s], t.n_stages)
    validate_lowered(lower(t))


# ------------------------------------------------------------- property: any valid table

@st.composite
def random_tables(draw):
    """Any placement (a second replica placement for some micro-batches too), any B or I/W mix,
    rows cut from one random topological order of the data dependencies."""
    p = draw(st.integers(1, 4))
    n_s = draw(st.integers(1, 5))
    m = draw(st.integers(1, 4))
    places = [tuple(draw(st.lists(st.integers(0, p - 1), min_size=n_s, max_size=n_s)))
              for _ in range(draw(st.integers(1, 2)))]
    mb_replica = tuple(draw(st.integers(0, len(places) - 1)) for _ in range(m)) if len(places) > 1 else ()
    split = {(s, k) for s in range(n_s) for k in range(m) if draw(st.booleans())}
    rng = random.Random(draw(st.integers(0, 2**31)))
    t = ScheduleTable(tuple(() for _ in range(p)), places[0], m, "random", tuple(places[1:]), mb_replica)
    acts = [Action(s, F, k) for s in range(n_s) for k in range(m)]
    acts += [Action(s, x, k) for s in range(n_s) for k in range(m)
             for x in ((I, W) if (s, k) in split else (B,))]
    done: set[Action] = set()
    rows: list[list[Action]] = [[] for _ in range(p)]
    while len(done) < len(acts):
        a = rng.choice([a for a in acts if a not in done
                        and all(q in done for q in data_predecessors(a, n_s, split))])
        done.add(a)
        rows[t.device_of(a.stage, a.microbatch)].append(a)
    return t.with_rows(rows)


@settings(max_examples=80, deadline=None)
@given(random_tables())
def test_any_valid_table_lowers_to_a_consistent_deadlock_free_table(t):
    low = lower(t)
    validate_lowered(low)
    assert low.compute_only() == t
    crossings = sum(t.device_of(s, k) != t.device_of(s + 1, k)
                    for s in range(t.n_stages - 1) for k in range(t.n_microbatches))
    assert sum(a.kind.is_comm for _, a in low) == 4 * crossings
