"""Same inputs and seed => the same plan at any machine load: the tuner's budgets count work
(estimates, ILP nodes, simulations), not seconds, so a run beside two CPU-bound processes
writes byte-identical schedule.csv and plan.json."""
import json
import subprocess
import sys
from pathlib import Path

from tests.reliability.cli import main_in_process

ROOT = Path(__file__).resolve().parents[2]
ARGS = ["mode=plan", "model=tiny_hybrid", "pp=4", "microbatches=8", "seed=3",
        "tuner.max_evaluations=600", "tuner.polish_sims=12"]
BUSY = "while True: pass"


def _plan(out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "octopipe.run", *ARGS, f"hydra.run.dir={out}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_same_plan_idle_and_beside_two_cpu_bound_processes(tmp_path, capsys):
    """The idle run through the CLI's main in this process, the busy one a fresh process beside
    the two hogs."""
    idle = main_in_process([*ARGS, f"hydra.run.dir={tmp_path / 'idle'}"], capsys)
    assert idle.returncode == 0, idle.stderr
    hogs = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(2)]
    try:
        busy = _plan(tmp_path / "busy")
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    assert busy.returncode == 0, busy.stderr
    for run in ("idle", "busy"):
        search = json.loads((tmp_path / run / "summary.json").read_text())["search"]
        assert search["stopped_by"] in ("converged", "iterations"), search
    for name in ("schedule.csv", "plan.json"):
        assert (tmp_path / "idle" / name).read_bytes() == (tmp_path / "busy" / name).read_bytes(), name
