"""`python -m octopipe.train.export`: a checkpoint of any plan becomes the user's own model's
weights, loaded strictly by the factory's module (a tied parameter under both names, the tie
kept), or a transformers directory `from_pretrained` loads with the same logits."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from octopipe.train.checkpoint import read_meta
from octopipe.train.export import export, loaded_model, model_tensors
from octopipe.train.export import main as export_main
from tests.reliability.cli import run_in_process
from tests.train import shared_models
from tests.train.helpers import ROOT

SMALL = ["mode=train", "model.seq_len=16", "model.micro_batch_size=2", "train.microbatches=4", "train.steps=2",
         "train.checkpoint_every=2", "train.plan=schedule", "schedule=1f1b", "cost=profiled", "cost.repeats=1",
         "cost.warmup=0", "cost.cache_dir="]


def _train(tmp_path, capsys, monkeypatch, *args: str):
    """Trains through the CLI's main in this process (torch and the forkserver already up)."""
    monkeypatch.chdir(ROOT)
    code, err = run_in_process([*SMALL, *args, f"hydra.run.dir={tmp_path / 'run'}"], capsys)
    assert code == 0, err[-20:]
    return tmp_path / "run" / "checkpoints" / "step_000002"


def test_a_tied_models_checkpoint_loads_strictly_into_the_factorys_module(tmp_path, capsys, monkeypatch):
    step = _train(tmp_path, capsys, monkeypatch, "model=module", "model.factory=tests/train/shared_models.py:tied")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["params_total"] == sum(p.numel() for p in shared_models.tied().parameters())
    assert summary["shared_copies_equal"] is True and summary["shared_parameters"][0]["name"] == "0.tok.weight"
    out = tmp_path / "tied.pt"
    export_main([str(step), str(out)])              # in this process; the refusal below runs `python -m`
    assert out.is_file()
    model = shared_models.tied()
    model.load_state_dict(torch.load(out), strict=True)
    assert model[-1].proj.weight is model[0].tok.weight        # the tie survives the load
    saved = model_tensors(step)
    assert set(saved) == {n for n, _ in model.named_parameters()}
    assert all(torch.equal(p, saved[n]) for n, p in model.named_parameters())
    assert not torch.equal(model[0].tok.weight, shared_models.tied()[0].tok.weight)    # trained, not initial
    again = subprocess.run([sys.executable, "-m", "octopipe.train.export", str(step), str(out)], cwd=ROOT,
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 2 and len(again.stderr.strip().splitlines()) == 1 and "exists" in again.stderr


def test_an_hf_checkpoint_exports_a_directory_from_pretrained_loads(tmp_path, capsys, monkeypatch):
    transformers = pytest.importorskip("transformers")
    from octopipe.model.hf import hf_config
    cfg = hf_config("qwen2", {"tie_word_embeddings": True})
    cfg.save_pretrained(str(tmp_path / "cfg"))
    step = _train(tmp_path, capsys, monkeypatch, "model=hf", f"model.hf={tmp_path / 'cfg' / 'config.json'}")
    out = export(step, tmp_path / "hf")
    lm = transformers.AutoModelForCausalLM.from_pretrained(str(out))
    assert lm.lm_head.weight.data_ptr() == lm.model.embed_tokens.weight.data_ptr()
    seq, _ = loaded_model(step, read_meta(step))
    ids = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.allclose(seq(ids), lm(ids).logits, rtol=1e-5, atol=1e-6)


def test_export_bad_input_is_one_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "octopipe.train.export", str(tmp_path / "nope"), str(tmp_path / "o")],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        f"octopipe: error: CHECKPOINT={tmp_path / 'nope'}: no such checkpoint directory"]
