"""`python -m octopipe.run mode=plan` on a tiny config writes every artifact and the summary keys."""
import json
import subprocess
import sys
from pathlib import Path

from octopipe.plan_io import load_plan
from octopipe.tune.report import report
from tests.reliability.cli import main_in_process

ROOT = Path(__file__).resolve().parents[2]
KEYS = ("speedup_vs_best_baseline", "best_baseline", "efficiency_vs_lower_bound", "tuner_seconds",
        "makespan_s", "throughput_tokens_per_s", "bubble_ratio", "peak_memory_bytes")


def test_mode_plan_cli(tmp_path, capsys):
    out = tmp_path / "run"
    proc = main_in_process(["mode=plan", "model=tiny_hybrid", "pp=2", "microbatches=4", "tuner.time_budget_s=3",
                            f"hydra.run.dir={out}"], capsys)
    assert proc.returncode == 0, proc.stderr
    for name in ("plan.json", "schedule.csv", "trace.json", "timeline.png", "report.md",
                 "history.json", "summary.json"):
        assert (out / name).is_file(), name
    summary = json.loads((out / "summary.json").read_text())
    for k in KEYS:
        assert k in summary, k
    assert summary["mode"] == "plan" and summary["status"] == "ok"
    assert summary["speedup_vs_best_baseline"] >= 1.0
    plan = load_plan(out / "plan.json")
    assert len(plan.partition) == summary["n_stages"]
    assert "OctoPipe" in proc.stdout
    # the suite report reads run directories like this one
    agg = report(tmp_path)["aggregate"]
    assert agg["planned"] == 1


def test_report_rejects_empty_dir(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "octopipe.tune.report", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "no mode=plan summary.json" in proc.stderr


def test_split_plan_resimulates_through_mode_simulate(tmp_path, capsys):
    """A plan that pieces layers names its pieces in plan.json, and mode=simulate prices the same
    pieces when it replays the file: the makespans agree (both runs through the CLI's main)."""
    base = ["model=tiny_hybrid", "pp=4", "microbatches=4"]
    out = tmp_path / "plan"
    # the search stops at its wall-clock cap here; 1 s already finds the split plan
    proc = main_in_process(["mode=plan", *base, "tuner.time_budget_s=1", "tuner.split_share=0.25",
                            f"hydra.run.dir={out}"], capsys)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    plan = load_plan(out / "plan.json")
    if summary["split_layers"]:           # the tuner may still prefer a whole-layer baseline
        assert plan.pieces == \
            {int(k): v for k, v in summary["split_layers"].items()}
    sim = tmp_path / "sim"
    proc = main_in_process(["mode=simulate", *base, f"schedule.file={out / 'plan.json'}", f"hydra.run.dir={sim}"],
                           capsys)
    assert proc.returncode == 0, proc.stderr
    replay = json.loads((sim / "summary.json").read_text())
    assert abs(replay["makespan_s"] - summary["makespan_s"]) <= 1e-9 * summary["makespan_s"]
