"""The shared jitter model, the hint ranking and the admission rule (no processes)."""
from __future__ import annotations

import numpy as np
import pytest

from octopipe.errors import ConfigError
from octopipe.schedule.library import build_schedule
from octopipe.sim.engine import hint_priority
from octopipe.sim.hints import cap_problem, consistent_orders, priority, row_need, row_priority
from octopipe.sim.program import compile_table
from octopipe.sim.simulator import ReadyFirst, Simulator
from octopipe.sim.variability import Variability, vision_share


def test_same_seed_same_draws_and_the_moments_the_model_names():
    v = Variability(cv=0.3, straggler_prob=0.1, straggler_factor=4.0, seq_len_cv=0.2)
    a = v.draws(np.random.default_rng((5, 2)), 3, 4000)
    b = v.draws(np.random.default_rng((5, 2)), 3, 4000)
    assert all(np.array_equal(x, y) for x, y in zip(vars(a).values(), vars(b).values()))
    c = v.draws(np.random.default_rng((5, 3)), 3, 4000)
    assert not np.array_equal(a.action, c.action)
    noise = Variability(cv=0.3).draws(np.random.default_rng(0), 4, 20000).action
    assert noise.mean() == pytest.approx(1.0, abs=0.01)
    assert noise.std() / noise.mean() == pytest.approx(0.3, rel=0.05)
    # stragglers: mean 1 + p (factor - 1) on top of the lognormal's 1
    assert a.action.mean() == pytest.approx(1 + 0.1 * 3.0, rel=0.05)


def test_slow_rank_floor_and_images_move_only_the_vision_share():
    v = Variability(images_max=8, samples=2, vision_share=(1.0, 0.0), slow_rank=1, slow_rank_factor=2.0)
    d = v.draws(np.random.default_rng(1), 2, 64)
    assert d.images.std() > 0.2 and d.images.mean() == pytest.approx(1.0, abs=0.15)
    vis = v.compute_factor(d, np.zeros(64, int), np.zeros(64, int), np.arange(64), np.zeros(64, int))
    text = v.compute_factor(d, np.ones(64, int), np.zeros(64, int), np.arange(64), np.ones(64, int))
    assert np.allclose(vis, d.images) and np.allclose(text, 2.0)
    floored = Variability(cv=0.5, floor=1.0)
    dd = floored.draws(np.random.default_rng(2), 1, 50)
    assert floored.compute_factor(dd, 0, np.zeros(50, int), np.arange(50), 0).min() == 1.0
    assert vision_share(("patch_embed", "vit_block", "embedding", "head"), np.array([1.0, 3, 2, 2]),
                        ((0, 2), (2, 4))) == (1.0, 0.0)


@pytest.mark.parametrize("field,kw", [("jitter_cv", {"cv": -0.1}), ("straggler_prob", {"straggler_prob": 1.5}),
                                      ("straggler_factor", {"straggler_factor": 0.5}),
                                      ("slow_rank", {"slow_rank": -3})])
def test_bad_variability_names_the_field(field, kw):
    with pytest.raises(ConfigError, match=field):
        Variability(**kw)


def test_simulator_applies_the_draws_the_model_gives():
    table = build_schedule("1f1b", 2, 4)
    sim = Simulator(table).uniform(1.0, 2.0)
    v = Variability(cv=0.4, transfer_delay=0.5)
    got = v.apply(sim.program, sim.durations, np.random.default_rng((7, 1)))
    d = v.draws(np.random.default_rng((7, 1)), 2, 4)
    p = sim.program
    for c in range(p.n_compute):
        f = d.action[p.c_stage[c], p.c_mb[c], (0, 1, 2, 1)[p.c_kind[c]]]
        assert got.compute[c] == pytest.approx(sim.durations.compute[c] * f)
    assert (got.transfer > sim.durations.transfer).all()
    assert sim.run(jitter=v, seed=(7, 1)).makespan == sim.run(got).makespan


@pytest.mark.parametrize("hint", ["table", "bf", "bfw"])
def test_the_runtime_ranking_is_the_simulators(hint):
    table = build_schedule("zbv", 2, 4)
    prog = compile_table(table)
    sim = hint_priority(prog, hint)
    compute = table.compact().compute_only()
    for d in range(table.n_devices):
        runtime = row_priority(compute.actions(d), hint)
        for c in np.flatnonzero(prog.c_dev == d):
            assert runtime[prog.action(int(c))] == sim[c]
    with pytest.raises(ConfigError, match="hint"):
        priority(np.zeros(2), np.arange(2), "fb")


def test_caps_count_micro_batches_and_a_cap_that_could_deadlock_is_named():
    zbv = build_schedule("zbv", 2, 4)
    rows = [zbv.compact().compute_only().actions(d) for d in range(2)]
    assert consistent_orders(rows) and cap_problem(rows, 1, True) is None
    chim = build_schedule("chimera", 2, 2)
    rows = [chim.compact().compute_only().actions(d) for d in range(2)]
    assert [row_need(r) for r in rows] == [2, 2] and not consistent_orders(rows)
    assert "use max_inflight >= 2" in cap_problem(rows, 1, False)
    assert cap_problem(rows, 2, False) is None
    # a safe cap holds: gpipe with one slot per device never has two live micro-batches
    res = Simulator(build_schedule("gpipe", 3, 6)).uniform(1.0, 2.0).run(policy=ReadyFirst("bf", max_inflight=1))
    assert res.peak_activation_memory.max() == 1


def test_image_tokens_carry_the_image_count_into_the_language_stages():
    """tiny_vlm feeds 16 image tokens ahead of 48 text tokens to its language layers: those
    layers' time follows the images by 16/64, the vision layers' wholly, the head's (text-only
    loss) not at all; with equal layer times a stage's share is the mean of its layers'."""
    from octopipe.config.presets import preset
    from octopipe.model.build import build_model
    from octopipe.sim.variability import image_share
    m = build_model(preset("model", "tiny_vlm"))
    kinds = [x.kind.value for x in m.layers]
    assert kinds[:4] == ["patch_embed", "vit_block", "vit_block", "projector"] and kinds[-1] == "head"
    f = np.arange(1.0, m.n_layers + 1)
    got = image_share(m, f, ((0, 4), (4, 9), (9, 10)))
    assert got == pytest.approx((1.0, 16 / 64, 0.0))
    mixed = image_share(m, f, ((0, 5), (5, 10)))
    assert mixed[0] == pytest.approx((1 + 2 + 3 + 4 + 5 * 0.25) / 15)
    assert mixed[1] == pytest.approx((6 + 7 + 8 + 9) * 0.25 / 40)
    lm = build_model(preset("model", "tiny_hybrid"))
    assert image_share(lm, np.ones(lm.n_layers), ((0, lm.n_layers),)) == (0.0,)
