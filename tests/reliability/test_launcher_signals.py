"""SIGTERM or SIGKILL sent only to the `mode=execute` process (a job supervisor, an IDE, `kill
PID`, `timeout`): within 10 s no rank, forkserver or resource tracker is left, and no
`octopipe-run-*` directory under the system temp dir (issue 18, item 3)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from tests.reliability.cli import ROOT
from tests.reliability.procs import descendants, gone, wait_until

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

WORLD = 2


def start_execute(tmp_path):
    """A long emulated `mode=execute` run on 2 ranks, its process and its temp dir root."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp)}
    proc = subprocess.Popen([sys.executable, "-m", "octopipe.run", "mode=execute", "model=tiny_hybrid",
                             f"pp={WORLD}", "microbatches=4", "runtime.compute=emulated",
                             "runtime.iterations=100000", "runtime.emulate_step_s=0.01",
                             f"hydra.run.dir={tmp_path / 'run'}"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # forkserver + resource tracker + one process per rank, and the ranks' temp dir
    ok = wait_until(lambda: len(descendants(proc.pid)) >= WORLD + 2 and list(tmp.glob("octopipe-run-*")),
                    timeout=180)
    if not ok:
        proc.kill()
        pytest.fail(f"the ranks never started: {proc.communicate()}")
    wait_until(lambda: False, timeout=1.0)        # let the ranks get into their rows
    return proc, tmp


@pytest.mark.parametrize("sig", [pytest.param(signal.SIGTERM, marks=pytest.mark.slow), signal.SIGKILL],
                         ids=["SIGTERM", "SIGKILL"])
def test_killing_the_launcher_leaves_no_process_and_no_temp_dir(sig, tmp_path):
    proc, tmp = start_execute(tmp_path)
    below = descendants(proc.pid)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    left = lambda: [p for p in below if not gone(p)]       # noqa: E731
    assert wait_until(lambda: not left(), timeout=10), f"still running after 10 s: {left()}"
    assert wait_until(lambda: not list(tmp.glob("octopipe-run-*")), timeout=10)
    if sig == signal.SIGTERM:
        assert proc.returncode == 128 + signal.SIGTERM
        assert "octopipe: terminated by SIGTERM" in err and "Traceback" not in err, err
