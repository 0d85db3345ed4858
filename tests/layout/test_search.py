"""mode=layout: the search against exhaustive search, determinism, and bad input (one line, exit 2)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from octopipe.config.cost import AnalyticCost
from octopipe.config.layout import LayoutConfig
from octopipe.errors import ConfigError, InfeasibleError
from octopipe.layout import Grid, Layout, enumerate_layouts, search, valid_tp
from octopipe.model.build import build_model
from tests.reliability.cli import main_in_process

ROOT = Path(__file__).resolve().parents[2]


def model(name):
    return build_model(OmegaConf.load(ROOT / "conf" / "model" / f"{name}.yaml"))


def grid(name, gpus=None):
    return Grid.of(OmegaConf.load(ROOT / "conf" / "cluster" / f"{name}.yaml"), gpus)


def test_enumeration_respects_heads_nodes_and_the_global_batch():
    m = model("llama3_70b")
    assert valid_tp(m, 8) == [1, 2, 4, 8]
    cfg = LayoutConfig(global_batch=16, micro_batch_sizes=(1, 2))
    got = enumerate_layouts(m, 32, 8, cfg)
    assert all(L.tp * L.pp * L.dp == 32 and L.dp * L.micro_batch_size * L.microbatches == 16
               and L.tp <= 8 for L in got)
    assert Layout(8, 4, 1, 1, 16) in got and Layout(8, 2, 2, 2, 4) in got
    # dp = 32 / (tp pp) must divide 16: tp1 pp1 (dp32) is out
    assert not any(L.dp == 32 for L in got)
    assert len(got) == len(set(got))


@pytest.mark.parametrize("kw,msg", [
    ({"tp": 3}, r"layout.tp=3 does not divide the model's attention heads \(64\)"),
    ({"tp": 16}, r"layout.tp=16 exceeds a node \(8 GPUs\)"),
    ({"pp": 3}, r"32 GPUs: no tp x pp x dp factorizes them with layout.pp=3"),
    ({"global_batch": 7, "dp": 2}, r"layout.global_batch=7: no layout divides it"),
])
def test_bad_requests_are_one_line_config_errors(kw, msg):
    with pytest.raises(ConfigError, match=msg) as e:
        enumerate_layouts(model("llama3_70b"), 32, 8, LayoutConfig(**kw))
    assert "\n" not in str(e.value)


def test_a_model_that_fits_no_layout_says_what_would():
    with pytest.raises(InfeasibleError, match=r"fits no layout on 1 GPUs.*would fit with: at least "
                                              r"\d+ GPUs") as e:
        search(model("llama3_70b"), grid("h100_1x8", 1), AnalyticCost(),
               LayoutConfig(global_batch=4, micro_batch_sizes=(1,)))
    assert "ZeRO-2 and full recomputation do not suffice" in str(e.value)
    assert "\n" not in str(e.value)
    # Llama-3 8B on 2 GPUs: 72 GB of Adam state per GPU leaves no room for activations unless
    # they are recomputed
    with pytest.raises(InfeasibleError, match=r"would fit with: full recomputation"):
        search(model("llama3_8b"), grid("h100_1x8", 2), AnalyticCost(),
               LayoutConfig(global_batch=2, micro_batch_sizes=(1,), zero=0, recompute=("none",)))


@pytest.mark.parametrize("name,gpus,gb", [("tiny_hybrid", 4, 8), ("tiny_moe", 4, 8)])
def test_search_best_equals_exhaustive_best(name, gpus, gb):
    m, g = model(name), grid("h100_1x8", gpus)
    cfg = LayoutConfig(global_batch=gb, micro_batch_sizes=(1, 2), tuned=3)
    fast = search(m, g, AnalyticCost(), cfg, seed=0)
    oracle = search(m, g, AnalyticCost(), LayoutConfig(global_batch=gb, micro_batch_sizes=(1, 2),
                                                       exhaustive=True), seed=0)
    assert oracle.tuned >= fast.tuned and oracle.candidates_evaluated >= fast.candidates_evaluated
    assert fast.best.iteration_s <= oracle.best.iteration_s * 1.01
    # same seed, same answer
    again = search(m, g, AnalyticCost(), cfg, seed=0)
    assert again.best.row() == fast.best.row()
    assert fast.best.iteration_s >= fast.best.lower_bound_s * (1 - 1e-9)


def test_cli_layout_writes_summary_and_plan(tmp_path, capsys):
    """The search through the CLI's main in this process; the refusal as a process."""
    out = tmp_path / "run"
    r = main_in_process(["mode=layout", "model=tiny_hybrid", "cluster=h100_1x8", "layout.gpus=4",
                         "layout.global_batch=8", "layout.top=3", f"hydra.run.dir={out}"], capsys)
    assert r.returncode == 0, r.stderr
    s = json.loads((out / "summary.json").read_text())
    keys = {"tp", "pp", "dp", "micro_batch_size", "microbatches", "recompute", "iteration_s",
            "tokens_per_s", "mfu", "peak_memory_bytes"}
    assert keys <= set(s["best"]) and 1 <= len(s["top"]) <= 3 and s["candidates_evaluated"] >= 1
    assert s["best"]["tp"] * s["best"]["pp"] * s["best"]["dp"] == 4
    assert (out / "plan.json").exists() and (out / "schedule.csv").exists()
    bad = subprocess.run([sys.executable, "-m", "octopipe.run", "mode=layout", "model=llama3_70b",
                          "cluster=h100_4x8", "layout.tp=3", f"hydra.run.dir={tmp_path / 'bad'}"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1
    assert "layout.tp=3 does not divide" in bad.stderr
