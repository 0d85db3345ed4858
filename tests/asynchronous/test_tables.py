"""Asynchronous tables: read versions, held versions and delays against hand-computed small
cases, the closed form in generators.pipedream, and the paper's own tick simulator."""
import numpy as np
import pytest

from octopipe.asynchronous.staleness import delay_by_stages, delay_law, delay_stats, law_residuals, read_delays
from octopipe.asynchronous.tables import async_schedule, check_stream, schedule_versions
from octopipe.errors import ScheduleError
from octopipe.schedule.action import Action, B, F
from octopipe.schedule.generators import forward_version, pipedream, weight_versions
from octopipe.schedule.library import build_schedule
from octopipe.schedule.validate import validate


def paper_timeline(S, M):
    """Ilin & Richtárik's unit-tick PipeDream simulator (randomized-pipedream,
    src/schedulers/pipedream_1f1b.py), transcribed: the independent oracle of the delays."""
    fd = [[-1] * M for _ in range(S)]
    bd = [[-1] * M for _ in range(S)]
    steady, pref, nf, nb, active, t, out = [False] * S, ["F"] * S, [0] * S, [0] * S, 0, 0, []
    while bd[0][M - 1] == -1:
        ops = [None] * S
        for s in range(S):
            rf = rb = None
            k = nf[s]
            if k < M and ((s == 0 and active < S) or (s > 0 and -1 < fd[s - 1][k] < t)):
                rf = k
            k = nb[s]
            if k < M and -1 < fd[s][k] < t and (s == S - 1 or -1 < bd[s + 1][k] < t):
                rb = k
            if rb is not None and (not steady[s] or pref[s] == "B" or rf is None):
                ops[s], steady[s], pref[s] = ("B", rb), True, "F"
            elif rf is not None:
                ops[s] = ("F", rf)
                if steady[s]:
                    pref[s] = "B"
        for s, op in enumerate(ops):
            if op is None:
                continue
            if op[0] == "F":
                fd[s][op[1]], nf[s], active = t, nf[s] + 1, active + (s == 0)
            else:
                bd[s][op[1]], nb[s], active = t, nb[s] + 1, active - (s == 0)
        out.append(ops)
        t += 1
    return out


def paper_delays(S, M):
    """`build_pipedream_exact_delays`: delay = k - forward_history_index[mb][stage]."""
    fh = -np.ones((M, S), int)
    h, rows = 0, []
    for ops in paper_timeline(S, M):
        for s, op in enumerate(ops):
            if op is None:
                continue
            if op[0] == "F":
                fh[op[1], s] = h
            else:
                rows.append(h - fh[op[1]])
                h += 1
    return np.array(rows)


def test_pd_two_stages_by_hand():
    a = async_schedule("pd", 2, 4)
    validate(a.table)
    assert a.n_ticks == 10
    # updates in time order: B(1,0) B(0,0) B(1,1) B(0,1) ... ; delays [stage 0, stage 1]
    d = read_delays(a)
    assert d.update.tolist() == list(range(8))
    assert d.stage.tolist() == [1, 0] * 4
    assert d.delays.tolist() == [[0, 0], [1, 1], [2, 0], [3, 1], [2, 0], [3, 1], [2, 0], [3, 1]]
    reads = a.reads()
    assert [reads[Action(0, F, k)] for k in range(4)] == [0, 0, 1, 2]
    assert [reads[Action(1, F, k)] for k in range(4)] == [0, 1, 2, 3]
    assert reads[Action(0, B, 3)] == 2          # the B reads what its F stashed
    assert a.versions_held() == (2, 1)


def test_pd_versions_equal_the_closed_form_and_weight_versions():
    for p, m in ((2, 6), (4, 12), (5, 9), (8, 24)):
        a = async_schedule("pd", p, m)
        reads, wv = a.reads(), weight_versions(pipedream(p, m))
        assert reads == wv
        for s in range(p):
            for k in range(m):
                assert reads[Action(s, F, k)] == forward_version(p, s, k)
        # PipeDream keeps p - s versions at stage s (NOAM in flight)
        assert a.versions_held() == tuple(min(p - s, m) for s in range(p))


def test_vsync_reads_stage_zero_tag_and_2bw_holds_two_buffers():
    v = async_schedule("vsync", 2, 4)
    reads = v.reads()
    assert [reads[Action(1, F, k)] for k in range(4)] == [0, 0, 1, 2]
    assert v.versions_held() == (2, 2)
    for p, w in ((2, 2), (4, 4), (4, 8), (8, 8)):
        t = async_schedule("2bw", p, 4 * w, window=w)
        reads = t.reads()
        assert all(reads[Action(s, F, k)] == max(0, k // w - 1) for s in range(p) for k in range(4 * w))
        assert t.updates_per_stage() == (4,) * p
        assert t.versions_held() == (2,) * p
    # one update per window: a steady read is at most two windows of updates old, minus one
    assert delay_stats(read_delays(async_schedule("2bw", 4, 40)).steady()).max == 2 * 4 - 1


def test_delays_match_the_papers_simulator():
    """The steady half agrees row for row (only the warm-up orders differ)."""
    for S in (2, 3, 4, 5, 6, 8):
        ours = read_delays(async_schedule("pd", S, 6 * S)).steady().delays
        theirs = paper_delays(S, 6 * S)
        theirs = theirs[len(theirs) - len(ours):]
        assert np.array_equal(ours, theirs)


def test_delay_law_residual_is_bounded():
    stats = delay_by_stages((2, 3, 4, 6, 8, 12, 16, 24, 32))
    res = law_residuals(stats)
    assert all(-1.0 <= r <= 1.0 for r in res.values()), res
    assert stats[32].max == pytest.approx(delay_law(32), abs=1)
    # the mean is about half the max (the delay of block j falls linearly with j)
    assert all(0.4 < st.mean / st.max < 0.6 for s, st in stats.items() if s >= 4)


def test_split_backward_table_updates_after_w():
    t = build_schedule("zbh1", 3, 6)
    sv = schedule_versions(t)
    assert sv.updates_per_stage() == (6, 6, 6)
    assert all(e.action.kind.value == "W" for e in sv.events if e.update >= 0)


@pytest.mark.parametrize("args, word", [
    (("pipedream", 4, 3), "microbatches"), (("pipedream_2bw", 4, 16, 3), "window"),
    (("pipedream_2bw", 4, 18, 4), "does not divide"), (("pipedream", 0, 3), "pp"),
])
def test_bad_streams_name_the_field(args, word):
    with pytest.raises(ScheduleError, match=word):
        check_stream(*args)


def test_registry_2bw_refuses_a_window_that_does_not_divide():
    with pytest.raises(ScheduleError, match="does not divide"):
        build_schedule("pipedream_2bw", 4, 10)
