"""train.recompute: which stages recompute, and a recomputing launch that trains as one that keeps
its forwards (the same losses and weights) while saving fewer activations in all, and on the
first rank, where several micro-batches are in flight, well under (1F1B: 0.5 measured; ZBV's first
rank holds the embedding and the head: 0.78). A rank whose stages run each backward soon after
its forward saves little or nothing: under ZBV the second rank's peak even grows by one activation,
since a rerun stage's output is a new tensor while without recomputation the next stage on the same
rank read the one kept."""
from __future__ import annotations

import json
import tempfile

import pytest
import torch

from octopipe.asynchronous.runtime import WeightStash
from octopipe.asynchronous.tables import Rule
from octopipe.config.runtime import RuntimeConfig
from octopipe.errors import ConfigError
from octopipe.plan import Partition, Plan
from octopipe.runtime.job import Job
from octopipe.train.loop import TrainSpec, launch_training
from octopipe.train.recompute import check_recompute, recompute_stages
from octopipe.train.stream import Stream, StreamBatches
from tests.reliability.cli import run_in_process
from tests.train.helpers import OPTIM, ROOT, batches, gpt, named_plan
from tests.train.test_launch import SMALL


def test_the_stages_each_setting_recomputes():
    assert recompute_stages("none", 4, None) == ()
    assert recompute_stages("full", 4, None) == (0, 1, 2, 3)
    assert recompute_stages("plan", 3, (True, False, True), "runs/layout") == (0, 2)
    with pytest.raises(ConfigError, match="give train.layout=DIR"):
        check_recompute("plan", "")
    with pytest.raises(ConfigError, match="give train.layout=DIR"):
        recompute_stages("plan", 2, (True, True))
    with pytest.raises(ConfigError, match="gives no per-stage"):
        recompute_stages("plan", 2, None, "runs/layout")
    with pytest.raises(ConfigError, match="plans 1 stages"):
        recompute_stages("plan", 2, (True,), "runs/layout")
    check_recompute("full", "")


def _train(recompute: tuple[int, ...], schedule: str):
    blocks = gpt(seq=32)
    plan = named_plan(schedule, blocks.n_blocks)
    with tempfile.TemporaryDirectory() as d:
        job = Job(plan, blocks, RuntimeConfig(dispatch="strict", timeout_s=240, stall_s=120),
                  data=batches(blocks.seq_len, blocks.micro_batch_size), recompute=recompute)
        return launch_training(job, TrainSpec(OPTIM, 3), d), plan.table.n_stages


@pytest.mark.parametrize(("schedule", "first_ratio"), [("1f1b", 0.6), ("zbv", 0.8)])
def test_a_recomputing_launch_trains_as_one_that_keeps_its_forwards(schedule, first_ratio):
    kept, n = _train((), schedule)
    again, _ = _train(tuple(range(n)), schedule)
    assert again.losses == pytest.approx(kept.losses, rel=1e-6)
    for name, w in kept.params.items():
        assert torch.allclose(again.params[name], w, rtol=1e-6, atol=1e-7), name

    def peaks(run) -> list[int]:
        return [max(e["saved_peak_bytes"] for e in rank if "saved_peak_bytes" in e) for rank in run.events]

    low, high = peaks(again), peaks(kept)
    assert min(low) > 0 and sum(low) < sum(high) and low[0] < first_ratio * high[0], (low, high)


def _stream(recompute: tuple[int, ...]):
    blocks, data = gpt(), batches(16, 2)
    st = Stream(Rule.PD, 2, 4, 0, 4, 1)
    sched = st.schedule()
    with tempfile.TemporaryDirectory() as d:
        job = Job(Plan(Partition.uniform(4, 2), sched.table.compact()), blocks,
                  RuntimeConfig(dispatch="strict", timeout_s=240, stall_s=120), weights=WeightStash(sched, OPTIM.lr),
                  data=StreamBatches(data, 4, 0), recompute=recompute)
        return launch_training(job, TrainSpec(OPTIM, 4, stream=st), d)


def test_an_asynchronous_stream_reruns_each_forward_at_the_version_it_read():
    """PipeDream updates the weights after every backward: a rerun at the current weights instead
    of the stashed version its forward read would change the gradients."""
    kept, again = _stream(()), _stream((0, 1))
    assert again.microbatch_losses == pytest.approx(kept.microbatch_losses, rel=1e-6)
    for name, w in kept.params.items():
        assert torch.allclose(again.params[name], w, rtol=1e-6, atol=1e-7), name


@pytest.mark.slow
def test_mode_train_with_full_recomputation_matches_the_reference(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    code, err = run_in_process(["mode=train", *SMALL, "train.steps=2", "train.recompute=full",
                                "train.check_reference=true", f"hydra.run.dir={tmp_path}"], capsys)
    assert code == 0, err[-20:]
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["steps"] == 2 and s["reference_max_rel_err"] <= 1e-5
    code, err = run_in_process(["mode=train", *SMALL, "train.recompute=plan", f"hydra.run.dir={tmp_path / 'b'}"],
                               capsys)
    assert code == 2 and len(err) == 1 and "give train.layout=DIR" in err[0], err
