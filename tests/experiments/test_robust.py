"""experiment=robust without processes: the points' figures, their arithmetic and the findings."""
from __future__ import annotations

import numpy as np
import pytest

from octopipe.config.experiment import RobustExperiment
from octopipe.experiments import robust
from octopipe.experiments.robust_report import findings, report_md

EX = RobustExperiment(name="robust", pp=4, microbatches=4, jitter_cvs=(0.0, 0.5), heldout=6, samples=4,
                      max_evaluations=200, emulated_iterations=0)


@pytest.fixture(scope="module")
def hybrid():
    return next(w for w in robust.workloads(EX) if w.name == "hybrid")


def test_workloads_cut_heavy_layers_and_carry_their_data_variability():
    ws = robust.workloads(EX)
    assert {(w.name, w.evaluated) for w in ws} == {("multimodal", "simulated"), ("hybrid", "simulated")}
    mm = next(w for w in ws if w.name == "multimodal")
    assert mm.images_max == EX.multimodal_images_max and mm.seq_len_cv == EX.multimodal_seq_len_cv
    assert all(w.costs.n_layers == w.model.n_layers for w in ws)


def test_a_point_holds_what_the_summary_promises(hybrid):
    level = robust.Level(0.5, False)
    p = robust.run_point(EX, hybrid, level, 0, lambda _: None)
    for key in ("workload", "jitter_cv", "straggler", "evaluated", "nominal_mean_s", "robust_mean_s",
                "nominal_p90_s", "robust_p90_s", "gain"):
        assert key in p
    assert p["evaluated"] == "simulated" and p["jitter_cv"] == 0.5 and p["straggler"] is False
    assert p["gain"] == pytest.approx(p["nominal_mean_s"] / p["robust_mean_s"])
    assert p["nominal_p90_s"] >= p["nominal_mean_s"] * 0.8
    # held-out draws: the robust plan's figures come again on the same seeds
    made = robust.plans(EX, hybrid, level, 0)
    again = robust.simulated(EX, hybrid, level, *made["robust"])
    assert float(np.mean(again)) == pytest.approx(p["robust_mean_s"], rel=1e-12)


def test_without_variability_both_plans_run_alike(hybrid):
    p = robust.run_point(EX, hybrid, robust.Level(0.0, False), 0, lambda _: None)
    assert p["nominal_p90_s"] == pytest.approx(p["nominal_mean_s"], rel=1e-12)   # no variability at all
    assert p["gain"] >= 0.99


def test_findings_count_the_points_that_meet_the_target():
    pts = [{"evaluated": "simulated", "jitter_cv": cv, "straggler": False, "gain": g, "same_plan": False}
           for cv, g in ((0.0, 0.995), (0.3, 1.06), (0.5, 1.02))]
    text = "\n".join(findings(pts))
    assert "1 of 2 points reach the 5% target" in text and "at most 0.5% longer" in text
    assert "| workload |" in report_md([{**p, "workload": "w", "nominal_mean_s": 1.0, "robust_mean_s": 1.0,
                                         "nominal_p90_s": 1.0, "robust_p90_s": 1.0, "nominal_hint": "table",
                                         "robust_hint": "bfw"} for p in pts], EX)


def test_findings_give_both_predictions_of_the_emulated_launches():
    pts = [{"evaluated": "emulated", "jitter_cv": 0.0, "straggler": False, "gain": 1.0, "same_plan": True,
            "sim_vs_emulated_err": 0.041, "hosted_vs_emulated_err": 0.012, "nominal_host_us": 150.0,
            "robust_host_us": 190.0}]
    text = "\n".join(findings(pts))
    assert "within 4.1% from the costs alone, and within 1.2% told the runtime's host time" in text
    assert "(150-190 us" in text
