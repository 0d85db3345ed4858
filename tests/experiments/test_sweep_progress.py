"""The multirun progress line: the sweep's size from its parameters and the command line, and
one line per job with the time left."""
from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

from omegaconf import OmegaConf
from rich.console import Console

from octopipe.experiments.sweep_progress import SweepProgress, clock, sweep_size

ROOT = Path(__file__).resolve().parents[2]


def test_sweep_size_is_the_product_of_the_swept_values():
    params = {"model": "a,b,c", "pp": "4,8", "microbatches": "32"}
    assert sweep_size(params, ["experiment=suite"]) == 6
    assert sweep_size(params, ["pp=4,8,16,32"]) == 12          # the command line replaces a key
    assert sweep_size(params, ["model=a", "seed=1,2"]) == 4
    assert sweep_size({}, ["pp=range(2,6)"]) == 4


def test_clock():
    assert (clock(5), clock(125), clock(3723)) == ("0:05", "2:05", "1:02:03")


def test_each_job_prints_its_place_and_the_time_left():
    out = io.StringIO()
    cb = SweepProgress(Console(file=out, width=200))
    run = OmegaConf.create({"hydra": {"sweeper": {"params": {"pp": "2,4,8"}},
                                      "overrides": {"task": ["model=tiny_hybrid"]}}})
    cb.on_multirun_start(run)
    for pp in (2, 4, 8):
        cb.on_job_start(OmegaConf.create({"hydra": {"overrides": {"task": [f"pp={pp}"]}}}))
    lines = out.getvalue().splitlines()
    assert lines[0] == "sweep: 3 jobs"
    assert lines[1].startswith("sweep job 1/3 (pp=2)") and "left" not in lines[1]
    assert lines[3].startswith("sweep job 3/3 (pp=8)") and lines[3].endswith("left")


def test_a_multirun_reports_its_jobs(tmp_path):
    p = subprocess.run([sys.executable, "-m", "octopipe.run", "-m", "mode=inspect", "model=tiny_hybrid",
                        "pp=2,4", "+hydra.callbacks.progress._target_="
                        "octopipe.experiments.sweep_progress.SweepProgress", f"hydra.sweep.dir={tmp_path}"],
                       cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr
    assert "sweep: 2 jobs" in p.stdout and "sweep job 2/2 (mode=inspect model=tiny_hybrid pp=4)" in p.stdout
