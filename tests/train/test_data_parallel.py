"""Data and tensor parallelism in training: dp replicas x tp ranks x pp stages train the model the
single-process reference trains on the same global batch (its own code path: the whole model in
one process, the same data and AdamW)."""
from __future__ import annotations

import tempfile

import pytest

from octopipe.config.presets import preset
from octopipe.config.runtime import RuntimeConfig
from octopipe.model.build import build_model
from octopipe.model.user_module import UserBlocks, check_blocks
from octopipe.runtime.data_parallel import ReplicaBatches, buckets, owners
from octopipe.runtime.job import DataParallel, Job
from octopipe.runtime.stage import SpecBlocks
from octopipe.runtime.tensor_parallel import Grid
from octopipe.train.data import TokenBatches, load_corpus
from octopipe.train.loop import TrainSpec, launch_training, reference_train
from octopipe.train.summary import compare
from tests.train.helpers import OPTIM, ROOT, batches, gpt, named_plan, weight_floor

STEPS, M = 4, 2


def test_megatron_rank_order_tp_fastest_then_dp_then_pp():
    g = Grid(pp=2, tp=2, dp=3)
    assert g.world == 12
    assert [g.place(r) for r in range(4)] == [(0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1)]
    assert g.place(6) == (1, 0, 0)
    assert all(g.rank(*((p := g.place(r))[0], p[2], p[1])) == r for r in range(g.world))


def test_zero_deals_whole_parameters_to_the_least_loaded_replica():
    assert owners([10, 3, 3, 3, 1, 2], 2) == [0, 1, 1, 1, 1, 0]
    assert owners([5], 3) == [0]
    # the last parameters first, a bucket never above the limit unless one parameter is
    assert buckets([4, 4, 4, 10], 4, 32) == [[3], [2, 1], [0]]
    assert sorted(k for b in buckets([1] * 7, 4, 8) for k in b) == list(range(7))


def test_a_replica_reads_its_share_of_the_global_batch():
    class Source:
        def batch(self, it, mb):
            return (it, mb)
    assert [ReplicaBatches(Source(), 1, 3).batch(5, k) for k in range(3)] == [(5, 3), (5, 4), (5, 5)]


def _run(blocks, plan, data, dp=1, zero=False, tp=1, dispatch="strict"):
    with tempfile.TemporaryDirectory() as d:
        job = Job(plan, blocks, RuntimeConfig(dispatch=dispatch, tp=tp, timeout_s=240, stall_s=120), data=data,
                  data_parallel=DataParallel(dp, zero))
        return launch_training(job, TrainSpec(OPTIM, STEPS), d)


CASES = [("gpt", "interleaved", False, "strict"),
         ("tied", "1f1b", True, "ready_first")]


def _overlapped(events: list[list[dict]]) -> bool:
    """Whether some rank started a stage's gradient sync before its row's last action ended."""
    for ev in events:
        ends = [e["end"] for e in ev if "action" in e]
        starts = [t for e in ev if "dp_sync_start" in e for t in e["dp_sync_start"].values()]
        if ends and starts and min(starts) < max(ends):
            return True
    return False


@pytest.mark.slow
@pytest.mark.parametrize("model,schedule,zero,dispatch", CASES)
def test_pp2_dp2_trains_the_single_process_model(model, schedule, zero, dispatch):
    """pp = 2 x dp = 2 (4 processes), with and without ZeRO-1 (a parameter shared by two
    stages in the ZeRO case): losses within 1e-5 of the reference on the global batch."""
    if model == "gpt":
        blocks = gpt()
    else:
        blocks = check_blocks(UserBlocks(f"{ROOT}/tests/train/shared_models.py:tied", 16, 2, 256))
    data = batches(16, 2)
    run = _run(blocks, named_plan(schedule, blocks.n_blocks, 2, M), data, dp=2, zero=zero, dispatch=dispatch)
    ref = reference_train(blocks, data, 2 * M, OPTIM, STEPS)
    loss_err, weight_err = compare(run, ref, blocks, {})
    assert loss_err <= 1e-5 and weight_err <= 1e-4, (loss_err, weight_err)
    if model == "tied":
        assert run.tied_equal is True
    else:       # interleaved: a rank's later chunk finishes its backwards first and syncs meanwhile
        assert _overlapped(run.events)


@pytest.mark.slow
def test_pp2_tp2_trains_tiny_hybrid_like_one_process():
    model = build_model(preset("model", "tiny_hybrid"))
    assert model.vocab >= 256        # byte tokens
    data = TokenBatches(load_corpus(""), model.seq_len, model.micro_batch_size, seed=0)
    plan = named_plan("1f1b", model.n_layers, 2, M)
    run = _run(model, plan, data, tp=2)
    ref = reference_train(SpecBlocks(model), data, M, OPTIM, STEPS)
    loss_err, weight_err = compare(run, ref, SpecBlocks(model), {})
    assert set(run.params) == set(ref.params)       # every TP slice put back together
    assert loss_err <= 1e-5 and weight_err <= 1e-4, (loss_err, weight_err)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_pp2_tp2_splits_a_hugging_face_decoder_like_one_process(family):
    """model=hf: each decoder layer's attention heads and MLP rows split in place (the
    transformers modules keep their names), the single-process reference is the unsplit model."""
    blocks = check_blocks(UserBlocks("octopipe.model.hf:build", 16, 2, 256, (("config", family),)))
    data = batches(16, 2)
    run = _run(blocks, named_plan("1f1b", blocks.n_blocks, 2, 4), data, tp=2)
    ref = reference_train(blocks, data, 4, OPTIM, STEPS)
    loss_err, weight_err = compare(run, ref, blocks, {})
    assert set(run.params) == set(ref.params)
    # AdamW magnifies rounding in parameters whose true gradient is zero (qwen2's key bias): the
    # bound is the reference's own spread under another summation order
    bound = max(1e-4, 8 * weight_floor(blocks, data, ref, OPTIM, STEPS))
    assert loss_err <= 1e-5 and weight_err <= bound, (loss_err, weight_err, bound)


REFUSALS = [
    (["train.zero=1"], "train.zero=1 shards AdamW state"),
    (["train.dp=2", "train.tp=2", "train.pp=3"], "train.dp=2 x train.tp=2 x train.pp=3 = 12 processes"),
    (["train.tp=2"], "train.tp=2: a user's blocks"),
    (["model=hf", "model.hf=qwen3", "train.tp=2"], "train.tp=2: model.hf=qwen3 is qwen3"),
    (["train.model=tiny_hybrid", "train.tp=3"], "train.tp=3 does not divide"),
    (["train.dp=2", "schedule=pipedream", "train.microbatches=4"], "train.dp=2: schedule=pipedream"),
    (["runtime.tp=2"], "runtime.tp=2: mode=train's tensor parallelism is train.tp"),
]


@pytest.mark.parametrize("args,message", REFUSALS)
def test_a_layout_the_run_cannot_train_is_one_line_before_any_process(args, message, tmp_path, capsys,
                                                                       monkeypatch):
    from tests.reliability.cli import run_in_process
    monkeypatch.chdir(ROOT)
    code, err = run_in_process(["mode=train", "train.steps=1", f"hydra.run.dir={tmp_path}",
                                *args], capsys)
    assert code == 2 and len(err) == 1 and message in err[0], err


@pytest.mark.slow
def test_a_zero_checkpoint_resumes_bit_for_bit_on_its_layout_and_on_one_replica(tmp_path, capsys, monkeypatch):
    """ZeRO-1 replicas each save the AdamW state they own under the model's names; the checkpoint
    continues on the same layout and on one pipeline of the same global batch."""
    from tests.reliability.cli import run_in_process
    monkeypatch.chdir(ROOT)
    base = ["mode=train", "train.pp=2", "train.plan=schedule", "schedule=1f1b", "train.steps=3"]
    dp2 = [*base, "train.dp=2", "train.zero=1", "train.microbatches=2"]
    code, err = run_in_process([*dp2, "train.checkpoint_every=2", f"hydra.run.dir={tmp_path / 'a'}"], capsys)
    assert code == 0, err
    ckpt = tmp_path / "a" / "checkpoints" / "step_000002"
    runs = {"same": dp2, "one": [*base, "train.microbatches=4"]}
    for key, args in runs.items():
        code, err = run_in_process([*args, f"train.resume={ckpt}", f"hydra.run.dir={tmp_path / key}"], capsys)
        assert code == 0, err
    last = {k: (tmp_path / k / "loss.csv").read_text().splitlines()[-1] for k in ("a", "same", "one")}
    assert last["same"].split(",")[:2] == last["a"].split(",")[:2]       # step and loss, to the bit
    assert abs(float(last["one"].split(",")[1]) / float(last["a"].split(",")[1]) - 1) <= 1e-6


@pytest.mark.slow
def test_a_tp_checkpoint_holds_whole_tensors_and_resumes_on_any_tp(tmp_path, capsys, monkeypatch):
    """A TP run's checkpoint is the model's whole tensors (its slices put back together): it
    continues bit for bit at tp = 2 and, up to rounding, at tp = 1."""
    from tests.reliability.cli import run_in_process
    monkeypatch.chdir(ROOT)
    base = ["mode=train", "model=tiny_hybrid", "train.pp=2", "train.microbatches=2", "train.plan=schedule",
            "schedule=1f1b", "train.steps=3"]
    code, err = run_in_process([*base, "train.tp=2", "train.checkpoint_every=2", f"hydra.run.dir={tmp_path / 'a'}"],
                               capsys)
    assert code == 0, err
    ckpt = tmp_path / "a" / "checkpoints" / "step_000002"
    for key, args in {"tp2": ["train.tp=2"], "tp1": []}.items():
        code, err = run_in_process([*base, *args, f"train.resume={ckpt}", f"hydra.run.dir={tmp_path / key}"], capsys)
        assert code == 0, err
    last = {k: float((tmp_path / k / "loss.csv").read_text().splitlines()[-1].split(",")[1])
            for k in ("a", "tp2", "tp1")}
    assert last["tp2"] == last["a"] and abs(last["tp1"] / last["a"] - 1) <= 1e-6, last
