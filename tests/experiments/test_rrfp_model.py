"""experiment=rrfp's models without processes: tp setups costed with their collectives, the
agreement the simulator charges, the multimodal data model."""
from dataclasses import replace

import numpy as np

from octopipe.config.cost import AnalyticCost
from octopipe.config.experiment import RrfpExperiment
from octopipe.cost.analytic import analytic_costs
from octopipe.experiments import rrfp, rrfp_setup
from octopipe.runtime.dispatch import variability_of
from octopipe.runtime.machine import local_cluster
from octopipe.sim.agreement import collective_tasks, with_agreement
from octopipe.sim.simulator import ReadyFirst
from octopipe.tune.splitting import model_splitter

EX = rrfp_setup.quick(RrfpExperiment(name="rrfp"))


def test_tp_setup_times_its_collectives():
    s = rrfp_setup.setup(EX, "language", "emulated", 2)
    n = s.plans["1f1b"].table.n_devices
    plain = analytic_costs(AnalyticCost(tp=2, tp_collectives=False), s.model, local_cluster(n, rrfp_setup.LINK))
    assert s.config.tp == 2 and n == EX.emulated_ranks // 2
    assert (s.costs.f >= plain.f).all() and s.costs.f.sum() > plain.f.sum()
    assert np.array_equal(s.costs.w, plain.w)


def test_agreement_follows_rrfps_rule_strict_pays_nothing():
    """Ready-first pays `agreement_s` before the tasks with TP collectives only (exactly
    `collective_tasks`); strict agrees on nothing; tp = 1 pays nothing."""
    s = rrfp_setup.setup(EX, "language", "emulated", 2)
    cfg = rrfp_setup.level_config(s.config, EX, rrfp_setup.Level(0.0, False))
    strict, rf = rrfp_setup.policy_config(cfg, None), rrfp_setup.policy_config(cfg, "bfw")
    b1, bz = (rrfp.base_durations(s, sch, None) for sch in ("1f1b", "zbh1"))
    a = 1e-3
    assert rrfp.sim_time(s, strict, b1, (0, 0), agreement_s=a) == rrfp.sim_time(s, strict, b1, (0, 0))
    tasks = collective_tasks(bz[0].program, s.model, s.plans["zbh1"].partition, 2)
    kinds, stages = bz[0].program.c_kind, bz[0].program.c_stage
    # tiny_hybrid: every F; I and W by the first stage's split (no input gradient: its I is empty,
    # its whole backward runs in W)
    assert tasks[kinds == 0].all()
    for k in (1, 2):
        assert np.array_equal(tasks[kinds == k], (stages[kinds == k] == 0) == (k == 2))
    every = with_agreement(bz[1], np.ones_like(tasks), a)
    rule = rrfp.sim_time(s, rf, bz, (0, 0), agreement_s=a)
    assert rrfp.sim_time(s, rf, bz, (0, 0)) < rule < bz[0].run(every, policy=ReadyFirst("bfw", None)).makespan
    one = rrfp_setup.setup(EX, "language", "emulated", 1)
    b = rrfp.base_durations(one, "zbh1", None)
    c1 = rrfp_setup.policy_config(rrfp_setup.level_config(one.config, EX, rrfp_setup.Level(0.0, False)), "bfw")
    assert rrfp.sim_time(one, c1, b, (0, 0), agreement_s=a) == rrfp.sim_time(one, c1, b, (0, 0))


def test_multimodal_images_reach_the_language_stages():
    s = rrfp_setup.setup(EX, "multimodal", "emulated", 1)
    var = variability_of(s.config, s.job("1f1b", s.config))
    share = var.vision_share
    assert share[0] > 0.5 and share[0] == max(share)   # the vision encoder opens the pipeline
    assert min(share[:-1]) > 0.0 and share[-1] < share[0]
    assert var.images_max == EX.multimodal_images_max and var.seq_len_cv == EX.multimodal_seq_len_cv


def test_both_workloads_split_heavy_layers_by_one_rule():
    """At 8 stages both workloads are cut by the planner's split_layers rule: the chosen split's
    largest stage is within 1% of the best option's and no option with fewer pieces is; the cut
    pipelines are better balanced than whole layers allow; 2 real ranks keep whole layers."""
    ex = RrfpExperiment(name="rrfp")
    for w in ("language", "multimodal"):
        s = rrfp_setup.setup(ex, w, "emulated")
        whole = rrfp_setup.setup_model(ex, w)
        n = s.plans["1f1b"].table.n_devices

        def costs_of(m):
            return analytic_costs(AnalyticCost(), m, local_cluster(n, rrfp_setup.LINK))
        splitter = model_splitter(whole, costs_of)
        work = rrfp_setup.layer_work(costs_of(whole))
        opts = splitter.options(work, n, ex.split_share)
        bound = {sum(c.values()) - len(c): rrfp_setup.stage_max(rrfp_setup.layer_work(splitter.costs_for(c)), n)
                 for c in opts}
        added = s.model.n_layers - whole.n_layers          # pieces beyond the whole layers
        assert added > 0 and bound[added] <= min(bound.values()) * 1.01
        assert all(b > min(bound.values()) * 1.01 for k, b in bound.items() if k < added)
        t = rrfp_setup.layer_work(s.costs)
        stages = np.array([t[lo:hi].sum() for lo, hi in s.plans["1f1b"].partition.ranges])
        assert stages.max() / stages.mean() < 1.25 < bound[0] / (work.sum() / n)
        assert rrfp_setup.setup(ex, w, "real").model.n_layers == whole.n_layers


def test_emulated_tp_setups_run_at_their_own_step_and_microbatches():
    """`tp_scaled`: an emulated TP setup sleeps `tp_emulate_step_s` per mean stage F over
    `tp_microbatches`, on the same partition; tp = 1 and real setups are left as they are."""
    ex = replace(EX, tp_emulate_step_s=0.02, tp_microbatches=6)
    s = rrfp_setup.setup(ex, "language", "emulated", 2)
    t = rrfp_setup.tp_scaled(s, ex)
    assert t.config.emulate_step_s == 0.02 and s.config.emulate_step_s == ex.emulate_step_s
    assert {p.table.n_microbatches for p in t.plans.values()} == {6}
    assert all(t.plans[k].partition == s.plans[k].partition for k in s.plans)
    one = rrfp_setup.setup(ex, "language", "emulated", 1)
    assert rrfp_setup.tp_scaled(one, ex) is one
