"""In-situ calibration: the calibration table, fitting per-layer costs from a trace, shared cores."""
from __future__ import annotations

import numpy as np
import pytest

from octopipe.cluster import Link
from octopipe.config.runtime import RuntimeConfig
from octopipe.cost.table import CostTable
from octopipe.errors import ConfigError
from octopipe.measure.insitu import calibration_table, fit, fit_run, stage_times
from octopipe.plan import Plan, uniform_partition
from octopipe.runtime.job import Job
from octopipe.runtime.machine import local_cluster
from octopipe.schedule.action import ActionKind
from octopipe.schedule.library import build_schedule
from octopipe.schedule.validate import validate
from octopipe.sim import simulate
from octopipe.sim.core_sharing import concurrency, fit_background, makespan, stretch

RNG = np.random.default_rng(7)
N_LAYERS = 8
PROFILE = CostTable(tuple(f"l{j}" for j in range(N_LAYERS)), ("cpu",),
                    RNG.uniform(1, 3, (N_LAYERS, 1)), RNG.uniform(1, 3, (N_LAYERS, 1)),
                    RNG.uniform(1, 3, (N_LAYERS, 1)), np.ones(N_LAYERS), np.zeros(N_LAYERS),
                    np.full(N_LAYERS, 1024.0), np.zeros(N_LAYERS))


def synthetic_events(table, partition, true: dict[str, np.ndarray], factor: float = 1.0) -> list[list[dict]]:
    """A runtime-shaped trace of `table` run one action after another (no overlap across ranks,
    so every action has a core to itself), each lasting `factor` times its stage's sum of `true`
    layer times."""
    events: list[list[dict]] = [[] for _ in table.rows]
    clock = 0.0
    for it in range(2):
        for d, row in enumerate(table.rows):
            for a in row:
                lo, hi = partition[a.stage]
                if a.kind == ActionKind.I and lo == 0:
                    secs = 0.0          # the first stage has no input gradient
                elif a.kind == ActionKind.W and lo == 0:
                    secs = float(true["i"][lo:hi].sum() + true["w"][lo:hi].sum())
                else:
                    secs = float(true[a.kind.name.lower()][lo:hi].sum())
                secs *= factor
                events[d].append({"it": it, "action": str(a), "start": clock, "end": clock + secs})
                clock += secs
    return events


def test_calibration_table_is_valid_and_every_stage_runs_f_i_w_and_b():
    for base in ("1f1b", "gpipe"):
        t = calibration_table(4, 6, base)
        validate(t)
        for s in range(4):
            kinds = {a.kind for row in t.rows for a in row if a is not None and a.stage == s}
            assert kinds == {ActionKind.F, ActionKind.B, ActionKind.I, ActionKind.W}
    with pytest.raises(ConfigError, match="microbatches=1"):
        calibration_table(2, 1)
    with pytest.raises(ConfigError, match="zbv"):
        calibration_table(2, 4, "zbv")


def test_fit_recovers_layer_times_that_follow_the_profile_scaled_per_stage():
    n = 2
    table = calibration_table(n, 4)
    partition = uniform_partition(N_LAYERS, n)
    scale = {"f": (1.7, 0.6), "i": (1.2, 2.5), "w": (0.9, 1.4), "b": (0.8, 1.1)}
    profile = {k: getattr(PROFILE, k)[:, 0] for k in "fiw"}
    profile["b"] = profile["i"] + profile["w"]
    true = {k: np.concatenate([profile[k][lo:hi] * scale[k][s] for s, (lo, hi) in enumerate(partition)])
            for k in "fiwb"}
    cal = fit(stage_times(synthetic_events(table, partition, true), n, [0, 1]), partition, PROFILE)
    assert np.allclose(cal.f, true["f"]) and np.allclose(cal.b, true["b"])
    hi0 = partition[0][1]
    # beyond the first stage, I and W are recovered layer by layer
    assert np.allclose(cal.i[hi0:], true["i"][hi0:]) and np.allclose(cal.w[hi0:], true["w"][hi0:])
    # on the first stage only the split backward's total is observable
    assert np.isclose(cal.i[:hi0].sum() + cal.w[:hi0].sum(), true["i"][:hi0].sum() + true["w"][:hi0].sum())


def test_costs_for_gives_each_schedule_the_costs_of_the_actions_it_runs():
    partition = uniform_partition(N_LAYERS, 2)
    true = {k: getattr(PROFILE, k)[:, 0] * 1.3 for k in "fiw"}
    true["b"] = 0.7 * (true["i"] + true["w"])
    cal = fit(stage_times(synthetic_events(calibration_table(2, 4), partition, true), 2, [0]),
              partition, PROFILE)
    b_costs = cal.costs_for(build_schedule("1f1b", 2, 4), PROFILE, partition)
    assert np.allclose(b_costs.i[:, 0] + b_costs.w[:, 0], true["b"])
    zb = build_schedule("zbh1", 2, 4)
    split = cal.costs_for(zb, PROFILE, partition)
    hi0 = partition[0][1]
    assert np.allclose(split.i[:hi0, 0], 0.0) and np.allclose(split.i[hi0:, 0], true["i"][hi0:])
    # the simulated iteration of the calibrated schedule equals one timed with the true stage sums
    truth = CostTable(PROFILE.layer_names, ("cpu",), true["f"][:, None], true["i"][:, None],
                      true["w"][:, None], PROFILE.act_bytes, PROFILE.static_bytes, PROFILE.out_bytes,
                      PROFILE.params)
    cluster = local_cluster(2, Link("loop", 1e12, 0.0))
    plan = Plan(partition, zb, "synthetic")
    want = simulate(plan, truth, cluster, policy="strict", semantics="eager").makespan
    assert cal.predict(plan, PROFILE, cluster, "strict") == pytest.approx(want)


def test_concurrency_and_stretch_of_known_intervals():
    k = concurrency(np.array([0.0, 0.0, 1.0]), np.array([2.0, 1.0, 2.0]))
    assert np.allclose(k, [2.0, 2.0, 2.0])
    assert np.allclose(concurrency(np.array([0.0, 5.0]), np.array([1.0, 6.0])), [1.0, 1.0])
    assert np.allclose(stretch(np.array([1.0, 2.0, 4.0]), 2, 0.0), [1.0, 1.0, 2.0])
    assert np.allclose(stretch(np.array([1.0, 2.0]), 2, 1.0), [1.0, 1.5])


def test_fit_background_recovers_the_load_that_stretched_synthetic_durations():
    groups = np.repeat(np.arange(4), 6)
    base = np.array([0.01, 0.02, 0.05, 0.03])[groups]
    k = np.tile([1.0, 1.5, 2.0, 1.0, 2.0, 1.2], 4)
    assert fit_background(groups, k, base * stretch(k, 2, 1.5), 2) == pytest.approx(1.5)


def test_fit_run_refers_durations_to_a_core_of_their_own():
    """Every action runs beside a twin on 1 core and so lasts twice its true time: fit_run with
    cores=1 divides that back out, without cores it reports the doubled times."""
    partition = uniform_partition(N_LAYERS, 2)
    true = {k: getattr(PROFILE, k)[:, 0] for k in "fiw"}
    true["b"] = true["i"] + true["w"]
    events = synthetic_events(calibration_table(2, 4), partition, true, factor=2.0)
    twins = events + [[dict(e) for e in rank] for rank in events]
    assert np.allclose(fit_run(events, partition, PROFILE, [0, 1], cores=None).f, 2 * true["f"])
    ref = fit_run(twins, partition, PROFILE, [0, 1], cores=1)
    assert ref.background == 0.0 and np.allclose(ref.f, true["f"]) and np.allclose(ref.b, true["b"])


def test_makespan_with_enough_cores_is_the_plain_simulation_and_shared_cores_slow_it():
    partition = uniform_partition(N_LAYERS, 4)
    table = build_schedule("1f1b", 4, 8)
    plan = Plan(partition, table, "synthetic")
    cluster = local_cluster(4, Link("loop", 1e12, 0.0))
    plain = simulate(plan, PROFILE, cluster, policy="strict", semantics="eager").makespan
    assert makespan(plan, PROFILE, cluster, "strict", cores=8, background=0.0) == pytest.approx(plain)
    shared = makespan(plan, PROFILE, cluster, "strict", cores=2, background=0.0)
    assert plain < shared <= 2.0 * plain * 1.01


def test_calibration_table_with_chunks_covers_every_stage_of_a_looped_partition():
    t = calibration_table(2, 4, chunks=2)
    validate(t)
    assert t.n_stages == 4 and t.placement == (0, 1, 0, 1)
    for s in range(4):
        kinds = {a.kind for row in t.rows for a in row if a is not None and a.stage == s}
        assert kinds == {ActionKind.F, ActionKind.B, ActionKind.I, ActionKind.W}


def test_concurrency_counts_only_intervals_of_the_same_group():
    start, end = np.array([0.0, 0.0, 0.0]), np.array([1.0, 1.0, 1.0])
    assert np.allclose(concurrency(start, end, np.array([0, 1, 0])), [2.0, 1.0, 2.0])


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "zbh1", "interleaved"])
def test_pinned_makespan_one_core_per_rank_is_plain_and_one_core_for_all_is_the_total_work(name):
    """Ranks on cores of their own run as the plain simulation; all ranks on one core (free
    links) keep that core busy until the work is done, so the iteration is the sum of all
    compute (the damped fixed point lands within a few percent)."""
    table = build_schedule(name, 4, 8)
    plan = Plan(uniform_partition(N_LAYERS, table.n_stages), table, "synthetic")
    cluster = local_cluster(4, Link("loop", 1e12, 0.0))
    plain = simulate(plan, PROFILE, cluster, policy="strict", semantics="eager")
    total = float(sum(plain.end - plain.start))
    own = makespan(plan, PROFILE, cluster, "strict", 4, 0.0, pinned=[0, 1, 2, 3])
    assert own == pytest.approx(plain.makespan)
    assert makespan(plan, PROFILE, cluster, "strict", 1, 0.0, pinned=[0, 0, 0, 0]) == pytest.approx(total, rel=0.03)
    pairs = makespan(plan, PROFILE, cluster, "strict", 2, 0.0, pinned=[0, 1, 0, 1])
    assert max(plain.makespan, total / 2) * 0.99 <= pairs <= total * 1.01


def test_fit_run_with_pinned_ranks_divides_out_only_partners_on_the_same_core():
    """Two launches pooled: the twin copy of each rank shares its core only when pinned alike."""
    partition = uniform_partition(N_LAYERS, 2)
    true = {k: getattr(PROFILE, k)[:, 0] for k in "fiw"}
    true["b"] = true["i"] + true["w"]
    events = synthetic_events(calibration_table(2, 4), partition, true, factor=2.0)
    # ranks 0, 1 and their twins 2, 3 (pinned 4 ranks -> 2 cores: 0 and 2 share, 1 and 3 share)
    twins = events + [[dict(e) for e in rank] for rank in events]
    shared = fit_run(twins, partition, PROFILE, [0, 1], cores=2, pinned=[0, 1, 0, 1])
    assert shared.background == 0.0 and np.allclose(shared.f, true["f"]) and shared.pinned == (0, 1, 0, 1)
    apart = fit_run(twins, partition, PROFILE, [0, 1], cores=4, pinned=[0, 1, 2, 3])
    assert np.allclose(apart.f, 2 * true["f"])


def test_calibration_table_splits_the_backward_of_the_chosen_parity():
    for split in (0, 1):
        t = calibration_table(2, 4, split=split)
        validate(t)
        halves = {a.microbatch % 2 for row in t.rows for a in row if a.kind == ActionKind.I}
        wholes = {a.microbatch % 2 for row in t.rows for a in row if a.kind == ActionKind.B}
        assert halves == {split} and wholes == {1 - split}


def test_calibrate_on_an_uneven_partition_times_those_very_stages():
    """A tuned plan's uneven stages (2 per rank here) are calibrated as they are: every stage of
    that partition shows F, I, W and B, and the name carries the stage sizes."""
    from octopipe.measure.insitu import calibrate, calibration_name
    from tests.runtime import tiny
    model = tiny.dense(2)                                   # 6 layers
    part = ((0, 1), (1, 4), (4, 5), (5, 6))
    profile = CostTable.uniform(model.n_layers, f=1e-3, i=1e-3, w=1e-3)
    plan = Plan(part, build_schedule("zbv", 2, 4))          # the plan it predicts: 2 ranks, 4 micro-batches
    job = Job(plan, model, RuntimeConfig(dispatch="strict", iterations=1, warmup=0, timeout_s=120), costs=profile)
    cal, results = calibrate(job, part)
    assert cal.partition == part and cal.name == calibration_name("calibration-interleaved-x2", part)
    assert cal.name.endswith("@1+3+1+1")
    assert all(set(cal.observed[s]) == {"F", "I", "W", "B"} for s in range(1, 4))
    assert results[0].table.n_stages == 4
    with pytest.raises(ValueError, match="same stages on each of the 2 ranks"):
        calibrate(job, ((0, 2), (2, 4), (4, 6)))
