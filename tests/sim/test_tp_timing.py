"""TP collectives and RRFP's agreement in the simulator, against closed forms on simple chains."""
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from octopipe.cluster import Cluster, DeviceKind, Link
from octopipe.cost.analytic import AnalyticCostModel
from octopipe.model.build import build_model
from octopipe.model.layer import LayerKind as K
from octopipe.plan import Partition
from octopipe.schedule.library import build_schedule
from octopipe.sim import ReadyFirst, Simulator
from octopipe.sim.agreement import (
    agreement_seconds,
    agreement_stages,
    charged,
    collective_stages,
    collective_tasks,
    needs_agreement,
    tp_agreement,
)
from octopipe.sim.durations import bind

CONF = Path(__file__).resolve().parents[2] / "conf" / "model"
NV = Link("nv", 450e9, 3e-6)
H100 = DeviceKind("H100-SXM", 989.4e12, 80e9, 3350e9)
FOUR = Cluster("four", (H100,), (0,) * 4, (0,) * 4, NV, NV)


def model(name):
    return build_model(OmegaConf.load(CONF / f"{name}.yaml"))


def ring_all_reduce(nbytes, n, link):
    return 2 * (n - 1) * link.latency + 2 * (n - 1) / n * nbytes / link.bandwidth


def chain(m, tp, collectives=True, stages=4):
    """A 1-micro-batch GPipe chain of `stages` stages of `m` costed at `tp`."""
    costs = AnalyticCostModel(tp=tp, tp_collectives=collectives).table(m, FOUR)
    part = Partition.balanced(costs.work[:, 0], stages)
    sim = Simulator(build_schedule("gpipe", stages, 1), costs, FOUR, part)
    return sim, part


def test_agreement_round_is_a_scalar_all_gather():
    link = Link("l", 1e9, 5e-6)
    assert agreement_seconds(2, link) == pytest.approx(5e-6 + 8.0 / 1e9)
    assert agreement_seconds(4, link) == pytest.approx(3 * 5e-6 + 3 / 4 * 32.0 / 1e9)
    assert agreement_seconds(1, link) == 0.0


def test_megatron_block_pays_two_all_reduces_each_way():
    """A transformer layer (attention + MLP) on the chain: 2 ring all-reduces of n_tok·h·2 bytes
    in F and 2 in I, none in W: the tp=2 iteration is longer than tp=2 without collectives by
    exactly their sum over the chain."""
    m = model("llama3_8b")
    sim_on, _part = chain(m, 2)
    sim_off, _ = chain(m, 2, collectives=False)
    n_tok = m.seq_len * m.micro_batch_size
    ar = ring_all_reduce(2.0 * n_tok * m.layers[1].hidden, 2, NV)
    per_pass = {K.ATTENTION: ar, K.MLP: ar, K.EMBEDDING: ar, K.HEAD: 3 * ring_all_reduce(4.0 * n_tok, 2, NV)}
    f = sum(per_pass[x.kind] for x in m.layers)
    i = sum(ar for x in m.layers if x.kind in (K.ATTENTION, K.MLP, K.HEAD))
    extra = sim_on.run().makespan - sim_off.run().makespan
    assert extra == pytest.approx(f + i, rel=1e-9)
    blocks = sum(x.kind is K.ATTENTION for x in m.layers)
    assert f == pytest.approx(2 * blocks * ar + ar + 3 * ring_all_reduce(4.0 * n_tok, 2, NV))


def test_tp1_is_unchanged():
    m = model("llama3_8b")
    sim, part = chain(m, 1)
    base = sim.durations
    assert tp_agreement(sim.program, base, m, part, 1, NV) is base
    rf = ReadyFirst("bfw")
    assert sim.run(tp_agreement(sim.program, base, m, part, 1, NV), policy=rf).makespan == \
        sim.run(base, policy=rf).makespan
    assert not collective_stages(m, part, 1)[0].any()


def test_agreement_on_a_chain_costs_one_round_per_task_with_collectives():
    """Ready-first pays one round before each F and B of the chain (every stage runs TP
    collectives both ways: a round follows readiness); strict pays none; W of a split backward
    pays none except on the first stage, whose whole backward runs in W in this runtime (its input
    has no gradient), so there its I, which computes nothing, pays none."""
    m = model("llama3_8b")
    sim, part = chain(m, 2)
    a = agreement_seconds(2, NV)
    dur = tp_agreement(sim.program, sim.durations, m, part, 2, NV)
    n_tasks = int(collective_tasks(sim.program, m, part, 2).sum())
    assert n_tasks == 2 * 4
    strict = sim.run(sim.durations).makespan
    assert sim.run(dur).makespan == strict
    assert sim.run(dur, policy=ReadyFirst("bf")).makespan == pytest.approx(strict + n_tasks * a, rel=1e-12)
    zb = Simulator(build_schedule("zbh1", 4, 1))
    tasks = collective_tasks(zb.program, m, part, 2)
    w, first_i = zb.program.c_kind == 2, (zb.program.c_kind == 1) & (zb.program.c_stage == 0)
    assert np.array_equal(tasks[w], zb.program.c_stage[w] == 0) and tasks[~w & ~first_i].all()
    assert not tasks[first_i].any()     # the first stage's I is empty: its backward runs in W


def test_patch_embedding_stage_agrees_on_nothing():
    """A stage holding only the (replicated) patch embedding runs no TP collective."""
    m = model("tiny_vlm")
    assert m.layers[0].kind is K.PATCH_EMBED
    fwd, bwd = collective_stages(m, [(0, 1), (1, m.n_layers)], 2)
    assert list(fwd) == [False, True] and list(bwd) == [False, True]


def test_agreement_survives_jitter_and_is_charged_once():
    from octopipe.sim.variability import Variability
    m = model("llama3_8b")
    sim, part = chain(m, 2)
    dur = tp_agreement(sim.program, sim.durations, m, part, 2, NV)
    v = Variability(cv=0.3)
    jd = v.apply(sim.program, dur, np.random.default_rng(3))
    plain = v.apply(sim.program, sim.durations, np.random.default_rng(3))
    a, n = agreement_seconds(2, NV), 8
    rf = ReadyFirst("bf")
    assert sim.run(jd, policy=rf).makespan == pytest.approx(sim.run(plain, policy=rf).makespan + n * a, rel=1e-12)
    again = bind(sim.program, part, AnalyticCostModel(tp=2).table(m, FOUR), FOUR)
    assert again.agreement is None


def test_mode_simulate_charges_the_agreement_under_ready_first(tmp_path, capsys):
    """cost.tp=2 with sim.policy=ready_first: each of the 8 x 4 F and B of 1F1B on 4 ranks (every
    stage of tiny_hybrid runs TP collectives both ways) waits one round; strict pays none."""
    import json

    from tests.reliability.cli import run_in_process
    base = ["mode=simulate", "model=tiny_hybrid", "schedule=1f1b", "pp=4", "microbatches=8", "cost.tp=2"]
    spans = {}
    for name, extra in (("none", ["sim.policy=ready_first", "sim.tp_agreement_s=0"]),
                        ("agreed", ["sim.policy=ready_first", "sim.tp_agreement_s=0.5"]),
                        ("strict", ["sim.tp_agreement_s=0.5"]), ("strict0", [])):
        code, err = run_in_process([*base, *extra, f"hydra.run.dir={tmp_path / name}"], capsys)
        assert code == 0, err
        spans[name] = json.loads((tmp_path / name / "summary.json").read_text())["makespan_s"]
    assert spans["strict"] == spans["strict0"]
    assert spans["agreed"] >= spans["none"] + 0.5 * (8 * 2 + 3 * 2)
    assert spans["agreed"] <= spans["none"] + 0.5 * 8 * 2 * 4



def test_profiled_costs_refuse_cost_tp():
    """cost=profiled times whole layers: cost.tp > 1 is refused naming both fields (what
    mode=simulate and mode=execute print as one line, exit 2)."""
    from octopipe.config.cost import ProfiledCost
    from octopipe.cost.profiled import profiled_costs
    from octopipe.errors import ConfigError
    with pytest.raises(ConfigError, match=r"cost\.tp=2 with cost=profiled"):
        profiled_costs(ProfiledCost(tp=2), model("tiny_hybrid"), FOUR)


def test_the_first_stage_agrees_on_w_and_b_not_on_its_empty_i():
    """In this runtime the first stage's input has no gradient: its I computes nothing and its
    whole backward, collectives included, runs in W (or in B, I and W in one pass)."""
    m = model("tiny_hybrid")
    stages = agreement_stages(m, [(0, 4), (4, m.n_layers)], 2)
    assert stages[0] == (True, False, True) and stages[1][:2] == (True, True)
    assert [bool(needs_agreement(k, *stages[0])) for k in range(4)] == [True, False, True, True]
    assert [bool(needs_agreement(k, True, True, False)) for k in range(4)] == [True, True, False, True]
    assert not needs_agreement(3, False, False, False)


def test_under_a_buffer_cap_every_task_pays_a_round():
    """The runtime's TP ranks agree on every task under a buffer cap (the default `plan`
    included): the simulator charges every task then, and RRFP's tasks only without a cap."""
    m = model("llama3_8b")
    costs = AnalyticCostModel(tp=2).table(m, FOUR)
    part = Partition.balanced(costs.work[:, 0], 4)
    sim = Simulator(build_schedule("zbh1", 4, 1), costs, FOUR, part)
    dur = tp_agreement(sim.program, sim.durations, m, part, 2, NV)
    a, tasks = agreement_seconds(2, NV), collective_tasks(sim.program, m, part, 2)
    assert tasks.any() and not tasks.all()      # W past the first stage runs no collective
    assert np.allclose(charged(dur, True).compute - dur.compute, a * tasks, rtol=0, atol=1e-15)
    assert np.allclose(charged(dur, True, every_task=True).compute - dur.compute, a, rtol=0, atol=1e-15)
    uncapped = ReadyFirst("table", None)
    assert sim.run(dur, policy=ReadyFirst("table")).makespan == \
        sim.run(charged(dur, True, every_task=True), policy=uncapped).makespan
    assert sim.run(dur, policy=uncapped).makespan == sim.run(charged(dur, True), policy=uncapped).makespan
    assert sim.run(dur, policy=ReadyFirst("table")).makespan > sim.run(dur, policy=uncapped).makespan
