"""Run directories are never shared and a failed run leaves no results."""
from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time

import pytest

from octopipe.errors import ConfigError
from octopipe.io import RUN_MARKER, claim_run_dir, write_text
from octopipe.plan import Plan, uniform_partition
from octopipe.plan_io import save_plan
from octopipe.schedule.library import build_schedule
from tests.reliability.cli import ROOT, results_in, run_in_process


def test_concurrent_claims_of_one_directory_never_share_it(tmp_path):
    wanted = tmp_path / "runs" / "12-00-00_plan"
    got: list = []
    start = threading.Barrier(8)

    def claim():
        start.wait()
        got.append(claim_run_dir(wanted, "x", given=False))

    threads = [threading.Thread(target=claim) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(got)) == 8 and wanted in got
    assert all((p / RUN_MARKER).is_file() for p in got)
    assert sorted(p.name for p in got)[1:] == sorted(f"12-00-00_plan-{n}" for n in range(2, 9))


def test_a_directory_holding_another_run_gets_a_fresh_subdirectory(tmp_path):
    (tmp_path / "summary.json").write_text("{}")
    assert claim_run_dir(tmp_path, "10-00-00_plan", given=True) == tmp_path / "10-00-00_plan"
    assert claim_run_dir(tmp_path, "10-00-00_plan", given=True) == tmp_path / "10-00-00_plan-2"
    with pytest.raises(ConfigError, match="empty"):
        claim_run_dir("  ", "x", given=True)


@pytest.mark.slow      # the claim itself is tested above, deterministically
def test_two_runs_started_together_get_their_own_directories(tmp_path):
    """Two `mode=inspect` runs started in the same second (the default run directory names the
    second): each prints its own directory, which holds its own overrides and results."""
    env = {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    seqs = (16, 32)
    procs = [subprocess.Popen([sys.executable, "-m", "octopipe.run", "mode=inspect", "model=tiny_hybrid",
                               f"model.seq_len={s}"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for s in seqs]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    dirs = [next(ln.split(": ", 1)[1] for ln in o.splitlines() if ln.startswith("results: ")) for o, _ in outs]
    assert len(set(dirs)) == 2
    for d, s in zip(dirs, seqs):
        overrides = (tmp_path / d / ".hydra" / "overrides.yaml").read_text()
        assert f"model.seq_len={s}" in overrides
        assert json.loads((tmp_path / d / "summary.json").read_text())["mode"] == "inspect"


def test_a_used_run_dir_is_not_mixed_and_a_failed_run_leaves_no_stale_summary(tmp_path, capsys):
    run = tmp_path / "run"
    code, _ = run_in_process(["mode=inspect", "model=tiny_hybrid", f"hydra.run.dir={run}"], capsys)
    assert code == 0 and (run / "summary.json").is_file()
    first = (run / "summary.json").read_text()
    code, lines = run_in_process(["mode=inspect", "model=tiny_hybrid", "seed=abc", f"hydra.run.dir={run}"],
                                 capsys)
    assert code == 2 and len(lines) == 1
    assert (run / "summary.json").read_text() == first          # the first run's results untouched
    fresh = [p for p in run.iterdir() if p.is_dir() and p.name != ".hydra"]
    assert len(fresh) == 1 and results_in(fresh[0]) == []      # the failed run's own directory is clean
    assert "seed=abc" in (fresh[0] / ".hydra" / "overrides.yaml").read_text()


def test_every_artifact_has_the_same_permissions(tmp_path):
    """plan.json was written 0600 (a mkstemp) beside 0644 artifacts."""
    table = build_schedule("1f1b", 2, 2)
    save_plan(Plan(uniform_partition(4, 2), table), tmp_path / "plan.json")
    write_text(tmp_path / "other.txt", "x")
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.iterdir()}
    assert len(set(modes.values())) == 1, modes


def test_ctrl_c_inside_a_string_exec_still_exits_130(tmp_path):
    """Ctrl-C landing inside a string `exec` (as when a dataclass is built), caught by the CLI:
    CPython would end a `python -m` process by SIGINT (-2) unless the CLI clears its mark."""
    (tmp_path / "ctrl_c_in_exec.py").write_text(
        "import os, signal\n"
        "from octopipe.run import stops_cleanly\n"
        "with stops_cleanly():\n"
        "    exec('os.kill(os.getpid(), signal.SIGINT)\\nwhile True: pass', {'os': os, 'signal': signal})\n")
    proc = subprocess.run([sys.executable, "-m", "ctrl_c_in_exec"], cwd=tmp_path, capture_output=True, text=True,
                          env={"PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}", "OMP_NUM_THREADS": "1"},
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL), timeout=120)
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr.strip().splitlines() == ["octopipe: interrupted"], proc.stderr


def test_ctrl_c_prints_one_line_and_exits_130(tmp_path):
    """A `mode=plan` interrupted mid-search: 'interrupted', exit 130, no traceback, no results."""
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "octopipe.run", "pp=4", "microbatches=8",
                             "tuner.time_budget_s=60", f"hydra.run.dir={run}"], cwd=ROOT,
                            env={"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 60
    while not (run / ".hydra").is_dir() and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert err.strip().splitlines() == ["octopipe: interrupted"], err
    assert results_in(run) == []

