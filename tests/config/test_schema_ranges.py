"""Every numeric field of every config group rejects a non-number and an out-of-range value with
exit 2 and one line naming the field, through the CLI's own path (in-process; a few as a
subprocess). The fields are found by walking the schema, not listed by hand."""
from __future__ import annotations

import dataclasses
import functools
import math
import os
import pickle
import subprocess
import sys
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Union

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf

from octopipe import run as cli
from octopipe.config import Config, load, register
from octopipe.config.cost import COST_SOURCES
from octopipe.config.experiment import EXPERIMENTS
from octopipe.config.fields import Bounds, bounds_of
from octopipe.errors import OctoPipeError
from octopipe.io import CONF_DIR
from octopipe.schedule.library import SCHEDULE_PRESETS
from tests.reliability.cli import run_in_process

ROOT = Path(__file__).resolve().parents[2]
# the presets that bring each section's dataclass into the composed config
COST_PRESET = {"analytic": [], "file": ["cost=file", "cost.preset=gpt_13b"], "profiled": ["cost=profiled"]}
EXPERIMENT_PRESET = {"octopipe_authors": ["experiment=octopipe_authors"], "tabular": ["experiment=tabular"],
                     "suite": ["experiment=suite"], "suite_large": ["experiment=suite_large"],
                     "layouts": ["experiment=layouts"],
                     "pipedream": ["experiment=pipedream"],
                     "ablation": ["experiment=ablation"],
                     "rrfp": ["experiment=rrfp"], "robust": ["experiment=robust"]}


def _numeric(tp: Any) -> tuple[type, bool] | None:
    """(int or float, is a list) when `tp` holds numbers, else None."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp in (int, float):
        return tp, False
    if origin in (Union, types.UnionType):
        for a in args:
            found = _numeric(a)
            if found:
                return found
        return None
    if origin is tuple and args and args[0] in (int, float):
        return args[0], True
    return None


def _walk(cls: type, prefix: str, presets: list[str]) -> Iterator[tuple[str, type, bool, Bounds, list[str]]]:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            yield from _walk(tp, f"{prefix}{f.name}.", presets)
            continue
        found = _numeric(tp)
        if found:
            yield f"{prefix}{f.name}", found[0], found[1], bounds_of(f), presets


def numeric_fields() -> list[tuple[str, type, bool, Bounds, list[str]]]:
    """(dotted key, int|float, list?, bounds, presets) of every numeric field of the schema."""
    out = []
    hints = typing.get_type_hints(Config)
    for f in dataclasses.fields(Config):
        tp = hints[f.name]
        if f.name == "cost":
            for source, cls in COST_SOURCES.items():
                out += [x for x in _walk(cls, "cost.", COST_PRESET[source])
                        if source == "analytic" or x[0] not in {y[0] for y in out}]
        elif f.name == "experiment":
            seen = set()
            for name, cls in EXPERIMENTS.items():
                for x in _walk(cls, "experiment.", EXPERIMENT_PRESET[name]):
                    if x[0] not in seen:
                        seen.add(x[0])
                        out.append(x)
        elif dataclasses.is_dataclass(tp):
            out += list(_walk(tp, f"{f.name}.", []))
        else:
            found = _numeric(tp)
            if found:
                out.append((f.name, found[0], found[1], bounds_of(f), []))
    return out


def out_of_range(kind: type, b: Bounds) -> Any:
    """A value just outside `b` (the field must declare a range)."""
    if b.gt is not None:
        return int(b.gt) if kind is int else b.gt
    if b.ge is not None:
        return int(b.ge) - 1 if kind is int else b.ge - 1.0
    if b.lt is not None and math.isfinite(b.lt):
        return b.lt
    if b.le is not None and math.isfinite(b.le):
        return b.le + 1
    raise AssertionError("no range declared")


def _value(x: Any, as_list: bool) -> str:
    text = "nan" if isinstance(x, float) and math.isnan(x) else repr(x) if not isinstance(x, str) else x
    return f"[{text}]" if as_list else text


FIELDS = numeric_fields()


def test_the_walk_finds_every_group():
    keys = {k for k, *_ in FIELDS}
    for key in ("pp", "seed", "sim.jitter_cv", "tuner.time_budget_s", "runtime.iterations",
                "runtime.lr", "solver.gap", "solver.compare.stages", "cost.efficiency",
                "cost.split", "cost.repeats", "model.hidden", "cluster.gpus_per_node",
                "experiment.node.peak_tflops", "experiment.steps.mid"):
        assert key in keys, key
    assert len(FIELDS) > 60


@pytest.mark.parametrize("key, kind, as_list, bounds, presets", FIELDS, ids=[f[0] for f in FIELDS])
def test_every_numeric_field_has_a_range(key, kind, as_list, bounds, presets):
    assert bounds != Bounds(), f"{key}: declare its valid range with setting(..., ge=/gt=/le=/lt=)"


def run_cli(argv: list[str], tmp_path: Path, capsys) -> tuple[int, list[str]]:
    """`python -m octopipe.run ARGV` in-process: its exit status and its stderr lines."""
    return run_in_process([*argv, f"hydra.run.dir={tmp_path / 'run'}"], capsys)


CASES = [(key, f"{key}={_value(bad, as_list)}", presets, what)
         for key, kind, as_list, bounds, presets in FIELDS
         for what, bad in (("non-number", "abc"), ("out of range", out_of_range(kind, bounds)))
         if bounds != Bounds()]


@functools.cache
def composed(presets: tuple[str, ...]) -> DictConfig:
    register(SCHEDULE_PRESETS)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return compose("config", overrides=["mode=inspect", "model=tiny_hybrid", *presets])


@functools.cache
def _pickled(presets: tuple[str, ...]) -> bytes:
    return pickle.dumps(composed(presets))


def fresh(presets: tuple[str, ...]) -> DictConfig:
    """A private copy of `composed(presets)`: OmegaConf's pickle round trip (flags, types and
    interpolations kept) is several times cheaper than its deepcopy."""
    return pickle.loads(_pickled(presets))


def load_or_fail(presets: list[str], override: str, capsys) -> tuple[int, list[str]]:
    """The CLI's path from an override to exit 2: Hydra's override grammar parses the value, the
    composed config takes it, `load` checks it and `fail` prints the one line."""
    parsed = OverridesParser.create().parse_overrides([override])[0]
    cfg = fresh(tuple(presets))
    OmegaConf.update(cfg, parsed.key_or_group, parsed.value(), merge=False)
    try:
        load(cfg)
        code = 0
    except OctoPipeError as e:
        try:
            cli.fail(str(e))
        except SystemExit as stop:
            code = stop.code
    return code, capsys.readouterr().err.strip().splitlines()


@pytest.mark.parametrize("key, override, presets, what", CASES, ids=[f"{c[1]}" for c in CASES])
def test_bad_values_exit_2_with_one_line(key, override, presets, what, capsys):
    code, lines = load_or_fail(presets, override, capsys)
    assert code == 2, (override, lines)
    assert len(lines) == 1, lines
    assert key in lines[0] and "Traceback" not in lines[0], lines


# The issue's other examples (sim.jitter_cv=lots, tuner.time_budget_s=abc, runtime.iterations=three,
# seed=abc, tuner.time_budget_s=-5, tuner.max_iters=-1, sim.jitter_cv=nan, runtime.lr=-1) run with
# this very argv in tests/reliability/test_bad_inputs.py, whose check (exit 2, one line naming the
# key, no traceback, no result files) includes this one's: one CLI run per example, not two.
@pytest.mark.parametrize("override", ["cost.tp=0", "sim.policy=fast", "tuner.split_layers=always"])
def test_the_issue_examples_in_process(override, tmp_path, capsys):
    code, lines = run_cli(["mode=inspect", "model=tiny_hybrid", override], tmp_path, capsys)
    key = override.split("=")[0]
    assert code == 2 and len(lines) == 1 and key in lines[0], lines


@pytest.mark.parametrize("override, words", [
    ("tuner.time_budget_s=abc", ["tuner.time_budget_s='abc'", "> 0"]),
    ("sim.jitter_cv=nan", ["sim.jitter_cv=nan", ">= 0"]),
    ("tuner.nonsense=3", ["tuner.nonsense"]),
])
def test_the_cli_end_to_end(override, words, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "octopipe.run", "mode=inspect", "model=tiny_hybrid",
                           override, f"hydra.run.dir={tmp_path / 'run'}"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    for w in words:
        assert w in lines[0]


def test_registration_is_idempotent():
    register(SCHEDULE_PRESETS)
    register(SCHEDULE_PRESETS)
