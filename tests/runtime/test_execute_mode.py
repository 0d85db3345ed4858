"""mode=execute end to end, and emulated compute against the simulator."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hydra import compose, initialize_config_dir

from octopipe.cluster import Link
from octopipe.config import load, register
from octopipe.config.convert import convert
from octopipe.config.runtime import RuntimeConfig
from octopipe.cost.table import CostTable
from octopipe.errors import ConfigError
from octopipe.io import CONF_DIR
from octopipe.measure.insitu import calibration_partition
from octopipe.measure.measured_vs_simulated import measure_fidelity
from octopipe.model.pieces import split_model
from octopipe.modes.execute import _costs, _plans, check_runtime, model_preset, rank_cores
from octopipe.modes.inputs import Inputs
from octopipe.plan import Plan, plan_model, uniform_partition
from octopipe.plan_io import save_plan
from octopipe.runtime.job import Job
from octopipe.runtime.machine import local_cluster
from octopipe.runtime.pinning import can_pin, core_ids, pin_map
from octopipe.runtime.trace import measured_trace
from octopipe.schedule.action import Action, ActionKind
from octopipe.schedule.library import SCHEDULE_PRESETS, build_schedule
from octopipe.schedule.table import ScheduleTable
from tests.reliability.cli import run_in_process


def inputs(*overrides: str) -> Inputs:
    """The dispatcher's inputs for `python -m octopipe.run mode=execute <overrides>`."""
    register(SCHEDULE_PRESETS)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return Inputs(load(compose("config", overrides=["mode=execute", *overrides])))


def test_mode_execute_runs_a_tiny_preset_and_writes_trace_and_summary(tmp_path, capsys):
    """1F1B and ZB-V side by side on 2 pinned ranks: each predicted from the calibration of its
    own partition (1 and 2 stages per rank), both launched with the ranks on their cores (through
    the CLI's main in this process: `tests/reliability/cli.run_in_process`)."""
    out = tmp_path / "run"
    code, err = run_in_process(
        ["mode=execute", "pp=2", "microbatches=2",
         "runtime.model=tiny_moe", "runtime.iterations=1", "runtime.warmup=1", "runtime.schedules=[1f1b,zbv]",
         "runtime.transport=ordered", "cost=profiled", "cost.repeats=1", "cost.warmup=0",
         f"cost.cache_dir={tmp_path / 'cache'}", f"hydra.run.dir={out}"], capsys)
    assert code == 0, err[-20:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["model"] == "tiny_moe" and summary["grad_check_max_rel_err"] <= 1e-5
    assert (summary["backend"], summary["transport"], summary["device"]) == ("gloo", "ordered", "cpu")
    assert summary["measured_iteration_s"] > 0 and summary["simulated_iteration_s"] > 0
    assert summary["fidelity_error"] >= 0 and set(summary["schedules"]) == {"1f1b", "zbv"}
    assert summary["cost_inputs"] == "calibrated" and summary["simulated_profiled_iteration_s"] > 0
    assert set(summary["calibration"]["observed_stage_s"]["1"]) == {"F", "I", "W", "B"}
    pinned = list(pin_map(2, core_ids())) if can_pin() else None
    assert summary["pinned"] == pinned
    one, two = summary["schedules"]["1f1b"], summary["schedules"]["zbv"]
    assert one["calibration"] == "calibration-1f1b" and two["calibration"] == "calibration-interleaved-x2"
    assert one["pinned"] == two["pinned"] == pinned
    cals = {c["name"]: c for c in summary["calibrations"]}
    assert set(cals) == {"calibration-1f1b", "calibration-interleaved-x2"}
    assert cals["calibration-1f1b"]["partition"] == [[0, 5], [5, 10]]
    assert cals["calibration-interleaved-x2"]["partition"] == [list(p) for p in uniform_partition(10, 4)]
    assert all(c["pinned"] == pinned for c in cals.values())
    assert set(cals["calibration-interleaved-x2"]["observed_stage_s"]["3"]) == {"F", "I", "W", "B"}
    trace = json.loads((out / "trace.json").read_text())["traceEvents"]
    tracks = {e["tid"] for e in trace if e["ph"] == "X" and e.get("cat") in ("F", "B")}
    flows = [e for e in trace if e["ph"] in ("s", "f")]
    assert tracks == {0, 1} and flows and len(flows) % 2 == 0
    rt = one["rank_time"]
    assert rt["messages"] == len(flows) // 2 and rt["transport_us"] > 0
    assert all(0 < r["compute_s"] <= r["span_s"] and 0 <= r["idle_share"] < 1 for r in rt["ranks"])


def test_unknown_runtime_choices_exit_with_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "octopipe.run", "mode=execute", "runtime.dispatch=eager",
                           f"hydra.run.dir={tmp_path}"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "runtime.dispatch='eager'" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("override,field", [("runtime.transport=fast", "runtime.transport='fast'"),
                                            ("runtime.device=tpu", "runtime.device='tpu'"),
                                            ("runtime.backend=nccl", "runtime.backend=nccl")])
def test_bad_or_impossible_links_exit_with_one_line_naming_the_field(tmp_path, capsys, override, field):
    import torch
    if override == "runtime.backend=nccl" and torch.cuda.device_count() >= 2:
        pytest.skip("this machine has GPUs enough for NCCL")
    code, err = run_in_process(["mode=execute", "pp=2", override, f"hydra.run.dir={tmp_path}"], capsys)
    assert code == 2, err[-20:]
    assert len(err) == 1 and field in err[0], err


def test_runtime_pin_chooses_the_cores_or_none_and_rejects_other_values():
    config = lambda pin, compute="real": convert(RuntimeConfig, {"pin": pin, "compute": compute}, "runtime.")
    cores = core_ids()
    expected = tuple(cores[r % len(cores)] for r in range(5)) if can_pin() else None
    assert rank_cores(config("auto"), 5) == expected
    assert rank_cores(config(False), 5) is None
    assert rank_cores(config("auto", "emulated"), 5) is None
    if can_pin():
        assert rank_cores(config(True), 5) == expected
    with pytest.raises(ConfigError, match=r"runtime\.pin='sometimes'"):
        rank_cores(config("sometimes"), 2)


def test_each_plan_is_calibrated_on_its_own_partition_when_every_rank_has_as_many_stages():
    """c stages on each rank: the calibration runs the plan's own partition (uneven too); other
    plans take the even one-stage-per-rank calibration."""
    for name in ("1f1b", "gpipe", "zbh1", "interleaved", "zbv"):
        table = build_schedule(name, 2, 4)
        part = uniform_partition(10, table.n_stages)
        assert calibration_partition(Plan(part, table)) == part, name
    table = build_schedule("zbv", 2, 4)
    uneven = ((0, 1), (1, 5), (5, 8), (8, 10))
    assert calibration_partition(Plan(uneven, table)) == uneven
    three = ScheduleTable(((Action(0, ActionKind.F, 0), Action(2, ActionKind.F, 0), Action(2, ActionKind.B, 0),
                            Action(0, ActionKind.B, 0)), (Action(1, ActionKind.F, 0), Action(1, ActionKind.B, 0))),
                          (0, 1, 0), 1)
    assert calibration_partition(Plan(((0, 2), (2, 6), (6, 10)), three)) == ((0, 5), (5, 10))


def test_emulated_eight_ranks_track_the_simulator():
    """Sleeping actions and real (scaled) transfers: the simulator, fed the same scaled costs
    and the loopback link, predicts the measured iteration within a loose bound on a busy CPU.
    Steps of 20 ms: eight processes on two cores add a per-action delay that a few-ms step
    would turn into most of the error on a loaded runner."""
    n, m = 8, 8
    table = build_schedule("1f1b", n, m)
    costs = CostTable.uniform(n, f=1.0, i=1.0, w=1.0, out_bytes=1e5, kinds=("local-cpu",))
    plan = Plan(uniform_partition(n, n), table)
    cluster = local_cluster(n, Link("loopback", 5e8, 1e-4))
    config = RuntimeConfig(compute="emulated", dispatch="strict", iterations=1, warmup=1, emulate_step_s=0.02)
    c = measure_fidelity(Job(plan, None, config, costs=costs, cluster=cluster))
    assert c.grad_check_max_rel_err is None
    assert c.fidelity_error < 0.35, c.summary()
    trace = measured_trace(c.result.events)
    assert {e["tid"] for e in trace["traceEvents"] if e["ph"] == "X"} == set(range(n))


def test_mode_execute_runs_a_plan_file_whose_meta_pieces_layers(tmp_path, capsys):
    """A plan JSON over tiny_hybrid with its head in 3 pieces and an MLP in 2 (meta pieces):
    mode=execute runs the split model and its gradients pass the check; runtime.pin=false leaves
    the ranks unpinned."""
    model = model_preset("tiny_hybrid")
    counts = {11: 3, 2: 2}
    split = split_model(model, counts)
    table = build_schedule("1f1b", 2, 2)
    plan = Plan(((0, 13), (13, split.n_layers)), table, model.name, "",
                {"pieces": {str(k): v for k, v in counts.items()}})      # cuts inside the head
    save_plan(plan, tmp_path / "plan.json")
    out = tmp_path / "run"
    code, err = run_in_process(
        ["mode=execute", "pp=2", "microbatches=2",
         "runtime.model=tiny_hybrid", f"schedule.file={tmp_path / 'plan.json'}", "runtime.iterations=1",
         "runtime.warmup=0", "runtime.calibrate=false", "runtime.pin=false", "cost=profiled", "cost.repeats=1",
         "cost.warmup=0", f"cost.cache_dir={tmp_path / 'cache'}", f"hydra.run.dir={out}"], capsys)
    assert code == 0, err[-20:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["split_layers"] == {"11": 3, "2": 2}
    assert summary["grad_check_max_rel_err"] <= 1e-5 and summary["simulated_iteration_s"] > 0
    assert summary["pinned"] is None and summary["schedules"]["1f1b"]["pinned"] is None
    assert summary["cost_inputs"] == "profiled" and summary["schedules"]["1f1b"]["calibration"] is None
    saved = json.loads((out / "plan.json").read_text())
    assert saved["meta"]["pieces"] == {"11": 3, "2": 2} and saved["partition"][-1][1] == 15


def test_mode_execute_lets_the_tuner_split_layers_it_then_measures_piece_by_piece(tmp_path):
    """schedule=octopipe under real compute: the tuner may split heavy layers, pricing the pieces
    with cost=profiled; the plan's meta names them and its partition covers the split model."""
    model = model_preset("tiny_hybrid")
    x = inputs("pp=2", "microbatches=2", "seed=0", "schedule=octopipe", "tuner.time_budget_s=3",
               "tuner.ilp=false", "tuner.polish_sims=0", "tuner.split_share=0.05", "tuner.split_layers=force",
               "cost=profiled", "cost.device=cpu", "cost.repeats=1", "cost.warmup=0",
               f"cost.cache_dir={tmp_path / 'cache'}")
    costs, cluster = _costs(x, model)
    (plan,) = _plans(x, model, costs, cluster)
    assert len(list((tmp_path / "cache").glob("*.json"))) > len(set(model.layers))   # pieces measured
    if plan.pieces:
        split = plan_model(model, plan)
        assert split.n_layers == model.n_layers + sum(v - 1 for v in plan.pieces.values())
        assert plan.n_layers == split.n_layers
    else:       # measured times vary: a whole-layer plan (a baseline, or the whole-layer search's) may win
        assert plan.meta["origin"].startswith(("baseline", "tuned over whole layers")), plan.meta
        assert plan.n_layers == model.n_layers


@pytest.mark.parametrize("key,value,message", [("iterations", "three", "runtime.iterations='three': must be an "
                                                                       "integer"),
                                               ("lr", -1, "runtime.lr=-1: out of range"),
                                               ("warmup", -1, "runtime.warmup=-1: out of range"),
                                               ("dispatch", "eager", "runtime.dispatch='eager': choose one of")])
def test_runtime_config_is_converted_once_and_bad_values_name_the_field(key, value, message):
    """The dispatcher's `load` types `runtime.*`: the mode receives a RuntimeConfig."""
    assert check_runtime(inputs().config.runtime) == RuntimeConfig()
    with pytest.raises(ConfigError, match=message.replace(".", r"\.").replace("(", r"\(")):
        inputs(f"runtime.{key}={value}")
