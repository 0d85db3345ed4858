"""mode=simulate, mode=compare and experiment=tabular through the CLI: its main in this process
(`run`), and one refusal as a process (`_run`) for the one-line stderr of a real run."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.reliability.cli import main_in_process

ROOT = Path(__file__).resolve().parents[2]


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "octopipe.run", *args, f"hydra.run.dir={tmp_path}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=240)


@pytest.fixture
def run(capsys):
    """`_run` through the CLI's main in this process (no interpreter and imports per run)."""
    return lambda tmp_path, *args: main_in_process([*args, f"hydra.run.dir={tmp_path}"], capsys)


def test_simulate_writes_its_artifacts(tmp_path, run):
    p = run(tmp_path, "mode=simulate", "model=tiny_hybrid", "schedule=1f1b", "pp=4", "microbatches=8",
             "sim.jitter_cv=0.1", "sim.monte_carlo=4")
    assert p.returncode == 0, p.stderr
    s = json.loads((tmp_path / "summary.json").read_text())
    for key in ("makespan_s", "bubble_ratio", "peak_memory_bytes", "throughput_tokens_per_s", "mfu"):
        assert s[key] > 0
    assert s["monte_carlo"]["runs"] == 4 and s["monte_carlo"]["makespan_std_s"] > 0
    trace = json.loads((tmp_path / "trace.json").read_text())
    assert any(e["ph"] == "s" for e in trace["traceEvents"])
    assert (tmp_path / "timeline.png").read_bytes()[:4] == b"\x89PNG"
    plan = tmp_path / "plan.json"
    again = run(tmp_path / "again", "mode=simulate", "model=tiny_hybrid", f"schedule.file={plan}", "pp=4")
    assert again.returncode == 0, again.stderr
    s2 = json.loads((tmp_path / "again" / "summary.json").read_text())
    assert s2["schedule"] == "1f1b" and s2["n_actions"] == s["n_actions"]


def test_simulate_rejects_ready_first_with_rendezvous_in_one_line(tmp_path):
    p = _run(tmp_path, "mode=simulate", "model=tiny_hybrid", "pp=4", "microbatches=8",
             "sim.policy=ready_first", "sim.semantics=rendezvous")
    assert p.returncode == 2
    assert p.stderr.strip().count("\n") == 0 and "sim.semantics=eager" in p.stderr


def test_compare_ranks_schedules_at_three_levels(tmp_path, run):
    p = run(tmp_path, "mode=compare", "model=tiny_hybrid", "pp=4", "microbatches=8", "sim.seeds=2")
    assert p.returncode == 0, p.stderr
    s = json.loads((tmp_path / "summary.json").read_text())
    rows = {r["schedule"]: r for r in s["schedules"]}
    assert {"gpipe", "1f1b", "chimera", "zbh1"} <= set(rows)
    assert rows["gpipe"]["formula_bubble_ratio"] == pytest.approx(3 / 11)
    assert rows["gpipe"]["idealized_bubble_ratio"] == pytest.approx(3 / 11)
    assert rows["1f1b"]["peak_activation_memory_bytes"] < rows["gpipe"]["peak_activation_memory_bytes"]
    assert all(r["rank_sim"] >= 1 for r in rows.values())
    assert {p["schedule"] for p in s["policies"]} == set(rows)
    assert (tmp_path / "report.md").exists() and (tmp_path / "trace.json").exists()


@pytest.mark.slow
def test_tabular_experiment_reports_the_findings(tmp_path, run):
    p = run(tmp_path, "experiment=tabular", "experiment.stages=[8]", "experiment.microbatches=[8,64]")
    assert p.returncode == 0, p.stderr
    f = json.loads((tmp_path / "summary.json").read_text())["findings"]
    assert f["gpipe_vs_1f1b"]["pairs_where_1f1b_has_lower_activation_peak"] == f["gpipe_vs_1f1b"]["pairs"]
    chim = f["chimera_vs_best_of_gpipe_1f1b"]["per_point"]
    assert chim["S8_B8_fast_nw_mid_cp"] > 0 > chim["S8_B64_slow_nw_fast_cp"]
    hanayo = f["hanayo_vs_chimera"]
    assert hanayo["hanayo_c4"]["fast_nw_mid_cp"] > 0 > hanayo["hanayo_c4"]["slow_nw_fast_cp"]
    assert (tmp_path / "report.md").exists()


def test_tabular_experiment_without_the_hanayo_point_of_chimera(tmp_path, run):
    """Stages that leave out the Hanayo point's Chimera run are reported, not a KeyError."""
    p = run(tmp_path, "experiment=tabular", "experiment.stages=[4]", "experiment.microbatches=[8]")
    assert p.returncode == 0, p.stderr
    assert "Chimera was not run at this point" in (tmp_path / "report.md").read_text()
