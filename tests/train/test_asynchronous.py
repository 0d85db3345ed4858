"""mode=train with schedule=pipedream*: the runtime's asynchronous training (one stream, AdamW
per backward or 2BW window through the weight stash) equals its single-process replay, differs
from the synchronous run, resumes from an end-of-stream checkpoint, and bad input is one line."""
from __future__ import annotations

import json
import tempfile
from dataclasses import replace

import pytest
import torch
from hydra import compose, initialize_config_dir

from octopipe.asynchronous.runtime import WeightStash
from octopipe.asynchronous.tables import Rule
from octopipe.config.loader import load
from octopipe.config.runtime import RuntimeConfig
from octopipe.config.store import register
from octopipe.errors import ConfigError
from octopipe.io import CONF_DIR
from octopipe.plan import Partition, Plan
from octopipe.runtime.job import Job
from octopipe.schedule.library import SCHEDULE_PRESETS
from octopipe.train.loop import TrainSpec, launch_training, reference_train
from octopipe.train.stream import Stream, StreamBatches, check_async, replay_training
from tests.reliability.cli import run_in_process
from tests.train.helpers import OPTIM, ROOT, batches, gpt
from tests.train.test_launch import SMALL


def _rel(a: float, b: float) -> float:
    return abs(a - b) / abs(b)


@pytest.mark.parametrize("rule", [Rule.PD, Rule.TWO_BW])
def test_runtime_stream_equals_its_single_process_replay(rule):
    blocks, data = gpt(), batches(16, 2)
    st = Stream(rule, 2, 4, 0, 4, 2 if rule is Rule.TWO_BW else 1)
    sched = st.schedule()
    part = Partition.uniform(4, 2)
    with tempfile.TemporaryDirectory() as d:
        job = Job(Plan(part, sched.table.compact()), blocks, RuntimeConfig(dispatch="strict", timeout_s=240,
                                                                          stall_s=120),
                  weights=WeightStash(sched, OPTIM.lr), data=StreamBatches(data, 4, 0))
        run = launch_training(job, TrainSpec(OPTIM, 4, stream=st), d)
    ref = replay_training(blocks, part.ranges, [st], data, OPTIM)
    assert len(run.losses) == 4 and len(run.records) == 4 and len(run.microbatch_losses) == 16
    assert max(_rel(a, b) for a, b in zip(run.losses, ref.losses)) <= 1e-5
    assert max(_rel(run.microbatch_losses[k], v) for k, v in ref.microbatch_losses.items()) <= 1e-5
    for name, w in ref.params.items():
        assert float((run.params[name] - w).norm() / w.norm()) <= 1e-5, name
    # one stream, never flushed: every action ran in iteration 0, 16 micro-batches per stage
    acts = [e for ev in run.events for e in ev if "action" in e]
    assert {e["it"] for e in acts} == {0} and len(acts) == 2 * 2 * 16
    # and it is not the synchronous training (stale reads and per-backward updates change it)
    sync = reference_train(blocks, data, 4, OPTIM, 4)
    assert abs(sync.losses[-1] - run.losses[-1]) > 1e-4
    assert any(not torch.allclose(sync.params[n], run.params[n]) for n in sync.params)


def _cfg(*overrides):
    register(SCHEDULE_PRESETS)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return load(compose("config", overrides=["mode=train", *overrides]))


def test_what_a_stream_cannot_train_is_refused_by_field():
    base = _cfg("schedule=pipedream")
    t, rt = base.train, base.runtime

    def cfg(schedule: str = "pipedream", file=None, runtime=rt, **train):
        return replace(base, schedule=replace(base.schedule, name=schedule, file=file), runtime=runtime,
                       train=replace(t, **train))
    for c, field in [(cfg(pp=4, microbatches=2), "train.microbatches=2"),
                     (cfg("pipedream_2bw", pp=2, microbatches=5), "train.microbatches=5"),
                     (cfg(runtime=replace(rt, tp=2)), "runtime.tp=2"),
                     (cfg(dispatch="ready_first"), "train.dispatch=ready_first"),
                     (cfg(precision="bf16"), "train.precision=bf16"),
                     (cfg("pipedream_vsync", file="plan.json"), "schedule.file=plan.json"),
                     (cfg(steps=20, checkpoint_every=10), "train.checkpoint_every=10")]:
        with pytest.raises(ConfigError) as e:
            check_async(c)
        assert str(e.value).startswith(field) and "\n" not in str(e.value)
    check_async(cfg(steps=20, checkpoint_every=10), start=10)      # the stream's end: allowed
    check_async(cfg("1f1b", microbatches=1))                      # synchronous: not this check's


@pytest.mark.slow
def test_mode_train_pipedream_front_door_and_resume(tmp_path, capsys, monkeypatch):
    """Both runs through the CLI's main in this process (torch, the forkserver and Hydra already
    up): the same front door as `python -m octopipe.run`, without an interpreter per run."""
    monkeypatch.chdir(ROOT)

    def cli(*args):
        return run_in_process(["mode=train", *SMALL, "schedule=pipedream", "train.check_reference=true",
                               f"train.checkpoint_dir={tmp_path / 'ckpt'}", *args], capsys)
    code, err = cli("train.steps=3", "train.checkpoint_every=3", f"hydra.run.dir={tmp_path / 'a'}")
    assert code == 0, err[-20:]
    s = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert s["plan"] == "pipedream" and s["asynchronous"]["flushes"] == 0
    assert s["asynchronous"]["stream_microbatches"] == 12 and s["asynchronous"]["versions_held"] == [2, 1]
    assert s["reference"].startswith("single-process replay") and s["reference_max_rel_err"] <= 1e-5
    code, err = cli("train.steps=5", f"train.resume={tmp_path / 'ckpt' / 'step_000003'}",
                    f"hydra.run.dir={tmp_path / 'b'}")
    assert code == 0, err[-20:]
    s = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert s["start_step"] == 3 and s["steps"] == 5 and s["reference_max_rel_err"] <= 1e-5


def test_cli_refuses_bad_asynchronous_input_in_one_line(capsys, tmp_path):
    code, err = run_in_process(["mode=train", "schedule=pipedream", "train.microbatches=1",
                                f"hydra.run.dir={tmp_path}"], capsys)
    assert code == 2 and len(err) == 1
    assert err[0].startswith("octopipe: error: train.microbatches=1: schedule=pipedream needs at least")
