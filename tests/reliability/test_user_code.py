"""A user's factory that exits, parses arguments at import, hands on float64, builds different
weights on every call, or has a block without parameters: one line naming it (exit 2), or it
trains; never a silent exit, a rank traceback or a crash inside gloo."""
from __future__ import annotations

import json
import textwrap

import pytest

from tests.reliability.cli import ROOT, results_in, run_in_process

HEAD = f"""
import sys
import torch
from torch import nn
sys.path.insert(0, {str(ROOT / 'examples')!r})
from tiny_gpt import build as gpt
"""

FACTORIES = {
    "exit0_at_import": "sys.exit(0)\ndef build(vocab=256):\n    return gpt(vocab=vocab, width=32, depth=2, heads=2)\n",
    "exit3_at_import": "sys.exit(3)\ndef build(vocab=256):\n    return gpt(vocab=vocab, width=32, depth=2, heads=2)\n",
    "exit_in_factory": "def build(vocab=256):\n    sys.exit(0)\n",
    "argparse_at_import": textwrap.dedent("""
        import argparse
        p = argparse.ArgumentParser()
        p.add_argument("--width", type=int, default=32)
        args = p.parse_args()
        def build(vocab=256):
            return gpt(vocab=vocab, width=args.width, depth=2, heads=2)
        """),
    "float64_handoff": textwrap.dedent("""
        class ToDouble(nn.Module):
            def __init__(self):
                super().__init__()
                self.g = nn.Parameter(torch.ones(()))
            def forward(self, x):
                return (x * self.g).double()
        class Back(nn.Module):
            def forward(self, x):
                return x.float()
        def build(vocab=256):
            b = list(gpt(vocab=vocab, width=32, depth=2, heads=2))
            return b[:2] + [ToDouble(), Back()] + b[2:]
        """),
    "reseeds": textwrap.dedent("""
        import os
        def build(vocab=256):
            torch.manual_seed(int.from_bytes(os.urandom(4), "little"))
            return gpt(vocab=vocab, width=32, depth=2, heads=2)
        """),
    "identity_block": textwrap.dedent("""
        def build(vocab=256):
            b = list(gpt(vocab=vocab, width=32, depth=2, heads=2))
            return b[:2] + [nn.Identity()] + b[2:]
        """),
    "parameterless_first_block": textwrap.dedent("""
        class OneHot(nn.Module):
            def forward(self, ids):
                return torch.nn.functional.one_hot(ids, 256).float()
        def build(vocab=256):
            b = list(gpt(vocab=vocab, width=32, depth=2, heads=2))
            return [OneHot(), nn.Linear(256, 32)] + b[1:]
        """),
}

REFUSED = {
    "exit0_at_import": "called sys.exit(0); keep script code under if __name__ == '__main__'",
    "exit3_at_import": "called sys.exit(3)",
    "exit_in_factory": "called sys.exit(0); a factory returns its blocks",
    "float64_handoff": "block 2:ToDouble hands on a float64 tensor",
    "reseeds": "two calls under seed 0 build different weights in block 0:Embed",
}


def _run(tmp_path, capsys, monkeypatch, kind: str, *extra: str):
    monkeypatch.chdir(ROOT)
    path = tmp_path / f"{kind}.py"
    path.write_text(HEAD + FACTORIES[kind])
    out = tmp_path / "run"
    code, err = run_in_process(["mode=train", "model=module", f"model.factory={path}:build", "model.seq_len=16",
                                "model.micro_batch_size=2", "train.microbatches=4", "train.steps=2",
                                "train.plan=schedule", "cost=profiled", "cost.repeats=1", "cost.warmup=0",
                                "cost.cache_dir=", *extra, f"hydra.run.dir={out}"], capsys)
    return code, err, out


@pytest.mark.parametrize("kind", sorted(REFUSED))
def test_a_misbehaving_factory_is_one_line(tmp_path, capsys, monkeypatch, kind):
    code, err, out = _run(tmp_path, capsys, monkeypatch, kind)
    assert code == 2 and len(err) == 1 and REFUSED[kind] in err[0] and "model.factory" in err[0], err
    assert results_in(out) == []


def test_argparse_at_import_sees_the_factory_file_not_octopipes_arguments(tmp_path, capsys, monkeypatch):
    code, err, out = _run(tmp_path, capsys, monkeypatch, "argparse_at_import")
    assert code == 0, err
    assert json.loads((out / "summary.json").read_text())["steps"] == 2


def test_a_first_block_without_parameters_profiles_and_trains_exactly(tmp_path, capsys, monkeypatch):
    code, err, out = _run(tmp_path, capsys, monkeypatch, "parameterless_first_block", "train.plan=tuned",
                          "train.check_reference=true")
    assert code == 0, err
    assert json.loads((out / "summary.json").read_text())["reference_max_rel_err"] <= 1e-5


def test_a_block_that_returns_its_input_trains(tmp_path, capsys, monkeypatch):
    code, err, out = _run(tmp_path, capsys, monkeypatch, "identity_block", "train.plan=tuned")
    assert code == 0, err
    assert json.loads((out / "summary.json").read_text())["steps"] == 2
