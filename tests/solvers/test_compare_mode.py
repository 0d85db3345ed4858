"""`mode=solvers` and `python -m solvers.compare` on the small instance set."""
from __future__ import annotations

import json

import pytest

from solvers.backend import SolverConfig
from solvers.compare import run_experiment
from tests.reliability.cli import main_in_process


def test_small_comparison_agrees_and_writes_artifacts(tmp_path):
    doc = run_experiment(tmp_path, SolverConfig("cbc", 20.0), small=True, log=lambda *_: None)
    for name in ("results.csv", "solve_time.png", "summary.json"):
        assert (tmp_path / name).stat().st_size > 0
    rows = doc["rows"]
    exact = [r for r in rows if r["problem"] == "fixed" and r["proven_optimal"]]
    assert {r["method"] for r in exact} >= {"dp", "brute", "ilp_cbc", "ilp_plain_cbc"}
    for r in exact:
        assert r["gap"] == pytest.approx(0.0, abs=1e-7), r
    assert all(r["gap"] >= -1e-9 for r in rows if r["gap"] is not None)


def test_mode_solvers_cli(tmp_path, capsys):
    out = tmp_path / "run"
    proc = main_in_process(["mode=solvers", "solver.compare.small=true", "solver.compare.stages=[2]",
                            f"hydra.run.dir={out}"], capsys)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["mode"] == "solvers" and summary["n_instances"] >= 1
    assert "ilp_cbc" in summary["methods"] and (out / "solve_time.png").exists()


def test_progress_hears_every_case_in_order_and_the_end(tmp_path):
    seen: list[tuple[str, float, float]] = []
    doc = run_experiment(tmp_path, SolverConfig("cbc", 20.0), small=True,
                         overrides={"stages": [2]}, log=lambda *_: None,
                         progress=lambda case, done, total: seen.append((case, done, total)))
    labels = list(dict.fromkeys(r["instance"] for r in doc["rows"]))
    total = float(sum(r["size"] for r in {r["instance"]: r for r in doc["rows"]}.values()))
    assert [case for case, _, _ in seen] == labels + ["done"]
    assert seen[-1] == ("done", total, total)
    dones = [done for _, done, _ in seen]
    assert dones == sorted(dones) and dones[0] == 0.0
