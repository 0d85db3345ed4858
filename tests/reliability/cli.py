"""Running `python -m octopipe.run` for the reliability tests: in-process (fast) or as a process."""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from octopipe import run as cli

ROOT = Path(__file__).resolve().parents[2]
BOOKKEEPING = {".hydra", "run.log", ".octopipe-run"}
"""What a run directory may hold after a failed run: Hydra's record of the config, its log, and
the marker that claimed the directory; anything else is a result file."""


@dataclass(frozen=True)
class Ran:
    """What a run of the CLI's main in this process gave (the fields of a CompletedProcess)."""

    returncode: int
    stdout: str
    stderr: str


def main_in_process(argv: list[str], capsys) -> Ran:
    """`python -m octopipe.run ARGV` in this process (torch, Hydra and the forkserver already
    up): its exit status, stdout and stderr."""
    old = sys.argv
    sys.argv = ["octopipe.run", *argv]
    try:
        cli.main()
        code = 0
    except SystemExit as e:
        code = e.code
    finally:
        sys.argv = old
    out = capsys.readouterr()
    return Ran(code, out.out, out.err)


def run_in_process(argv: list[str], capsys) -> tuple[int, list[str]]:
    """`python -m octopipe.run ARGV` in this process: its exit status and its stderr lines."""
    ran = main_in_process(argv, capsys)
    return ran.returncode, ran.stderr.strip().splitlines()


def run_process(argv: list[str], cwd: Path = ROOT, timeout: float = 240, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **kw.pop("env", {})}
    return subprocess.run([sys.executable, "-m", "octopipe.run", *argv], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout, **kw)


def results_in(run_dir: Path) -> list[str]:
    """The result files a run left in `run_dir` (none when it does not exist)."""
    if not run_dir.is_dir():
        return []
    return sorted(p.name for p in run_dir.iterdir() if p.name not in BOOKKEEPING)
