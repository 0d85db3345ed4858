"""mode=train under signals: a SIGKILLed launcher takes its ranks with it (no checkpoint after
it, no temp dir), Ctrl-C while ranks start ends every process with one line and no traceback
(a second Ctrl-C too), and a stopped rank is the one the watchdog names."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.reliability.cli import ROOT
from tests.reliability.procs import descendants, forked_ranks, gone, wait_until

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

TRAIN = ["-m", "octopipe.run", "mode=train", "model=module", "model.factory=examples/tiny_gpt.py:build",
         "model.seq_len=16", "model.micro_batch_size=2", "train.microbatches=4", "train.steps=3000",
         "train.plan=schedule", "cost=profiled", "cost.repeats=1", "cost.warmup=0", "cost.cache_dir="]


def start(tmp_path, *extra: str) -> subprocess.Popen:
    tmp = tmp_path / "tmp"
    tmp.mkdir(exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp)}
    # Ctrl-C at its default, as a terminal starts it: a process started with SIGINT ignored keeps
    # ignoring it (an earlier test in this process may have left it ignored, and children inherit that)
    return subprocess.Popen([sys.executable, *TRAIN, *extra, f"hydra.run.dir={tmp_path / 'run'}"], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def steps_saved(tmp_path) -> list[str]:
    ckpt = tmp_path / "run" / "checkpoints"
    return sorted(p.name for p in ckpt.glob("step_*") if not p.name.endswith(".tmp")) if ckpt.is_dir() else []


def test_sigkill_of_the_train_launcher_ends_its_ranks(tmp_path):
    proc = start(tmp_path, "train.checkpoint_every=2")
    if not wait_until(lambda: len(steps_saved(tmp_path)) >= 1, timeout=240):
        proc.kill()
        pytest.fail(f"training never saved a checkpoint: {proc.communicate()}")
    below = descendants(proc.pid)
    proc.kill()
    proc.communicate(timeout=30)
    assert wait_until(lambda: all(gone(p) for p in below), timeout=10), [p for p in below if not gone(p)]
    saved = steps_saved(tmp_path)
    time.sleep(2.0)
    assert steps_saved(tmp_path) == saved                      # nothing trains on
    left = lambda: sorted(p.name for p in (tmp_path / "tmp").glob("octopipe-*")
                          if not p.name.startswith(f"octopipe-{os.getuid()}"))   # the compiled-kernel cache stays
    assert wait_until(lambda: not left(), timeout=10), left()


@pytest.mark.parametrize("twice", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["once", "twice"])
def test_ctrl_c_while_ranks_start_is_one_line_and_leaves_nothing(tmp_path, twice):
    proc = start(tmp_path)
    # the moment the launcher starts its forkserver: the forkserver preloads torch, ranks follow
    if not wait_until(lambda: len(descendants(proc.pid)) >= 1, timeout=240, every=0.01):
        proc.kill()
        pytest.fail(f"the launcher never got to starting ranks: {proc.communicate()}")
    wait_until(lambda: len(descendants(proc.pid)) >= 2, timeout=30, every=0.01)
    below = descendants(proc.pid)
    os.killpg(proc.pid, signal.SIGINT)
    if twice:
        time.sleep(0.3)
        os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and err.strip().splitlines()[-1:] == ["octopipe: interrupted"], err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    below += forked_ranks(proc.pid)
    assert wait_until(lambda: all(gone(p) for p in below), timeout=10), [p for p in below if not gone(p)]


@pytest.mark.slow
def test_a_stopped_rank_is_the_one_the_watchdog_names(tmp_path):
    proc = start(tmp_path, "runtime.stall_s=4")
    if not wait_until(lambda: len(forked_ranks(proc.pid)) >= 2, timeout=240):
        proc.kill()
        pytest.fail(f"the ranks never started: {proc.communicate()}")
    time.sleep(4.0)                                  # into training
    ranks = forked_ranks(proc.pid)
    os.kill(ranks[1], signal.SIGSTOP)
    try:
        _, err = proc.communicate(timeout=120)
    finally:
        if not gone(ranks[1]):
            os.kill(ranks[1], signal.SIGCONT)
    head = err.strip().splitlines()[0]
    assert proc.returncode == 2 and "rank 1 stopped responding" in head and "SIGSTOP" in head, err
