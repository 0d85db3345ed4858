"""train.tensorboard=true: one scalar per step under <run dir>/tensorboard, equal to loss.csv."""
from __future__ import annotations

import pytest

from tests.reliability.cli import ROOT, run_in_process

pytest.importorskip("tensorboard")


def test_scalars_per_step_match_the_loss_csv(tmp_path, capsys, monkeypatch):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    monkeypatch.chdir(ROOT)
    out = tmp_path / "run"
    code, err = run_in_process(["mode=train", "model=module", "model.factory=examples/tiny_gpt.py:build",
                                "model.seq_len=16", "model.micro_batch_size=2", "train.microbatches=4",
                                "train.steps=3", "train.plan=schedule", "schedule=1f1b", "cost=profiled",
                                "cost.repeats=1", "cost.warmup=0", "cost.cache_dir=", "train.tensorboard=true",
                                f"hydra.run.dir={out}"], capsys)
    assert code == 0, err
    acc = EventAccumulator(str(out / "tensorboard"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"train/loss", "train/lr", "train/grad_norm", "train/tokens_per_s", "train/step_s",
            "idle_share/rank0", "idle_share/rank1"} <= tags
    rows = [line.split(",") for line in (out / "loss.csv").read_text().splitlines()[1:]]
    loss = acc.Scalars("train/loss")
    assert [e.step for e in loss] == [1, 2, 3]
    assert [e.value for e in loss] == pytest.approx([float(r[1]) for r in rows], rel=1e-6)
    assert all(0.0 <= e.value <= 1.0 for e in acc.Scalars("idle_share/rank1"))
