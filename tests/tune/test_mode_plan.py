"""`python -m octopipe.run mode=plan` on a tiny config writes every artifact and the summary keys."""
import json
import subprocess
import sys
from pathlib import Path

from octopipe.schedule.plan_io import load_plan
from octopipe.tune.report import report

ROOT = Path(__file__).resolve().parents[2]
KEYS = ("speedup_vs_best_baseline", "best_baseline", "efficiency_vs_lower_bound", "tuner_seconds",
        "makespan_s", "throughput_tokens_per_s", "bubble_ratio", "peak_memory_bytes")


def test_mode_plan_cli(tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "octopipe.run", "mode=plan", "model=tiny_hybrid", "pp=2",
           "microbatches=4", "tuner.time_budget_s=3", f"hydra.run.dir={out}"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
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


def test_sharded_plan_resimulates_through_mode_simulate(tmp_path):
    """A plan that shards layers names its pieces in plan.json, and mode=simulate prices the same
    pieces when it replays the file: the makespans agree."""
    base = ["model=tiny_hybrid", "pp=4", "microbatches=4"]
    out = tmp_path / "plan"
    proc = subprocess.run([sys.executable, "-m", "octopipe.run", "mode=plan", *base, "tuner.time_budget_s=3",
                           "tuner.shard_share=0.25", f"hydra.run.dir={out}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    plan = load_plan(out / "plan.json")
    if summary["shard_layers"]:           # the tuner may still prefer a whole-layer baseline
        assert plan.shards == \
            {int(k): v for k, v in summary["shard_layers"].items()}
    sim = tmp_path / "sim"
    proc = subprocess.run([sys.executable, "-m", "octopipe.run", "mode=simulate", *base,
                           f"schedule.file={out / 'plan.json'}", f"hydra.run.dir={sim}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    replay = json.loads((sim / "summary.json").read_text())
    assert abs(replay["makespan_s"] - summary["makespan_s"]) <= 1e-9 * summary["makespan_s"]
