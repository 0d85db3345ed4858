"""Runtime variability, hints and buffer caps against the simulator (gloo, few small runs)."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hydra import compose, initialize_config_dir

from octopipe.cluster import Link
from octopipe.config import load, register
from octopipe.config.runtime import RuntimeConfig
from octopipe.cost.table import CostTable
from octopipe.errors import ConfigError, ScheduleError
from octopipe.experiments import rrfp
from octopipe.io import CONF_DIR
from octopipe.modes.execute import measure
from octopipe.modes.inputs import Inputs
from octopipe.plan import Plan, uniform_partition
from octopipe.runtime.dispatch import variability_of
from octopipe.runtime.emulation import emulation
from octopipe.runtime.job import Job
from octopipe.runtime.launch import execute
from octopipe.runtime.machine import local_cluster
from octopipe.runtime.stage import max_rel_err, reference_run
from octopipe.schedule.library import SCHEDULE_PRESETS, build_schedule
from octopipe.schedule.table import ScheduleTable
from octopipe.sim.durations import bind
from octopipe.sim.simulator import ReadyFirst, Simulator
from tests.runtime import tiny


def emulated_job(table: ScheduleTable, **settings) -> Job:
    n = table.n_stages
    costs = CostTable.uniform(n, f=1.0, i=1.0, w=1.0, out_bytes=1e4, act_bytes=10.0, kinds=("local-cpu",))
    config = RuntimeConfig(**{"compute": "emulated", "iterations": 2, "warmup": 0, "timeout_s": 120.0,
                              "emulate_step_s": 0.02, **settings})
    return Job(Plan(uniform_partition(n, n), table), None, config, seed=3, costs=costs,
               cluster=local_cluster(table.n_devices, Link("loopback", 5e8, 1e-4)))


def predicted(job: Job):
    """The simulator's program and the emulated durations of `job`."""
    sim = Simulator(job.plan.table.compact().compute_only())
    return sim, bind(sim.program, job.plan.partition, emulation(job).costs, job.cluster)


def assert_actions_last_their_draws(job: Job, res, draw_of: dict[int, int]) -> None:
    """Every action of iteration `it` lasts at least what the simulator's jittered durations of
    draw `draw_of[it]` say: a sleep never ends early, at any load, while another draw would make
    about half of the actions shorter than this one's. (An upper bound would be a wall-clock
    assertion: a sleep's overshoot grows with the machine's load.)"""
    sim, dur = predicted(job)
    var = variability_of(job.config, job)
    for it, draw in draw_of.items():
        jd = var.apply(sim.program, dur, np.random.default_rng((job.seed, draw)))
        want = {str(sim.program.action(c)): jd.compute[c] for c in range(sim.program.n_compute)}
        got = {e["action"]: e["end"] - e["start"] for ev in res.events for e in ev
               if e["it"] == it and "action" in e}
        assert set(got) == set(want)
        for a, t in got.items():
            assert want[a] <= t + 1e-4, (it, a, t, want[a])


def test_runtime_draws_the_simulators_jitter_and_reports_dispatch_cost():
    """Same seed, same draws: every measured action lasts what the simulator's jittered
    durations say (sleep overshoot aside), sends are delayed, the bf hint and an in-flight cap
    run, and each rank reports its cost per dispatch decision."""
    job = emulated_job(build_schedule("1f1b", 2, 4), dispatch="ready_first", hint="bf", max_inflight=2,
                       jitter_cv=0.5, straggler_prob=0.2, straggler_factor=2.0, transfer_delay=0.5)
    res = execute(job)
    assert_actions_last_their_draws(job, res, {0: 0, 1: 1})
    costs = [e["dispatch_us"] for ev in res.events for e in ev if "dispatch_us" in e]
    assert costs and all(c > 0 for c in costs)     # how fast is the benchmark's business, not a test's


def test_runtime_dispatch_order_is_the_simulators_under_bfw_and_a_cap():
    """On margins far above scheduling noise the runtime runs each row in the order the
    simulator's ready-first predicts, for the bfw hint and for gpipe under a one-slot cap."""
    from octopipe.schedule.action import Action, ActionKind
    F, I, W = ActionKind.F, ActionKind.I, ActionKind.W
    rows = [[Action(0, F, 0), Action(0, F, 1), Action(0, I, 0), Action(0, W, 0), Action(0, I, 1), Action(0, W, 1)],
            [Action(1, F, 0), Action(1, I, 0), Action(1, W, 0), Action(1, F, 1), Action(1, I, 1), Action(1, W, 1)]]
    cases = [(ScheduleTable.from_rows(rows, (0, 1), 2), dict(hint="bfw")),
             (build_schedule("gpipe", 2, 3), dict(hint="bf", max_inflight=1))]
    for table, settings in cases:
        job = emulated_job(table, dispatch="ready_first", iterations=1, emulate_step_s=0.03, **settings)
        res = execute(job)
        sim, dur = predicted(job)
        policy = ReadyFirst(settings["hint"], settings.get("max_inflight"))
        want = [[str(a) for a in row] for row in sim.run(dur, policy=policy).executed_table().compute_only().rows]
        got = [[e["action"] for e in sorted((e for e in ev if "action" in e), key=lambda e: e["start"])]
               for ev in res.events]
        assert got == [[a for a in row if a] for row in want], settings


def test_an_ab_job_runs_strict_then_ready_first_on_each_draw():
    """`Job.ab_strict`: iteration 2k runs strict and 2k + 1 ready-first, both on draw k (every
    action lasts what the simulator's jittered durations for draw k say), and only the
    ready-first iterations make dispatch decisions. Refused without ready_first or with an odd
    iteration count."""
    job = replace(emulated_job(build_schedule("1f1b", 2, 3), dispatch="ready_first", hint="bf", iterations=4,
                               jitter_cv=0.5), ab_strict=True)
    res = execute(job)
    assert len(res.iteration_s) == 4
    assert_actions_last_their_draws(job, res, {it: it // 2 for it in range(4)})
    decided = {e["it"] for ev in res.events for e in ev if e.get("dispatch_us")}
    assert decided == {1, 3}
    with pytest.raises(ScheduleError, match="ab_strict"):
        execute(replace(emulated_job(build_schedule("1f1b", 2, 2), dispatch="strict"), ab_strict=True))
    with pytest.raises(ScheduleError, match="ab_strict"):
        execute(replace(emulated_job(build_schedule("1f1b", 2, 2), iterations=3), ab_strict=True))


def test_a_cap_that_could_deadlock_is_refused_before_any_rank_starts():
    chimera = build_schedule("chimera", 2, 2)
    with pytest.raises(ScheduleError, match=r"runtime\.max_inflight=1 could deadlock.*>= 2"):
        execute(emulated_job(chimera, dispatch="ready_first", max_inflight=1))
    with pytest.raises(ScheduleError, match=r"runtime\.memory_cap"):
        execute(emulated_job(build_schedule("1f1b", 2, 2), dispatch="ready_first", memory_cap=1.0))
    with pytest.raises(ScheduleError, match="dispatch=ready_first"):
        execute(emulated_job(build_schedule("1f1b", 2, 2), dispatch="strict", max_inflight=2))
    with pytest.raises(ScheduleError, match=r"runtime\.slow_rank=5"):
        execute(emulated_job(build_schedule("1f1b", 2, 2), slow_rank=5))


def test_mode_execute_reports_measured_against_simulated_under_variability():
    job = emulated_job(build_schedule("zbh1", 2, 4), dispatch="ready_first", hint="bfw", max_inflight=2,
                       jitter_cv=0.3, iterations=2, warmup=1)
    model = tiny.dense(1)
    costs = CostTable.uniform(model.n_layers, f=1.0, i=1.0, w=1.0, out_bytes=1e4, kinds=("local-cpu",))
    job = replace(job, model=model, costs=costs,
                  plan=Plan(uniform_partition(model.n_layers, 2), job.plan.table))
    res = measure(job, [job.plan], lambda m: job.costs)
    arb = res.summary["arbitration"]
    assert arb["hint"] == "bfw" and arb["jitter_cv"] == 0.3
    # the prediction's accuracy under load is measured by the fidelity benchmark, not asserted here
    assert arb["simulated_iteration_s"] > 0 and arb["measured_iteration_s"] > 0 and arb["error"] >= 0, arb


def test_jittered_real_compute_does_extra_work_and_keeps_the_gradients():
    model = tiny.vlm()
    table = build_schedule("zbh1", 2, 4)
    part = uniform_partition(model.n_layers, 2)
    job = tiny.job(model, part, table, dispatch="ready_first", hint="bfw", max_inflight=2,
                   jitter_cv=0.3, straggler_prob=0.3, straggler_factor=3.0, images_max=4, timeout_s=120.0)
    got = execute(job)
    ref = reference_run(model, table.n_microbatches)
    assert max_rel_err(got.grads, ref.grads) <= 1e-5


def test_experiment_rrfp_quick_reports_every_summary_key(tmp_path):
    """The quick grid on 2 emulated ranks: the summary keys the issue lists, a point per
    (workload, CV, hint), the simulated speedup beside the measured one, the report and figure."""
    register(SCHEDULE_PRESETS)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = load(compose("config", overrides=["experiment=rrfp", "experiment.quick=true",
                                                "experiment.emulated_ranks=2", "experiment.real_ranks=0",
                                                "experiment.tp_check=false"]))
    res = rrfp.run(Inputs(cfg))
    s = res.summary
    assert {"points", "max_sim_vs_measured_speedup_error", "tp_max_rel_err", "agreement_cost_us",
            "dispatch_cost_us"} <= set(s)
    assert {(p["workload"], p["jitter_cv"], p["hint"]) for p in s["points"]} == \
        {(w, c, "bfw") for w in ("language", "multimodal") for c in (0.0, 0.5)}
    for p in s["points"]:
        assert {"workload", "compute", "tp", "jitter_cv", "straggler", "hint", "measured_speedup",
                "measured_spread", "simulated_speedup"} <= set(p)
        assert p["measured_speedup"] > 0 and p["simulated_speedup"] > 0
    assert s["dispatch_cost_us"] > 0 and s["max_sim_vs_measured_speedup_error"] >= 0
    for art in res.artifacts:
        art.write(tmp_path / art.name)
    assert "pattern" in (tmp_path / "report.md").read_text()
    assert (tmp_path / "speedup_vs_cv.png").stat().st_size > 1000


@pytest.mark.parametrize("key,value,message", [("hint", "fb", "runtime.hint='fb': choose one of"),
                                               ("jitter_cv", 4, "runtime.jitter_cv=4: out of range"),
                                               ("straggler_prob", 1.5, "runtime.straggler_prob=1.5: out of range"),
                                               ("straggler_factor", 0.5, "runtime.straggler_factor=0.5: out of range"),
                                               ("max_inflight", 0, "runtime.max_inflight=0: must be an integer >= 1")])
def test_bad_arbitration_settings_name_the_field(key, value, message):
    register(SCHEDULE_PRESETS)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None), \
            pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        load(compose("config", overrides=["mode=execute", f"runtime.{key}={value}"]))
