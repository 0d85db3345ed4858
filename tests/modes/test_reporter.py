"""Modes return values; the reporter prints them and writes summary.json and the artifacts
atomically."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from rich.console import Console

from octopipe.config import load, register
from octopipe.io import CONF_DIR
from octopipe.modes import compare, simulate
from octopipe.modes.inputs import Inputs
from octopipe.modes.mode_result import Artifact, Result
from octopipe.modes.report import publish
from octopipe.schedule.library import SCHEDULE_PRESETS


def inputs(*overrides: str) -> Inputs:
    register(SCHEDULE_PRESETS)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return Inputs(load(compose("config", overrides=list(overrides))))


def quiet() -> Console:
    return Console(file=open("/dev/null", "w"))


def test_publish_writes_summary_and_artifacts(tmp_path):
    res = Result({"x": 1}, ("hello",), (Artifact("a.txt", lambda p: Path(p).write_text("A")),))
    summary = publish(res, "demo", tmp_path, quiet())
    assert summary == {"mode": "demo", "x": 1}
    assert json.loads((tmp_path / "summary.json").read_text()) == summary
    assert (tmp_path / "a.txt").read_text() == "A"


def test_a_failing_artifact_leaves_no_partial_file(tmp_path):
    def broken(path):
        Path(path).write_text("half")
        raise RuntimeError("disk full")
    with pytest.raises(RuntimeError):
        publish(Result({}, (), (Artifact("b.txt", broken),)), "demo", tmp_path, quiet())
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("mode, overrides, names", [
    (simulate, ["mode=simulate", "schedule=zbv", "pp=4", "microbatches=8", "sim.policy=ready_first"],
     {"trace.json", "timeline.png", "plan.json", "schedule.csv", "executed_schedule.csv"}),
    (compare, ["mode=compare", "model=tiny_hybrid", "pp=2", "microbatches=4", "sim.seeds=1",
               "sim.jitter_levels=[0.1]"], {"report.md", "trace.json", "timeline.png"}),
])
def test_modes_compute_without_writing(mode, overrides, names, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = mode.run(inputs(*overrides))
    assert isinstance(res, Result) and not list(tmp_path.iterdir())
    assert {a.name for a in res.artifacts} == names
    publish(res, "x", tmp_path / "out", quiet())
    assert names | {"summary.json"} == {p.name for p in (tmp_path / "out").iterdir()}

