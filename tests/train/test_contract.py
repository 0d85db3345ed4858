"""The module-factory contract and its errors, the corpus and its errors, the data order, the
learning-rate schedule and checkpoint refusal: no processes."""
from __future__ import annotations

import math
import sys

import pytest
import torch

from octopipe.errors import ConfigError
from octopipe.model.hf import hf_config
from octopipe.model.user_module import UserBlocks, check_blocks, load_factory
from octopipe.train import checkpoint
from octopipe.train.data import TokenBatches, load_corpus
from octopipe.train.optim import OptimSettings, lr_at
from octopipe.train.tokenizer import tokenize
from tests.reliability.cli import run_in_process
from tests.train.helpers import ROOT, gpt

BAD = '''
import torch
from torch import nn

class Floaty(nn.Module):
    def forward(self, x):
        return torch.nn.functional.linear(x, torch.ones(4, 4))

def not_modules():
    return 3

def rejects_ids():
    return [Floaty(), nn.Linear(4, 256)]

def wrong_head():
    return nn.Sequential(nn.Embedding(256, 8), nn.Linear(8, 100))

def raises():
    raise RuntimeError("boom")

def good():
    return nn.Sequential(nn.Embedding(256, 8), nn.Linear(8, 256))

def loss_fn(logits, targets):
    return logits.float().pow(2).mean()
'''


@pytest.fixture(scope="module")
def factory(tmp_path_factory):
    path = tmp_path_factory.mktemp("factory") / "bad_models.py"
    path.write_text(BAD)
    return str(path)


def blocks(ref: str) -> UserBlocks:
    return check_blocks(UserBlocks(ref, 8, 2, 256))


@pytest.mark.parametrize("ref, words", [
    ("nowhere/missing.py:build", "does not exist"),
    ("octopipe_no_such_pkg.models:build", "does not import"),
    ("{f}:absent", "no function 'absent'"),
    ("{f}:not_modules", "returned int"),
    ("{f}:rejects_ids", "block 0:Floaty rejects int64 token ids"),
    ("{f}:wrong_head", "the last block 1:Linear returns shape [2, 8, 100]"),
    ("{f}:raises", "raised RuntimeError: boom"),
    ("no_colon", "expected PKG.MOD:FUNC"),
])
def test_bad_factories_are_one_line_errors_naming_the_block(factory, ref, words):
    with pytest.raises(ConfigError) as e:
        blocks(ref.format(f=factory))
    assert words in str(e.value) and "\n" not in str(e.value)


def test_a_good_factory_gives_named_blocks_with_carry_shapes_and_its_own_loss(factory):
    b = blocks(f"{factory}:good")
    assert b.names == ("0:Embedding", "1:Linear") and b.carry_shapes == ((2, 8, 8), ())
    _fn, module = load_factory(f"{factory}:good")
    ids = torch.randint(0, 256, (2, 8))
    out = b.build(1)(b.build(0)(None, {"ids": ids}), {"targets": ids})
    assert out.shape == () and module.loss_fn is not None


def test_example_factory_by_module_path_and_seeded_weights():
    a, b = gpt(), gpt()
    wa = dict(a.build(1, seed=3).named_parameters())
    wb = dict(b.build(1, seed=3).named_parameters())
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    other = dict(a.build(1, seed=4).named_parameters())
    assert not torch.equal(other["inner.qkv.weight"], wa["inner.qkv.weight"])


def test_corpus_errors(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_corpus(str(tmp_path / "nope.txt"))
    (tmp_path / "empty.txt").write_text("  \n")
    with pytest.raises(ConfigError, match="empty"):
        load_corpus(str(tmp_path / "empty.txt"))
    (tmp_path / "blob.bin").write_bytes(bytes(range(256)))
    with pytest.raises(ConfigError, match="binary"):
        load_corpus(str(tmp_path / "blob.bin"))
    d = tmp_path / "docs"
    d.mkdir()
    (d / "a.txt").write_text("hello ")
    (d / "b.md").write_text("world")
    assert bytes(load_corpus(str(d))) == b"hello \nworld"


def test_default_corpus_ships_with_python_and_batches_are_deterministic():
    tokens = load_corpus("")
    assert len(tokens) > 400_000
    a, b = TokenBatches(tokens, 16, 2, seed=1), TokenBatches(tokens, 16, 2, seed=1)
    x, y = a.batch(5, 3), b.batch(5, 3)
    assert torch.equal(x["ids"], y["ids"]) and torch.equal(x["targets"][:, :-1], x["ids"][:, 1:])
    assert not torch.equal(a.batch(5, 2)["ids"], x["ids"])


def test_warmup_then_cosine():
    s = OptimSettings(lr=1.0, warmup_steps=4, total_steps=14, min_lr_ratio=0.1)
    assert [lr_at(s, k) for k in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert lr_at(s, 9) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert lr_at(s, 14) == pytest.approx(0.1) and lr_at(s, 40) == pytest.approx(0.1)


def test_a_checkpoint_of_another_model_or_plan_is_refused_by_name(tmp_path):
    meta = {"model": "aaa", "model_name": "tiny_gpt", "plan": "ppp", "plan_name": "zbv", "step": 10}
    assert checkpoint.check_meta(tmp_path, meta, dict(meta)) == 10
    with pytest.raises(ConfigError, match="another model"):
        checkpoint.check_meta(tmp_path, meta, {**meta, "model": "bbb"})
    with pytest.raises(ConfigError, match="another plan .zbv"):
        checkpoint.check_meta(tmp_path, meta, {**meta, "plan": "qqq"})
    with pytest.raises(ConfigError, match="not a complete"):
        checkpoint.read_meta(tmp_path)


def test_cli_bad_factory_exits_2_with_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    code, err = run_in_process(["mode=train", "model=module", "model.factory=nowhere.py:build",
                                f"hydra.run.dir={tmp_path}"], capsys)
    assert code == 2
    assert err == ["octopipe: error: model.factory='nowhere.py:build': file nowhere.py does not exist"]


def test_bpe_tokenizer_is_deterministic_and_within_the_vocabulary():
    pytest.importorskip("tokenizers", reason="train.tokenizer=bpe needs tokenizers (the hf extra)")
    data = load_corpus("")[:60_000]
    a, b = tokenize(data, "bpe", 512), tokenize(data, "bpe", 512)
    assert (a == b).all() and a.max() < 512 and len(a) < 0.8 * len(data)
    with pytest.raises(ConfigError, match="at least 256"):
        tokenize(data, "byte", 64)


def test_model_hf_without_transformers_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(ConfigError, match=r"pip install 'octopipe\[hf\]'"):
        hf_config("llama")
