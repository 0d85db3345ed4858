"""`python -m octopipe.run mode=inspect`: the table, summary.json, and one-line errors (exit 2);
through the CLI's main in this process, one refusal as a process."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from octopipe.config import load, register
from octopipe.io import CONF_DIR
from octopipe.modes import inspect as inspect_mode
from octopipe.modes.inputs import Inputs
from octopipe.modes.report import console_for, publish
from octopipe.schedule.library import SCHEDULE_PRESETS
from tests.reliability.cli import main_in_process

ROOT = Path(__file__).resolve().parents[1]


def cli_process(tmp_path, *args):
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "octopipe.run", *args, f"hydra.run.dir={out}"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    return proc, out


@pytest.fixture
def cli(capsys):
    """`cli_process` through the CLI's main in this process (no interpreter and imports per run)."""
    def run(tmp_path, *args):
        out = tmp_path / "run"
        return main_in_process([*args, f"hydra.run.dir={out}"], capsys), out
    return run


def test_inspect_nemotron_h_8b_writes_summary(tmp_path, cli):
    proc, out = cli(tmp_path, "mode=inspect", "model=nemotron_h_8b", "cluster=h100_1x8")
    assert proc.returncode == 0, proc.stderr
    assert "mamba2" in proc.stdout and "total" in proc.stdout
    s = json.loads((out / "summary.json").read_text())
    assert s["mode"] == "inspect" and s["model"] == "nemotron_h_8b" and s["device"] == "H100-SXM"
    assert s["layers"] == 54 and abs(s["params_total"] / 8.10e9 - 1) < 0.01
    assert s["tokens_per_microbatch"] == 8192
    # 24 Mamba-2 (0.226) + 4 attention (0.151) + 24 MLP (0.352) + head (1.074) GFLOP/token (§3.6).
    assert s["flops_per_token"] / 1e9 == pytest.approx(24 * 0.2265 + 4 * 0.151 + 24 * 0.352 + 1.074,
                                                       rel=0.01)
    assert s["f_total_s"] > 0 and s["i_total_s"] > 0 and s["w_total_s"] > 0
    assert len(s["layer_table"]) == 54 and (out / "cost_table.csv").exists()


def one_line_error(proc, out):
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr
    assert not (out / "summary.json").exists()
    return lines[0]


def test_unknown_preset_lists_the_valid_ones(tmp_path):
    line = one_line_error(*cli_process(tmp_path, "mode=inspect", "model=llama9"))
    assert "llama9" in line and "llama3_8b" in line and "nemotron_h_8b" in line


@pytest.mark.parametrize("override, words", [
    ("model.hidden=-1", ["model.hidden=-1"]),
    ("model.blocks.attention.kv_heads=5", ["model.blocks.attention.kv_heads=5", "heads=32"]),
    ("model.layers=3", ["model.layers"]),
    ("model.pattern=M-Z", ["'Z'", "'M'=Mamba-2"]),
])
def test_impossible_overrides_are_one_line(tmp_path, cli, override, words):
    line = one_line_error(*cli(tmp_path, "mode=inspect", "model=nemotron_h_8b", override))
    for w in words:
        assert w in line


def test_inspect_in_process_on_a_heterogeneous_cluster(tmp_path):
    register(SCHEDULE_PRESETS)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = compose("config", overrides=["model=tiny_vlm", "cluster=hetero_a100_h100", "pp=16"])
    result = inspect_mode.run(Inputs(load(cfg)))
    assert not list(tmp_path.iterdir())               # the mode writes nothing itself
    s = publish(result, "inspect", tmp_path, console_for())
    assert s["device_kinds"] == ["H100-SXM", "A100-80GB"] and s["devices"] == 16
    assert {"patch_embed", "vit_block", "projector", "embedding", "head"} <= set(s["layer_kinds"])
    rows = (tmp_path / "cost_table.csv").read_text().splitlines()
    assert len(rows) == 1 + 2 * s["layers"]
