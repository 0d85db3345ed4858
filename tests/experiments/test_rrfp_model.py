"""experiment=rrfp's models without processes: tp setups costed with their collectives, the
agreement the simulator charges, the multimodal data model."""
import numpy as np
import pytest

from octopipe.config.cost import AnalyticCost
from octopipe.config.experiment import RrfpExperiment
from octopipe.cost.analytic import analytic_costs
from octopipe.experiments import rrfp
from octopipe.measure.machine import local_cluster
from octopipe.runtime.dispatch import variability_of

EX = rrfp.quick(RrfpExperiment(name="rrfp"))


def test_tp_setup_times_its_collectives():
    s = rrfp.setup(EX, "language", "emulated", 2)
    n = s.plans["1f1b"].table.n_devices
    plain = analytic_costs(AnalyticCost(tp=2, tp_collectives=False), s.model, local_cluster(n, rrfp.LINK))
    assert s.config.tp == 2 and n == EX.emulated_ranks // 2
    assert (s.costs.f >= plain.f).all() and s.costs.f.sum() > plain.f.sum()
    assert np.array_equal(s.costs.w, plain.w)


def test_agreement_slows_both_policies_and_rrfp_rule_spares_strict():
    s = rrfp.setup(EX, "language", "emulated", 2)
    cfg = rrfp.level_config(s.config, EX, rrfp.Level(0.0, False))
    strict, rf = rrfp.policy_config(cfg, None), rrfp.policy_config(cfg, "bfw")
    b1, bz = (rrfp.base_durations(s, sch, None) for sch in ("1f1b", "zbh1"))
    a = 1e-3
    for config, base in ((strict, b1), (rf, bz)):
        assert rrfp.sim_time(s, config, base, (0, 0), agreement_s=a) > rrfp.sim_time(s, config, base, (0, 0))
    # RRFP's rule: ready-first agrees before F and I only (not W), so less than before every task
    assert rrfp.sim_time(s, rf, bz, (0, 0)) < rrfp.rrfp_time(s, rf, bz, (0, 0), a) \
        < rrfp.sim_time(s, rf, bz, (0, 0), agreement_s=a)
    one = rrfp.setup(EX, "language", "emulated", 1)
    b = rrfp.base_durations(one, "1f1b", None)
    c1 = rrfp.policy_config(rrfp.level_config(one.config, EX, rrfp.Level(0.0, False)), None)
    assert rrfp.sim_time(one, c1, b, (0, 0), agreement_s=a) == rrfp.sim_time(one, c1, b, (0, 0))


def test_multimodal_images_reach_the_language_stages():
    s = rrfp.setup(EX, "multimodal", "emulated", 1)
    var = variability_of(s.config, s.job("1f1b", s.config))
    share = var.vision_share
    assert share[0] > 0.5 and share[0] == max(share)   # the vision encoder opens the pipeline
    assert 0.0 < min(share[:-1]) and share[-1] < share[0]
    assert var.images_max == EX.multimodal_images_max and var.seq_len_cv == EX.multimodal_seq_len_cv
