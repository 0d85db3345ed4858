"""SIGTERM or SIGKILL sent only to the `mode=execute` process (a job supervisor, an IDE, `kill
PID`, `timeout`): within 10 s no rank, forkserver or resource tracker is left, and no
`octopipe-run-*` directory under the system temp dir."""
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
CLI = ["-m", "octopipe.run", "mode=execute", "model=tiny_hybrid", f"pp={WORLD}", "microbatches=4",
       "runtime.compute=emulated", "runtime.iterations=100000", "runtime.emulate_step_s=0.01"]
LAUNCHER = ["-c", f"""
from octopipe.plan import uniform_partition
from octopipe.runtime.launch import execute
from octopipe.schedule.library import build_schedule
from tests.runtime import tiny
if __name__ == "__main__":
    model = tiny.hybrid()
    execute(tiny.job(model, uniform_partition(model.n_layers, {WORLD}), build_schedule("1f1b", {WORLD}, 4),
                     iterations=100000, timeout_s=600))
"""]


def start_execute(tmp_path, argv: list[str]):
    """A long run on 2 ranks (the CLI's `mode=execute`, or `execute()` alone), its process and
    the root of its temporary directories."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp)}
    run_dir = [f"hydra.run.dir={tmp_path / 'run'}"] if argv == CLI else []
    proc = subprocess.Popen([sys.executable, *argv, *run_dir], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # forkserver + resource tracker + one process per rank, and the ranks' temp dir
    ok = wait_until(lambda: len(descendants(proc.pid)) >= WORLD + 2 and list(tmp.glob("octopipe-run-*")),
                    timeout=180)
    if not ok:
        proc.kill()
        pytest.fail(f"the ranks never started: {proc.communicate()}")
    wait_until(lambda: False, timeout=1.0)        # let the ranks get into their rows
    return proc, tmp


@pytest.mark.parametrize("sig, argv", [
    (signal.SIGKILL, LAUNCHER),
    pytest.param(signal.SIGTERM, LAUNCHER, marks=pytest.mark.slow),
    pytest.param(signal.SIGTERM, CLI, marks=pytest.mark.slow),
    pytest.param(signal.SIGKILL, CLI, marks=pytest.mark.slow),
], ids=["SIGKILL-execute", "SIGTERM-execute", "SIGTERM-mode=execute", "SIGKILL-mode=execute"])
def test_killing_the_launcher_leaves_no_process_and_no_temp_dir(sig, argv, tmp_path):
    proc, tmp = start_execute(tmp_path, argv)
    below = descendants(proc.pid)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    left = lambda: [p for p in below if not gone(p)]
    assert wait_until(lambda: not left(), timeout=10), f"still running after 10 s: {left()}"
    assert wait_until(lambda: not list(tmp.glob("octopipe-run-*")), timeout=10)
    if sig == signal.SIGTERM and argv == CLI:
        assert proc.returncode == 128 + signal.SIGTERM
        assert "octopipe: terminated by SIGTERM" in err and "Traceback" not in err, err


MID_START = ["-c", """
import signal, os
from multiprocessing import forkserver
from octopipe.run import stops_cleanly
from octopipe.runtime.launch import run_ranks
from octopipe.schedule.library import build_schedule

read_signed = forkserver.read_signed
def late_sigterm(fd):
    # the launcher has sent the rank its start and waits for its pid: SIGTERM arrives now
    forkserver.read_signed = read_signed
    os.kill(os.getpid(), signal.SIGTERM)
    return read_signed(fd)

if __name__ == "__main__":
    with stops_cleanly():
        forkserver.read_signed = late_sigterm
        run_ranks(print, "started", build_schedule("1f1b", 2, 2), timeout_s=60, stall_s=60)
"""]


def test_sigterm_while_a_rank_starts_is_the_one_line_and_nothing_after(tmp_path):
    """A SIGTERM in the middle of starting a rank is held until the start is done: the rank is
    known to the launcher and stopped by it, instead of failing on its own once the launcher
    has gone (a forkserver traceback after the one line)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, *MID_START], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=180)
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr
    assert proc.stderr.splitlines() == ["octopipe: terminated by SIGTERM"], proc.stderr
