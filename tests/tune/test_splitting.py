"""The tuner's splitting lever (heavy layers cut into pieces): piece costs, mapped starting points,
split plans that the simulator and plan files agree on, and a head-bound case that only splitting
can balance."""
from dataclasses import replace

import numpy as np
import pytest

from octopipe.cost.table import CostTable
from octopipe.errors import ConfigError
from octopipe.plan_io import load_plan, save_plan
from octopipe.sim.simulator import simulate
from octopipe.tune import Problem, TuneOptions, tune
from octopipe.tune.split_choice import choose_split
from octopipe.tune.splitting import map_sizes, row_splitter, split_rows

from .helpers import free_cluster

CFG = {"time_budget_s": 20, "max_iters": 30, "patience": 10, "ilp": False}


def head_heavy(n=9, head=8.0):
    """Equal layers and a last 'head' row `head` times heavier."""
    f = np.ones(n)
    f[-1] = head
    f = f[:, None] * 1e-3
    return CostTable(tuple(f"l{j}" for j in range(n)), ("dev",), f, f, f, np.full(n, 2**20),
                     np.full(n, 2**20), np.full(n, 2**16), np.ones(n), w_act_bytes=np.full(n, 2**19),
                     flops=np.ones(n), tokens_per_microbatch=1024)


def test_split_rows_divides_evenly_and_carries_between_pieces():
    c = head_heavy()
    s = split_rows(c, {8: 4, 2: 2})
    assert s.n_layers == c.n_layers + 3 + 1
    for name in ("f", "i", "w", "act_bytes", "static_bytes", "params", "w_act_bytes", "flops"):
        assert np.asarray(getattr(s, name)).sum() == pytest.approx(np.asarray(getattr(c, name)).sum())
    assert s.layer_names[2:4] == ("l2[0/2]", "l2[1/2]")
    assert s.out_bytes[2] == 2 * c.out_bytes[2] and s.out_bytes[3] == c.out_bytes[2]
    assert map_sizes((3, 3, 3), {8: 4, 2: 2}) == (4, 3, 6)


def test_split_rows_keep_a_measured_full_backward_and_the_host_time():
    c = replace(head_heavy(), full_b=0.6 * (head_heavy().i + head_heavy().w), action_s=2e-4, _prefix={})
    s = split_rows(c, {8: 4})
    assert s.b.sum() == pytest.approx(c.b.sum()) and s.b.sum() < (s.i + s.w).sum()
    assert s.action_s == c.action_s


def test_tuner_pieces_a_head_that_bounds_every_whole_layer_plan():
    costs, cl = head_heavy(), free_cluster(4, memory_bytes=2**34, latency=0.0, bandwidth=1e15)
    whole = tune(costs, cl, 4, 16, TuneOptions({**CFG, "split_layers": "off"}, baselines=False))
    split = tune(costs, cl, 4, 16, TuneOptions(CFG, baselines=False,
                                               splitter=row_splitter(costs, [False] * 8 + [True])))
    # whole layers: the head's device owes 16 x 24 ms at least; total work / 4 = 16 x 12 ms
    assert whole.makespan_s >= 16 * 24e-3
    assert whole.piece_counts == {} and whole.plan.pieces == {} and "pieces" not in whole.plan.meta
    assert split.plan.pieces == split.piece_counts and split.piece_counts[8] >= 2
    assert split.makespan_s < 0.8 * whole.makespan_s
    assert split.lower_bound_s == whole.lower_bound_s
    assert split.makespan_s >= split.lower_bound_s


def test_split_plan_round_trips_and_resimulates(tmp_path):
    costs, cl = head_heavy(), free_cluster(4, memory_bytes=2**34, latency=1e-5, bandwidth=50e9)
    res = tune(costs, cl, 4, 8, TuneOptions(CFG, splitter=row_splitter(costs, [False] * 8 + [True])))
    assert res.costs.n_layers == res.plan.n_layers
    save_plan(res.plan, tmp_path / "plan.json", tmp_path / "plan.csv")
    back = load_plan(tmp_path / "plan.json")
    assert back.pieces == res.piece_counts and back == res.plan
    assert simulate(back, res.costs, cl).makespan \
        == pytest.approx(res.makespan_s, rel=1e-9)
    for b in res.baselines:
        if b.feasible:
            assert res.makespan_s <= b.makespan_s * (1 + 1e-9)


def test_choice_pieces_for_granularity_only_where_it_pays():
    # 26 equal layers on 8 devices (even share 3.25): whole layers leave one device 4 (+23%),
    # halves 3.5 (+7.7%), thirds 10/3 (+2.6%); the tuner takes thirds though no layer exceeds
    # the cap (half a share = 1.625)
    cl = free_cluster(8, memory_bytes=2**34, latency=0.0, bandwidth=1e15)
    costs = CostTable.uniform(26, static_bytes=1.0)
    sp = row_splitter(costs, [True] * 26)
    assert sp.counts(np.ones(26), 8, 0.5) == {}
    _, counts, _ = choose_split(Problem.build(costs, cl, 8, 64), sp, 0.5, 8)
    assert counts == dict.fromkeys(range(26), 3)
    # 32 equal layers on 8 devices balance exactly, whole or halved: the bounds tie, and the tie
    # goes to the option whose best starting point is shorter (halves: 8 chunks per device, a
    # shorter fill), which the choice records
    c32 = CostTable.uniform(32)
    pb, counts, info = choose_split(Problem.build(c32, cl, 8, 64), row_splitter(c32, [True] * 32), 0.5, 8)
    whole, halves = info
    assert whole["pieces"] == 0 and whole["bound_s"] == halves["bound_s"]
    assert halves["best_start_s"] < whole["best_start_s"]
    assert counts == dict.fromkeys(range(32), 2) and pb.n_layers == 64
    # with one option alone nothing is estimated
    _, _, info = choose_split(Problem.build(costs, cl, 8, 64), sp, 0.5, 8)
    assert all("best_start_s" not in x for x in info)


def test_fixed_share_stays_with_the_first_piece():
    c = head_heavy()
    s = split_rows(c, {8: 3}, fixed=[0.0] * 8 + [0.4])
    assert s.f[8:11, 0] == pytest.approx(c.f[8, 0] * np.array([0.6, 0.2, 0.2]))
    assert s.f.sum() == pytest.approx(c.f.sum())


def test_piece_modes_force_and_off_and_bad_values():
    costs, cl = head_heavy(), free_cluster(4, memory_bytes=2**34, latency=0.0, bandwidth=1e15)
    sp = row_splitter(costs, [True] * 9)
    forced = tune(costs, cl, 4, 8, TuneOptions({**CFG, "split_layers": "force", "split_share": 0.1},
                                               baselines=False, splitter=sp))
    assert forced.piece_counts == sp.counts(np.asarray((costs.f + costs.i + costs.w)[:, 0]), 4, 0.1)
    off = tune(costs, cl, 4, 8, TuneOptions({**CFG, "split_layers": "off"}, baselines=False, splitter=sp))
    assert off.piece_counts == {} and off.costs is costs
    with pytest.raises(ConfigError, match="tuner.split_layers='always': choose one of auto, force, off"):
        tune(costs, cl, 4, 8, TuneOptions({**CFG, "split_layers": "always"}, splitter=sp))
    with pytest.raises(ConfigError, match="tuner.split_share"):
        tune(costs, cl, 4, 8, TuneOptions({**CFG, "split_share": 0}, splitter=sp))


def test_row_splitter_caps_pieces_at_the_layers_split_extent():
    costs = head_heavy()
    work = np.asarray((costs.f + costs.i + costs.w)[:, 0])
    uncapped = row_splitter(costs, [True] * 9).counts(work, 4, 0.1)
    assert max(uncapped.values()) > 2
    capped = row_splitter(costs, [True] * 9, max_pieces=[2] * 9).counts(work, 4, 0.1)
    assert set(capped) == set(uncapped) and set(capped.values()) == {2}
