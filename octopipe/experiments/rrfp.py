"""`experiment=rrfp`: strict versus ready-first dispatch under runtime variability (RRFP).

RRFP (arXiv 2605.18750) treats a schedule as a non-binding hint: under jitter, dispatch
the best-ranked ready task. Here the fixed-order baseline is strict 1F1B; the ready-first
variants run 1F1B's row under the `table` and `bf` hints and ZB-H1's row (backward split, W
deferrable) under `bfw`, with no cap on the micro-batches in flight (`experiment.max_inflight`;
the simulator also times each ready-first variant capped at every rank's own row need, the
schedule's own memory). Variability is `octopipe.sim.variability.Variability`: per-action lognormal
jitter at each CV (plus a straggler case) and, for the multimodal workload, micro-batches with
1..images_max images per sample and variable text lengths at every point. RRFP (arXiv 2605.18750;
§3.1) attributes multimodal jitter to input-length variance and gives no distribution; here a
micro-batch's image count drives its vision layers (fixed patches per image: work linear in images)
and the image tokens' share of every language layer's tokens (the projector's tokens precede the
text, `octopipe.model.build`), and its text length the rest (`octopipe.sim.variability.image_share`);
the vision encoder sits on the first stages, as the balanced partition puts it.

Per point (workload, compute, CV, straggler, hint):

- measured: the runtime's iterations, paired with strict's on the same draws (every launch
  draws iteration i from seed (seed, i)); speedup = strict / ready-first per iteration. Emulated:
  one launch each, mean and standard deviation over the iterations (`measured_speedup`,
  `measured_spread`). Real compute: a launch's speed on these shared cores moves by up to a
  third from one launch to the next, more than the effect. So a hint on 1F1B's row (table, bf)
  runs as an A/B launch (`ab_job`, `Job.ab_strict`): strict and ready-first alternate iteration by
  iteration on the same draws, and the pairs of `real_rounds` such launches pool into a mean and
  standard deviation (`ab_speedup`). bfw, on ZB-H1's row, cannot share a launch with strict
  1F1B: strict and it are launched alternately for `real_rounds` rounds (`alternate`, reversed
  every other round), each round's mean paired ratio is one sample, and the point is their median
  with half their interquartile range as the spread (`paired_speedup`). `measured_by` says which;
  `rounds`, `measured_round_speedups` (each launch's or round's mean ratio);
- simulated: the simulator on the same draws (`simulated_speedup`, the prediction of the
  measured run) and over `monte_carlo` further seeds (`simulated_mc_speedup`, `_spread`), and
  with each rank capped at its row's need (`simulated_capped_speedup`); the ready-first run's
  simulated peak activation memory over strict's (`memory_ratio`).

With tensor parallelism (`experiment.tp`) each emulated stage is costed at cost.tp = tp (work
divided, TP collectives timed on the loopback link inside F and I). The runtime and the simulator
follow RRFP's rule (`octopipe.sim.agreement.needs_agreement`, one definition): strict agrees on
nothing; ready-first agrees before each task with TP collectives. The simulator charges each such
task the agreement time per agreed task (`agreement_s`) of a separate calibration run per setup
(ready-first, CV 0, seed + 1), not of the run it predicts; each tp point also records that time in
its own run (`ready_first_agreement_s`), its rounds per task and its microseconds per round.

Both workloads get one pipeline-shape rule (`split_layers`, the planner's split_layers rule of
`octopipe.tune.splitting`, `experiment.split_share`): heavy layers (the LM head by vocabulary, MLPs
by FFN width) are cut into pieces where that lowers the balanced partition's largest stage. With
whole layers (the head in a few pieces) 8 stages are bound by one stage (tiny_hybrid 1.39x the
mean, tiny_vlm 1.44x: two head pieces), which leaves dispatch order little to win; cut, they are
1.14x and 1.20x (tiny_vlm's ViT blocks and attention layers cannot be cut).

Emulated compute sleeps the analytic costs (scaled, `emulate_step_s`; the TP runs at
`tp_emulate_step_s` over `tp_microbatches`, `tp_scaled`) on 8 ranks, and the simulator times
exactly those; real compute runs the layers on 2 ranks (extra work for factors
above 1), and with `tp` > 1 on 2 x tp ranks with each stage split by the TP layers, and the
simulator takes each stage's F/B/I/W times from two calibration launches at CV 0 (strict 1F1B
for F and B, strict ZB-H1 for I and W, scaled per stage by the launches' F ratio:
`calibration_times`), separate from the measured rounds, so no prediction is fitted to the
launches it predicts; a launch's speed state scales all of its stage times together and so
cancels in a simulated ratio.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from octopipe.config.experiment import RrfpExperiment
from octopipe.config.runtime import RuntimeConfig
from octopipe.experiments.rrfp_report import (
    findings,
    fmt,
    plot,
    speedup_error,
    table_md,
)
from octopipe.experiments.rrfp_setup import (
    LINK,
    SEED,
    Level,
    Setup,
    level_config,
    levels,
    policy_config,
    quick,
    schedule_of,
    setup,
    setup_model,
    stage_balance,
    tp_scaled,
)
from octopipe.modes.artifacts import json_artifact, text_artifact
from octopipe.modes.inputs import Inputs
from octopipe.modes.mode_result import Result
from octopipe.progress import track_cases
from octopipe.runtime.dispatch import variability_of
from octopipe.runtime.emulation import emulation
from octopipe.runtime.job import Job
from octopipe.runtime.launch import ExecutionResult, execute
from octopipe.runtime.tensor_parallel import (
    agreement_cost,
    agreement_cost_s,
    tp_exactness,
)
from octopipe.schedule.action import Action, ActionKind
from octopipe.sim.agreement import collective_tasks, with_agreement
from octopipe.sim.durations import Durations, bind
from octopipe.sim.hints import KIND_CODE, row_need
from octopipe.sim.simulator import ReadyFirst, Simulator


def measured_stage_times(res: ExecutionResult, measured: range) -> dict[tuple[int, int], float]:
    """Mean seconds of each (stage, kind code) over the measured iterations of a run."""
    acc: dict[tuple[int, int], list[float]] = {}
    for ev in res.events:
        for e in ev:
            if "action" in e and e["it"] in measured:
                a = Action.parse(e["action"])
                acc.setdefault((a.stage, KIND_CODE[a.kind]), []).append(e["end"] - e["start"])
    return {k: float(np.mean(v)) for k, v in acc.items()}


def calibration_times(one: dict[tuple[int, int], float], zb: dict[tuple[int, int], float]) -> dict:
    """The stage times the simulator takes for real compute: F and B from the strict 1F1B launch,
    I and W from the strict ZB-H1 launch scaled per stage by the two launches' F ratio. Both
    launches run the same F, so that ratio is the launch-to-launch speed change (up to 2x here),
    which would otherwise pass into I and W against F and B; what is left is the split
    backward's own cost."""
    f = KIND_CODE[ActionKind.F]
    return {**{(st, k): v * one[(st, f)] / zb[(st, f)] for (st, k), v in zb.items()}, **one}


def base_durations(s: Setup, schedule: str, times: dict | None) -> tuple[Simulator, Durations]:
    """The simulator of `schedule`'s compute table and its durations without variability:
    the emulation's scaled costs, or the stage times measured at CV 0 (real compute)."""
    job = s.job(schedule, s.config)
    sim = Simulator(job.plan.table.compact().compute_only())
    if times is None:
        return sim, bind(sim.program, job.plan.partition, emulation(job).costs, job.cluster)
    p = sim.program
    dur = sim.uniform(transfer=LINK.latency).durations
    comp = np.array([times[(int(p.c_stage[c]), int(p.c_kind[c]))] for c in range(p.n_compute)])
    return sim, dur.scaled(compute=comp)


def sim_run(s: Setup, config: RuntimeConfig, base: tuple[Simulator, Durations], seed, capped: bool = False,
            agreement_s: float = 0.0):
    """The simulation of `config`'s policy on the draws of `seed` (`capped`: each rank at most
    its row's own need live). With TP ranks under ready_first, `agreement_s` is charged before
    each task with TP collectives (RRFP's rule, `octopipe.sim.agreement.needs_agreement`, which
    `runtime.worker` follows too); strict agrees on nothing."""
    sim, dur = base
    schedule = schedule_of(config.hint if config.dispatch == "ready_first" else None)
    job = s.job(schedule, config)
    var = variability_of(config, job)
    rows = [sim.program.table.compact().compute_only().actions(d) for d in range(sim.program.n_devices)]
    cap = [row_need(r) for r in rows] if capped else config.max_inflight
    policy = "strict" if config.dispatch == "strict" else ReadyFirst(config.hint, cap)
    jd = var.apply(sim.program, dur, np.random.default_rng(seed)) if var.active else dur
    if s.tp > 1 and agreement_s > 0 and config.dispatch == "ready_first":
        jd = with_agreement(jd, collective_tasks(sim.program, s.model, s.plans[schedule].partition, s.tp), agreement_s)
    return sim.run(jd, policy=policy)


def sim_time(s: Setup, config: RuntimeConfig, base: tuple[Simulator, Durations], seed, capped: bool = False,
             agreement_s: float = 0.0) -> float:
    return sim_run(s, config, base, seed, capped, agreement_s).makespan


def agreement_task_s(res: ExecutionResult, measured: Sequence[int]) -> float:
    """Seconds the dispatchers spent on agreement rounds per agreed task, over a run's ranks and
    measured iterations (0 without TP): what the simulator charges before each task with
    collectives. Warm-up iterations are left out, as from every other figure: their first rounds
    also set up the TP groups' all-gather."""
    ev = [e for rank in res.events for e in rank if e.get("agree_tasks") and e["it"] in measured]
    spent = sum(1e-6 * e["agree_us"] * e["agree_rounds"] for e in ev)
    return spent / sum(e["agree_tasks"] for e in ev) if ev else 0.0


def calibrate_agreement(s: Setup, ex: RrfpExperiment) -> float:
    """`agreement_task_s` of a separate calibration run (ready-first, the first TP hint, CV 0,
    another seed), so no predicted run calibrates its own prediction (0 at tp = 1)."""
    if s.tp <= 1:
        return 0.0
    hint = (ex.real_hints if s.compute == "real" else ex.tp_hints)[0]
    job = s.job(schedule_of(hint), policy_config(level_config(s.config, ex, Level(0.0, False)), hint))
    return agreement_task_s(execute(replace(job, seed=SEED + 1)), range(ex.warmup, ex.warmup + ex.iterations))


def ratio_stats(x: list[float]) -> tuple[float, float]:
    return float(np.mean(x)), float(np.std(x, ddof=1)) if len(x) > 1 else 0.0




def launch_order(keys: tuple, r: int) -> tuple:
    """Round `r`'s launch order: `keys` forward in even rounds, reversed in odd ones (ABBA), so a
    drift in machine speed over the rounds biases alternate rounds in opposite directions."""
    return keys if r % 2 == 0 else keys[::-1]


def alternate(jobs: dict, rounds: int, launch: Callable[[Job], ExecutionResult] = execute) -> dict[object, list]:
    """Each of `jobs` launched once per round, `rounds` rounds (`launch_order`): each key's
    results, one per round."""
    out: dict[object, list] = {k: [] for k in jobs}
    for r in range(rounds):
        for k in launch_order(tuple(jobs), r):
            out[k].append(launch(jobs[k]))
    return out


@dataclass(frozen=True)
class Paired:
    """A measured speedup: value, spread, what the spread is over, each round's paired ratio."""

    speedup: float
    spread: float
    spread_of: str
    rounds: tuple[float, ...]


def paired_speedup(strict: list[list[float]], ready: list[list[float]], measured: range) -> Paired:
    """strict / ready-first per measured iteration, the same draws in every launch, round by
    round (`strict[r]`, `ready[r]`: round r's iteration seconds). One round: the mean and the
    standard deviation over the iterations. Several: each round's mean ratio, then the median
    over the rounds, and half the interquartile range across rounds as the spread (the median's
    robust partner), so the spread holds the launch-to-launch noise a single launch cannot show."""
    per = [[s[it] / f[it] for it in measured] for s, f in zip(strict, ready, strict=True)]
    means = tuple(float(np.mean(x)) for x in per)
    if len(per) == 1:
        m, sd = ratio_stats(per[0])
        return Paired(m, sd, "iterations (standard deviation)", means)
    q1, q3 = np.percentile(means, [25, 75])
    return Paired(float(np.median(means)), float(q3 - q1) / 2, "rounds (half the interquartile range)", means)


def ab_job(s: Setup, cfg: RuntimeConfig, hint: str, ex: RrfpExperiment) -> Job:
    """One launch of `hint` on 1F1B's row that runs strict and ready-first alternately
    (`Job.ab_strict`): iteration 2k strict, 2k + 1 ready-first, both on draw k, so the launch's
    speed on shared cores is common to both sides of every pair."""
    c = replace(policy_config(cfg, hint), warmup=2 * ex.warmup, iterations=2 * ex.iterations)
    return replace(s.job("1f1b", c), ab_strict=True)


def ab_iterations(measured: range) -> tuple[list[int], list[int]]:
    """An A/B launch's iteration indices of the measured draws: (strict, ready-first)."""
    return [2 * k for k in measured], [2 * k + 1 for k in measured]


def ab_split(res: ExecutionResult) -> tuple[list[float], list[float]]:
    """An A/B launch's iteration seconds by draw: (strict, ready-first)."""
    return list(res.iteration_s[0::2]), list(res.iteration_s[1::2])


def ab_speedup(results: list[ExecutionResult], measured: range) -> Paired:
    """strict / ready-first per measured draw within each A/B launch, pooled over the rounds: the
    mean and the standard deviation over those pairs (as for an emulated point: the pairing
    within a launch removes the launch's speed, so the pairs of several launches pool); each
    round's mean ratio is kept."""
    per = [[st[k] / rf[k] for k in measured] for st, rf in map(ab_split, results)]
    m, sd = ratio_stats([x for r in per for x in r])
    return Paired(m, sd, "strict/ready-first pairs within each launch, pooled over the rounds (standard deviation)",
                  tuple(float(np.mean(r)) for r in per))


def ab_cpu_ratio(results: list[ExecutionResult], measured: range) -> float:
    """Ready-first's CPU per rank-iteration over strict's inside each A/B launch, median over rounds."""
    strict, ready = ab_iterations(measured)
    return float(np.median([cpu_per_rank_iteration(r, ready) / cpu_per_rank_iteration(r, strict) for r in results]))


def cpu_per_rank_iteration(res: ExecutionResult, measured: Sequence[int]) -> float:
    """A launch's mean CPU seconds per rank and measured iteration (every thread of the rank)."""
    return float(np.mean([e["cpu_s"] for ev in res.events for e in ev if "cpu_s" in e and e["it"] in measured]))


def cpu_ratio(strict: list[ExecutionResult], ready: list[ExecutionResult], measured: range) -> float:
    """Ready-first's CPU per rank-iteration over strict's, launch pair by launch pair, median over
    the rounds: on cores shared by more processes than cores, CPU time becomes wall time, which
    a simulator of one device per rank does not see."""
    return float(np.median([cpu_per_rank_iteration(f, measured) / cpu_per_rank_iteration(s, measured)
                            for s, f in zip(strict, ready, strict=True)]))


def tp_extras(s: Setup, results: list[ExecutionResult], measured: Sequence[int], ag: float) -> dict:
    """A tp point's agreement figures: the calibrated time, and the predicted runs' own (mean
    over the rounds' ready-first launches)."""
    costs = [agreement_cost(r.events, measured) or {} for r in results]

    def mean(key: str) -> float | None:
        got = [c[key] for c in costs if c.get(key) is not None]
        return float(np.mean(got)) if got else None
    return {"agreement_s": ag, "ready_first_agreement_s": float(np.mean([agreement_task_s(r, measured)
                                                                         for r in results])),
            "rounds_per_task": mean("rounds_per_task"), "us_per_round": mean("us_per_round"),
            "emulate_step_s": s.config.emulate_step_s if s.compute == "emulated" else None}


def run_setup(s: Setup, ex: RrfpExperiment) -> tuple[list[dict], list[float], list[float]]:
    """Every point of one setup: the runs, their simulation, the dispatch and agreement costs seen
    (an emulated TP setup runs `tp_scaled`). Emulated: strict then each hint, one launch each. Real
    compute: `ex.real_rounds` rounds of strict and each hint launched alternately (`alternate`):
    a launch's speed on shared cores moves more than the effect measured."""
    s = tp_scaled(s, ex)
    measured = range(ex.warmup, ex.warmup + ex.iterations)
    times = None
    if s.compute == "real":
        cal = [execute(s.job(sch, policy_config(s.config, None))) for sch in ("1f1b", "zbh1")]
        times = calibration_times(measured_stage_times(cal[0], measured), measured_stage_times(cal[1], measured))
    bases = {sch: base_durations(s, sch, times) for sch in ("1f1b", "zbh1")}
    ag = calibrate_agreement(s, ex)
    hints = ex.real_hints if s.compute == "real" else ex.tp_hints if s.tp > 1 else ex.hints
    rounds = ex.real_rounds if s.compute == "real" else 1
    points, dispatch_us, agree_us = [], [], []
    for level in levels(ex, s.compute, s.tp):
        cfg = level_config(s.config, ex, level)
        strict_cfg = policy_config(cfg, None)
        ab = {h for h in hints if s.compute == "real" and schedule_of(h) == "1f1b"}
        jobs = {None: s.job("1f1b", strict_cfg)} | {h: ab_job(s, cfg, h, ex) if h in ab else
                                                    s.job(schedule_of(h), policy_config(cfg, h)) for h in hints}
        runs = alternate(jobs, rounds)
        strict = [r.iteration_s for r in runs[None]]
        sim_strict = {it: sim_time(s, strict_cfg, bases["1f1b"], (SEED, it)) for it in measured}
        mc_seeds = [(1000 + k, 0) for k in range(ex.monte_carlo)]
        mc_strict = [sim_time(s, strict_cfg, bases["1f1b"], sd) for sd in mc_seeds]
        for hint in hints:
            rf_cfg = policy_config(cfg, hint)
            for res in runs[hint]:
                dispatch_us += [e["dispatch_us"] for ev in res.events for e in ev if e.get("dispatch_us")]
                agree_us += [e["agree_us"] for ev in res.events for e in ev if e.get("agree_us")]
            meas = ab_speedup(runs[hint], measured) if hint in ab else \
                paired_speedup(strict, [r.iteration_s for r in runs[hint]], measured)
            base = bases[schedule_of(hint)]
            same = [sim_strict[it] / sim_time(s, rf_cfg, base, (SEED, it), agreement_s=ag) for it in measured]
            mc = [a / sim_time(s, rf_cfg, base, sd, agreement_s=ag) for a, sd in zip(mc_strict, mc_seeds)]
            capped = [a / sim_time(s, rf_cfg, base, sd, True, ag) for a, sd in zip(mc_strict, mc_seeds)]
            mem = sim_run(s, rf_cfg, base, mc_seeds[0]).peak_activation_memory.max() / \
                max(sim_run(s, strict_cfg, bases["1f1b"], mc_seeds[0]).peak_activation_memory.max(), 1e-30)
            mc_mean, mc_sd = ratio_stats(mc)
            extra = {"stage_balance": stage_balance(s)}
            if s.config.images_max > 1 and s.compute == "emulated":
                plain = replace(cfg, seq_len_cv=0.0, images_max=0)
                nd = [sim_time(s, policy_config(plain, None), bases["1f1b"], sd)
                      / sim_time(s, policy_config(plain, hint), base, sd) for sd in mc_seeds]
                extra["simulated_mc_no_data_speedup"] = float(np.mean(nd))
            if s.compute == "real":
                extra["measured_cpu_ratio"] = ab_cpu_ratio(runs[hint], measured) if hint in ab else \
                    cpu_ratio(runs[None], runs[hint], measured)
                extra["measured_by"] = "A/B within each launch" if hint in ab else "alternating launches"
            if s.tp > 1:
                extra |= tp_extras(s, runs[hint], ab_iterations(measured)[1] if hint in ab else measured, ag)
            points.append({"workload": s.workload, "compute": s.compute, "tp": s.tp, "jitter_cv": level.cv,
                           "straggler": level.straggler, "hint": hint, "measured_speedup": meas.speedup,
                           "measured_spread": meas.spread, "measured_spread_of": meas.spread_of,
                           "rounds": rounds, "measured_round_speedups": list(meas.rounds),
                           "simulated_speedup": float(np.mean(same)),
                           "simulated_mc_speedup": mc_mean, "simulated_mc_spread": mc_sd,
                           "simulated_capped_speedup": float(np.mean(capped)), "memory_ratio": float(mem),
                           "ranks": s.plans["1f1b"].table.n_devices,
                           "microbatches": s.plans["1f1b"].table.n_microbatches, **extra})
    return points, dispatch_us, agree_us














def run(inputs: Inputs) -> Result:
    t0 = time.perf_counter()
    ex: RrfpExperiment = inputs.config.experiment
    if ex.quick:
        ex = quick(ex)
    setups = [(w, c, 1) for c, n in (("emulated", ex.emulated_ranks), ("real", ex.real_ranks)) if n > 0
              for w in ("language", "multimodal")]
    if ex.tp > 1 and ex.emulated_ranks >= 2 * ex.tp:
        setups += [(w, "emulated", ex.tp) for w in ("language", "multimodal")]
    if ex.tp > 1 and ex.real_ranks >= 2 and ex.real_ranks * ex.tp <= 4 and not ex.quick:
        # real compute with TP layers: real_ranks pipeline ranks x tp (runtime/tensor_parallel.py)
        setups += [(w, "real", ex.tp) for w in ("language", "multimodal")]
    points: list[dict] = []
    dispatch_us: list[float] = []
    pipeline_agree_us: list[float] = []
    setup_s: list[dict] = []
    for w, c, tp in track_cases(setups, "rrfp", lambda wct: f"{wct[0]} {wct[1]} tp={wct[2]}"):
        t = time.perf_counter()
        got, costs, agreed = run_setup(setup(ex, w, c, tp), ex)
        setup_s.append({"workload": w, "compute": c, "tp": tp, "wall_s": time.perf_counter() - t})
        points += got
        dispatch_us += costs
        pipeline_agree_us += agreed
    tp_errs: dict[str, float] = {}
    agreement_us = None
    if ex.tp_check:
        tp_errs = tp_exactness([setup_model(ex, w) for w in ("language", "multimodal")], 2)
        agreement_us = 1e6 * agreement_cost_s(2)
    emulated = [p for p in points if p["compute"] == "emulated"]
    summary = {
        "points": points,
        "max_sim_vs_measured_speedup_error": max(map(speedup_error, emulated)) if emulated else None,
        "max_sim_vs_measured_speedup_error_real": max((speedup_error(p) for p in points if p["compute"] == "real"),
                                                      default=None),
        "tp_max_rel_err": max(tp_errs.values()) if tp_errs else None, "agreement_cost_us": agreement_us,
        "tp_layer_errors": tp_errs,
        "pipeline_agreement_cost_us": float(np.mean(pipeline_agree_us)) if pipeline_agree_us else None,
        "dispatch_cost_us": float(np.mean(dispatch_us)) if dispatch_us else None,
        "wall_s": time.perf_counter() - t0, "setup_wall_s": setup_s}
    lines = findings(points)
    report_md = "\n".join([
        "# experiment=rrfp: ready-first versus strict 1F1B under variability", "",
        "Speedup = strict 1F1B iteration / ready-first iteration, per measured iteration on the same "
        "draws. Emulated points: one launch each, the mean over the iterations with their standard "
        f"deviation as the spread. Real-compute points ({ex.real_rounds} rounds; a launch's speed on these shared "
        "cores moves by up to a third, more than the effect): table and bf run as A/B launches, strict and "
        "ready-first alternating iteration by iteration on the same draws, their pairs pooled over the rounds "
        "(mean, standard deviation); bfw (ZB-H1's row) and strict 1F1B are launched alternately (the order "
        "reversed every other round), each round's mean paired ratio one sample, the point their median and "
        "its spread half their interquartile range. "
        "`simulated` = the simulator on those same draws; `simulated MC` = over further seeds. table and bf "
        "rank 1F1B's row, bfw ZB-H1's.", "",
        "## Does the paper's pattern hold?", "", *lines, "",
        f"Largest |measured - simulated| / simulated speedup, emulated compute: "
        f"{fmt(summary['max_sim_vs_measured_speedup_error'], '.3f')}; real compute: "
        f"{fmt(summary['max_sim_vs_measured_speedup_error_real'], '.3f')}. Dispatcher cost per decision: "
        f"{fmt(summary['dispatch_cost_us'], '.1f')} us.", "",
        f"Tensor parallelism, tp = 2 on gloo: largest relative error of any layer's output and "
        f"gradients against the whole layer {fmt(summary['tp_max_rel_err'], '.2g')} over {len(tp_errs)} layers; "
        f"one agreement (scalar all-gather) {fmt(agreement_us, '.0f')} us alone, "
        f"{fmt(summary['pipeline_agreement_cost_us'], '.0f')} us per round inside the tp = 2 pipelines, whose "
        "emulated TP ranks sleep their stage's modelled time at cost.tp = 2 (half the work plus the TP collectives, "
        "`octopipe.cost.collectives`, timed on the loopback link), scaled so the mean stage F lasts "
        f"`tp_emulate_step_s` = {1e3 * ex.tp_emulate_step_s:g} ms over {ex.tp_microbatches} micro-batches, so that a "
        "round is a smaller share of a task (the findings above give it), nearer RRFP's GPUs (well under 1%), than "
        "at the tp = 1 step. Under ready-first they agree before each "
        "task with TP collectives, under strict on nothing (RRFP's rule, `octopipe.sim.agreement.needs_agreement`, "
        "shared by the runtime and the simulator). The simulator times both: the collectives inside F and I, and "
        "before each agreed task the agreement time per agreed task of a separate calibration run (ready-first, "
        "CV 0, another seed), never of the run it predicts.", "",
        "Wall time by setup: " + ", ".join(f"{x['workload']} {x['compute']} tp {x['tp']} {x['wall_s']:.0f} s"
                                           for x in setup_s) + f"; in all {summary['wall_s']:.0f} s.", "",
        "## Points", "", table_md(points), "", "![speedup against CV](speedup_vs_cv.png)", ""])
    report = (f"experiment=rrfp: {len(points)} points in {summary['wall_s']:.0f} s", *lines,
              f"max sim-vs-measured speedup error (emulated): {summary['max_sim_vs_measured_speedup_error']}",
              f"dispatch cost per decision: {summary['dispatch_cost_us']} us")
    return Result(summary, report, (text_artifact("report.md", report_md), json_artifact("points.json", points),
                                    plot(points)))
