"""`experiment=robust`: does planning for variability pay, and where?

For a multimodal and a hybrid workload, at each variability point (compute jitter CV, and a
straggler case), two plans are made on the same costs with the same search budget: the nominal
plan (`tuner.objective=nominal`) and the robust plan (`tuner.objective=mean` under that point's
variability, dispatched as `experiment.dispatch`). Both run with that dispatch (the nominal plan
under the `table` hint, the robust plan under the hint its scoring chose) and are evaluated on
held-out seeds, which the tuner never saw: in the simulator (`experiment.heldout` draws), and
for the tiny workloads also on the emulated runtime at `experiment.pp` ranks, beside the
simulator's prediction of the same launches (as the costs say, and with each action lengthened
by the runtime's measured host time per action). The data variability of the multimodal workload
(images per sample, text length) is in every point, as in experiment=rrfp.

Heavy layers are cut into pieces up front (experiment=rrfp's rule, `split_share`), so both plans
cut the same layers and see the same variability model. The emulated workloads' costs are scaled
so a rank's mean F per micro-batch is `emulate_step_s`, and every launch runs those costs
unscaled, which is what the simulator times.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from octopipe.cluster import Cluster
from octopipe.cluster_presets import cluster_from_config
from octopipe.config.cluster import ClusterConfig
from octopipe.config.cost import AnalyticCost
from octopipe.config.experiment import RobustExperiment
from octopipe.config.presets import preset
from octopipe.config.runtime import RuntimeConfig
from octopipe.config.tuner import TunerConfig
from octopipe.cost.analytic import analytic_costs
from octopipe.cost.table import CostTable
from octopipe.experiments.robust_report import gain_plot, report_md
from octopipe.experiments.rrfp_setup import LINK, split_layers
from octopipe.measure.rank_time import host_seconds
from octopipe.model.build import build_model
from octopipe.model.spec import ModelSpec
from octopipe.modes.artifacts import json_artifact, text_artifact
from octopipe.modes.inputs import Inputs
from octopipe.modes.mode_result import Result
from octopipe.plan import Plan
from octopipe.runtime.dispatch import variability_for
from octopipe.runtime.job import Job
from octopipe.runtime.launch import execute
from octopipe.runtime.machine import local_cluster
from octopipe.sim.simulator import Simulator
from octopipe.tune import TuneOptions, tune
from octopipe.tune.candidate import Problem
from octopipe.tune.robust import Robust

SEED = 0


@dataclass(frozen=True)
class Workload:
    """One workload on one evaluation: the model (heavy layers cut), its costs and cluster."""

    name: str                  # multimodal | hybrid
    evaluated: str             # simulated | emulated
    model: ModelSpec
    costs: CostTable
    cluster: Cluster
    seq_len_cv: float
    images_max: int


@dataclass(frozen=True)
class Level:
    cv: float
    straggler: bool


def workloads(ex: RobustExperiment) -> list[Workload]:
    out = []
    for name, sim_preset, emu_preset in (("multimodal", ex.multimodal, ex.multimodal_emulated),
                                         ("hybrid", ex.hybrid, ex.hybrid_emulated)):
        mm = name == "multimodal"
        data = (ex.multimodal_seq_len_cv if mm else 0.0, ex.multimodal_images_max if mm else 0)
        cluster = cluster_from_config(ClusterConfig(), pp=ex.pp, tp=1)
        model, costs = _split(sim_preset, cluster, ex)
        out.append(Workload(name, "simulated", model, costs, cluster, *data))
        if ex.emulated_iterations > 0:
            loop = local_cluster(ex.pp, LINK)
            model, costs = _split(emu_preset, loop, ex)
            scale = ex.emulate_step_s * ex.pp / float(costs.f[:, 0].sum())
            costs = replace(costs, f=costs.f * scale, i=costs.i * scale, w=costs.w * scale, _prefix={})
            out.append(Workload(name, "emulated", model, costs, loop, *data))
    return out


def _split(name: str, cluster: Cluster, ex: RobustExperiment) -> tuple[ModelSpec, CostTable]:
    cost = AnalyticCost()

    def costs_of(m: ModelSpec) -> CostTable:
        return analytic_costs(cost, m, cluster)
    model = split_layers(build_model(preset("model", name)), costs_of, ex.pp, ex.split_share)
    return model, costs_of(model)


def levels(ex: RobustExperiment) -> list[Level]:
    return [Level(cv, False) for cv in ex.jitter_cvs] + [Level(ex.straggler_cv, True)]


def level_config(ex: RobustExperiment, w: Workload, level: Level) -> RuntimeConfig:
    """The point's runtime configuration: its variability (what the tuner, the held-out
    simulations and the emulated launches all draw from) and the emulation's settings."""
    return RuntimeConfig(compute="emulated", dispatch=ex.dispatch, iterations=max(1, ex.emulated_iterations),
                         warmup=ex.emulated_warmup, max_message_bytes=16384, timeout_s=600.0, stall_s=60.0,
                         pin="false", calibrate=False, grad_check=False, jitter_cv=level.cv,
                         straggler_prob=ex.straggler_prob if level.straggler else 0.0,
                         straggler_factor=ex.straggler_factor, seq_len_cv=w.seq_len_cv, images_max=w.images_max)


def variability(ex: RobustExperiment, w: Workload, level: Level):
    """The point's variability bound to a plan's stages (the image share follows its partition)."""
    config = level_config(ex, w, level)
    return lambda plan: variability_for(config, w.model, w.costs, plan.partition)


def plans(ex: RobustExperiment, w: Workload, level: Level, seed: int) -> dict[str, tuple[Plan, str]]:
    """The nominal and the robust plan, each with the hint it runs under."""
    base = TunerConfig(max_evaluations=ex.max_evaluations, split_layers="off", dispatch=ex.dispatch,
                       samples=ex.samples)
    out = {}
    for key, objective in (("nominal", "nominal"), ("robust", "mean")):
        res = tune(w.costs, w.cluster, ex.pp, ex.microbatches,
                   TuneOptions(replace(base, objective=objective), seed=seed, model=w.model.name,
                               variability=variability(ex, w, level)))
        out[key] = (res.plan, res.plan.meta.get("robust", {}).get("hint", "table"))
    return out


def simulated(ex: RobustExperiment, w: Workload, level: Level, plan: Plan, hint: str) -> np.ndarray:
    """Makespans on the held-out draws."""
    rb = Robust("mean", 0.9, ex.heldout, ex.dispatch, variability(ex, w, level), seed=ex.heldout_seed)
    return rb.spans(Problem.build(w.costs, w.cluster, ex.pp, ex.microbatches), plan, hint)


@dataclass(frozen=True, eq=False)
class Launch:
    """One emulated launch's measured iteration times beside the simulator's (see `emulated`)."""

    measured: np.ndarray
    simulated: np.ndarray
    hosted: np.ndarray
    host_s: float


def emulated(ex: RobustExperiment, w: Workload, level: Level, plan: Plan, hint: str) -> Launch:
    """One emulated launch: its measured iteration times, and the simulator's on the same draws
    (the runtime draws iteration i from seed (experiment seed, i)), `simulated` as the costs
    say, `hosted` with every action lengthened by the host time the runtime spent inside each
    (`host_seconds`: posting its message, the call; a figure of this machine's runtime, read
    from the launch's own actions, not fitted to its iteration times)."""
    per_stage = float(w.costs.f[:, 0].sum()) / plan.table.n_stages      # so the emulation runs the costs as they are
    config = replace(level_config(ex, w, level), hint=hint, emulate_step_s=per_stage)
    res = execute(Job(plan, w.model, config, seed=SEED, costs=w.costs, cluster=w.cluster))
    measured = range(ex.emulated_warmup, ex.emulated_warmup + ex.emulated_iterations)
    problem = Problem.build(w.costs, w.cluster, ex.pp, ex.microbatches)
    rb = Robust("mean", 0.9, 1, ex.dispatch, variability(ex, w, level))
    sim = Simulator(plan, problem.costs, problem.cluster)
    host = host_seconds(res.events, sim.program, {it: rb.drawn(sim, plan, (SEED, it)) for it in measured}) or 0.0

    def spans(host_s: float) -> np.ndarray:
        return np.array([rb.span_of(sim, plan, hint, (SEED, it), host_s) for it in measured])
    return Launch(np.array([res.iteration_s[it] for it in measured]), spans(0.0), spans(host), host)


def run_point(ex: RobustExperiment, w: Workload, level: Level, seed: int, progress) -> dict:
    progress(f"robust: {w.name} ({w.evaluated}), CV {level.cv}{' + stragglers' if level.straggler else ''}")
    made = plans(ex, w, level, seed)
    point = {"workload": w.model.name, "kind": w.name, "jitter_cv": level.cv, "straggler": level.straggler,
             "evaluated": w.evaluated, "dispatch": ex.dispatch,
             "nominal_hint": made["nominal"][1], "robust_hint": made["robust"][1],
             "same_plan": made["nominal"][0].table.rows == made["robust"][0].table.rows
             and made["nominal"][0].partition == made["robust"][0].partition}
    for key, (plan, hint) in made.items():
        if w.evaluated == "simulated":
            spans = simulated(ex, w, level, plan, hint)
        else:
            got = emulated(ex, w, level, plan, hint)
            spans = got.measured
            point[f"{key}_simulated_mean_s"] = float(got.simulated.mean())
            point[f"{key}_simulated_hosted_mean_s"] = float(got.hosted.mean())
            point[f"{key}_host_us"] = 1e6 * got.host_s
        point[f"{key}_mean_s"] = float(spans.mean())
        point[f"{key}_p90_s"] = float(np.quantile(spans, 0.9))
    point["gain"] = point["nominal_mean_s"] / point["robust_mean_s"]
    if w.evaluated == "emulated":
        for name, col in (("sim_vs_emulated_err", "simulated"), ("hosted_vs_emulated_err", "simulated_hosted")):
            point[name] = max(abs(point[f"{k}_{col}_mean_s"] / point[f"{k}_mean_s"] - 1) for k in ("nominal", "robust"))
    return point


def run(inputs: Inputs) -> Result:
    ex = inputs.config.experiment
    assert isinstance(ex, RobustExperiment)
    points = [run_point(ex, w, level, inputs.config.seed, inputs.progress)
              for w in workloads(ex) for level in levels(ex)]
    md = report_md(points, ex)
    return Result({"experiment": "robust", "points": points}, (md,),
                  (text_artifact("report.md", md), gain_plot(points), json_artifact("points.json", points)))
