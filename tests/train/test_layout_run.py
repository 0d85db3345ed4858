"""train.layout=DIR: the layout mode=layout chose (tp, pp, dp, micro-batching, recomputation, its
plan) trained on this machine, the preset scaled to fit; what cannot be trained is one line."""
from __future__ import annotations

import json
import shutil

import pytest

from octopipe.config.presets import preset
from octopipe.model.build import build_model
from octopipe.model.params import model_params
from octopipe.train.layout_run import read_layout, scale_model
from tests.reliability.cli import run_in_process, run_process
from tests.train.helpers import ROOT

LAYOUT = ["mode=layout", "model=tiny_hybrid", "cluster=h100_1x8", "layout.gpus=4", "layout.tp=2", "layout.pp=2",
          "layout.global_batch=4", "layout.recompute=[full]"]


@pytest.fixture(scope="module")
def laid_out(tmp_path_factory):
    out = tmp_path_factory.mktemp("layout") / "run"
    r = run_process([*LAYOUT, f"hydra.run.dir={out}"])
    assert r.returncode == 0, r.stderr[-2000:]
    return out


def test_read_layout_is_what_mode_layout_chose(laid_out):
    best = json.loads((laid_out / "summary.json").read_text())["best"]
    c = read_layout(str(laid_out))
    assert (c.tp, c.pp, c.dp, c.micro_batch_size, c.microbatches) == \
        (best["tp"], best["pp"], best["dp"], best["micro_batch_size"], best["microbatches"])
    assert c.model == "tiny_hybrid" and c.plan.table.n_devices == c.pp
    assert c.recomputed() == (True,) * c.plan.table.n_stages
    assert c.dp * c.micro_batch_size * c.microbatches == c.global_batch == 4


@pytest.mark.parametrize("name", ["llama3_8b", "qwen3_30b_a3b", "gpt_oss_20b"])
def test_a_large_preset_is_scaled_under_the_limit_keeping_its_layers_and_tp(name):
    mc = preset("model", name)
    small, note = scale_model(mc, 4, 50_000_000)
    big, tiny = build_model(mc), build_model(small)
    assert model_params(tiny) <= 50_000_000 and tiny.n_layers == big.n_layers and note
    assert [x.kind for x in tiny.layers] == [x.kind for x in big.layers]
    assert all(x.heads % 4 == 0 for x in tiny.layers if x.heads) and tiny.vocab % 4 == 0
    assert scale_model(preset("model", "tiny_hybrid"), 2, 50_000_000)[1] == ""     # small enough: unchanged


@pytest.mark.slow
def test_the_layout_trains_with_its_degrees_and_recomputation(laid_out, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    out = tmp_path / "train"
    code, err = run_in_process(["mode=train", "model=tiny_hybrid", f"train.layout={laid_out}", "train.steps=2",
                                "train.check_reference=true", f"hydra.run.dir={out}"], capsys)
    assert code == 0, err
    s = json.loads((out / "summary.json").read_text())
    c = read_layout(str(laid_out))
    assert {k: s["layout"][k] for k in ("tp", "pp", "dp", "microbatches")} == \
        {"tp": c.tp, "pp": c.pp, "dp": c.dp, "microbatches": c.microbatches}
    assert (s["tp"], s["pp"], s["dp"]) == (c.tp, c.pp, c.dp) and s["layout"]["recompute"] == list(c.recompute)
    assert s["reference_max_rel_err"] <= 1e-5 and s["predicted_iteration_s"] > 0


def _damaged(laid_out, tmp_path, what):
    bad = tmp_path / "bad"
    shutil.copytree(laid_out, bad)
    if what == "json":
        (bad / "summary.json").write_text("{not json")
    elif what == "plan":
        (bad / "plan.json").unlink()
    elif what == "batch":
        doc = json.loads((bad / "summary.json").read_text())
        doc["global_batch"] = 5
        (bad / "summary.json").write_text(json.dumps(doc))
    return bad


@pytest.mark.parametrize("what,extra,message", [
    ("json", [], "summary.json is not JSON"),
    ("plan", [], "no plan.json there"),
    ("batch", [], "global batch 5 is not dp"),
    ("", ["model=llama3_8b"], "was laid out for tiny_hybrid"),
    ("", ["runtime.max_ranks=2"], "more than runtime.max_ranks=2"),
])
def test_a_layout_the_run_cannot_train_is_one_line(laid_out, tmp_path, capsys, monkeypatch, what, extra, message):
    monkeypatch.chdir(ROOT)
    path = _damaged(laid_out, tmp_path, what) if what else laid_out
    code, err = run_in_process(["mode=train", "model=tiny_hybrid", *extra, f"train.layout={path}", "train.steps=1",
                                f"hydra.run.dir={tmp_path / 'run'}"], capsys)
    assert code == 2 and len(err) == 1 and message in err[0], err
