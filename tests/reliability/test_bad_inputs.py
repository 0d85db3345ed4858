"""Every class of bad input the adversarial run found: exit 2, exactly one line on stderr, no
traceback, no result files left.

Each case runs the CLI in-process (the same `main` as `python -m octopipe.run`); the classes are
parametrized so that a new member of a class is one more line here."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.reliability.cli import results_in, run_in_process

TINY = ["mode=inspect", "model=tiny_hybrid"]
SIM = ["mode=simulate", "model=tiny_hybrid", "pp=2", "microbatches=4"]

# the adversarial run's own examples through the whole CLI (tests/config/test_schema_ranges.py
# checks every numeric field's non-number and out-of-range values at `load`)
NON_NUMERIC = ["sim.jitter_cv=lots", "runtime.iterations=three", "tuner.time_budget_s=abc", "seed=abc"]
OUT_OF_RANGE = ["sim.jitter_cv=nan", "tuner.time_budget_s=-5", "tuner.max_iters=-1", "tuner.max_chunks=0",
                "runtime.lr=-1", "runtime.max_params=-5", "runtime.stall_s=0", "runtime.timeout_s=-1",
                "sim.seeds=0", "runtime.emulate_step_s=-1"]


def check_one_line(code: int, lines: list[str], run_dir: Path, *words: str) -> None:
    assert code == 2, lines
    assert len(lines) == 1, lines
    assert "Traceback" not in lines[0] and lines[0].startswith("octopipe: error: "), lines
    for w in words:
        assert w in lines[0], (w, lines)
    assert results_in(run_dir) == [], results_in(run_dir)


@pytest.mark.parametrize("override", NON_NUMERIC + OUT_OF_RANGE)
def test_numeric_fields_refuse_non_numbers_and_out_of_range_values(override, tmp_path, capsys):
    run = tmp_path / "run"
    code, lines = run_in_process([*TINY, override, f"hydra.run.dir={run}"], capsys)
    check_one_line(code, lines, run, override.split("=")[0])


@pytest.mark.parametrize("key, mode", [("schedule.file", SIM), ("cost.path", [*TINY, "cost=file"])])
@pytest.mark.parametrize("suffix", [".csv", ".json"])
def test_binary_input_files_are_named_in_one_line(key, mode, suffix, tmp_path, capsys):
    blob = tmp_path / f"blob{suffix}"
    blob.write_bytes(b"\xff\xfe\x00\x01\x80binary")
    run = tmp_path / "run"
    code, lines = run_in_process([*mode, f"{key}={blob}", f"hydra.run.dir={run}"], capsys)
    check_one_line(code, lines, run, key, "UTF-8")


def _run_dirs(tmp_path: Path) -> dict[str, tuple[str, str]]:
    (tmp_path / "a_file").write_text("x")
    return {"under a file": (str(tmp_path / "a_file" / "run"), "a_file"),
            "an existing file": (str(tmp_path / "a_file"), "is a file"),
            "in /proc": ("/proc/octopipe-run", "cannot create"),
            "in /sys": ("/sys/octopipe-run", "cannot create"),
            "empty": ("", "empty")}


@pytest.mark.parametrize("case", ["under a file", "an existing file", "in /proc", "in /sys", "empty"])
def test_a_run_directory_that_cannot_be_made_is_one_line(case, tmp_path, capsys):
    path, word = _run_dirs(tmp_path)[case]
    code, lines = run_in_process([*TINY, f"hydra.run.dir={path}"], capsys)
    check_one_line(code, lines, tmp_path / "none", "hydra.run.dir", word)
    assert not list(Path.cwd().glob("summary.json"))


@pytest.mark.parametrize("argv, words", [
    (["pp", "2"], ["'pp'", "key=value"]),
    (["model.pattern=(*-)x2"], ["model.pattern", "quote"]),
    (["model=tiny_hybrid,nope", "--multirun"], ["unknown model preset 'nope'"]),
    (["schedule=1f1b,nope", "--multirun"], ["unknown schedule preset 'nope'"]),
    (["mode=inspect,fly", "--multirun"], ["unknown mode 'fly'"]),
    (["model=nope"], ["unknown model preset 'nope'"]),
    (["model.no_such_key=3"], ["no_such_key"]),
])
def test_hydra_grammar_and_preset_errors_are_one_line(argv, words, tmp_path, capsys):
    run = tmp_path / "run"
    code, lines = run_in_process(["mode=inspect", *argv, f"hydra.run.dir={run}"], capsys)
    check_one_line(code, lines, run, *words)
