"""mode=train end to end (profile, tune, train, files) and the 2-rank torchrun smoke test."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from octopipe.runtime.pinning import can_pin, core_ids, pin_map
from octopipe.runtime.tensor_parallel import free_port
from tests.reliability.cli import run_in_process
from tests.train.helpers import ROOT

SMALL = ["model=module", "model.factory=examples/tiny_gpt.py:build", "model.seq_len=32",
         "model.micro_batch_size=2", "train.microbatches=4", "train.tune_s=1", "cost=profiled",
         "cost.repeats=1", "cost.warmup=0", "cost.cache_dir=", "train.trial_steps=2"]


def test_mode_train_writes_its_files_and_matches_the_reference(tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    monkeypatch.chdir(ROOT)                            # both runs through the CLI's main in this process
    code, err = run_in_process(["mode=train", *SMALL, "train.steps=6", "train.check_reference=true",
                                "train.checkpoint_every=3", f"train.checkpoint_dir={tmp_path / 'ckpt'}",
                                f"hydra.run.dir={out}"], capsys)
    assert code == 0, err[-20:]
    s = json.loads((out / "summary.json").read_text())
    assert s["steps"] == 6 and s["final_loss"] < s["initial_loss"] and s["tokens_per_s"] > 0
    assert s["reference_max_rel_err"] <= 1e-5
    trial = s.get("plan_trial")
    if trial is None:                                  # the tuner's plan is the fastest named schedule
        assert s["plan"] == "octopipe"
    else:                                              # the plan measured faster trained
        assert trial["candidates"][0] == "octopipe" and trial["steps"] == 2
        assert trial["chosen"] == trial["candidates"][min((0, 1), key=trial["measured_step_s"].__getitem__)]
        assert (s["plan"] == "octopipe") == (trial["chosen"] == "octopipe")
    assert s["checkpoint"].endswith("step_000006")
    assert len(s["memory_measured_bytes"]) == len(s["memory_simulated_bytes"]) and s["memory_max_rel_err"] >= 0
    assert s["pinned"] == (list(pin_map(s["world"], core_ids())) if can_pin() else None)    # as mode=execute
    assert (tmp_path / "ckpt" / "step_000003" / "plan.json").is_file()
    assert len((out / "loss.csv").read_text().splitlines()) == 7
    assert {"loss.png", "plan.json", "schedule.csv"} <= {p.name for p in out.iterdir()}
    # the refused resume (it fails before profiling)
    code, err = run_in_process(["mode=train", *SMALL, "train.steps=6", "model.seq_len=16",
                                f"train.resume={tmp_path / 'ckpt' / 'step_000003'}",
                                f"hydra.run.dir={tmp_path / 'bad'}"], capsys)
    assert code == 2 and len(err) == 1 and "the checkpoint is of another model" in err[0], err


def test_torchrun_two_ranks(tmp_path):
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                        "-m", "octopipe.train", *SMALL, "train.steps=3", "train.plan=schedule",
                        "schedule=1f1b", f"hydra.run.dir={tmp_path}"],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["launcher"] == "torchrun" and s["steps"] == 3 and s["plan"] == "1f1b"
    assert s["final_loss"] < s["initial_loss"]


def _losses(path) -> list[float]:
    return [float(line.split(",")[1]) for line in path.read_text().splitlines()[1:]]


@pytest.mark.slow
def test_two_torchrun_agents_train_dp2_pp2_as_the_local_launch(tmp_path):
    """Two torchrun agents on this machine stand in for two nodes (c10d rendezvous on
    127.0.0.1): dp = 2 x pp = 2 gives the local launch's losses."""
    args = [*SMALL, "train.microbatches=2", "train.steps=3", "train.plan=schedule", "schedule=1f1b", "train.dp=2",
            "train.pp=2"]
    port = free_port()
    agents = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=2",
                                f"--node-rank={n}", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
                                "--rdzv-id=octopipe-test", "-m", "octopipe.train", *args,
                                f"hydra.run.dir={tmp_path / 'torchrun'}"],
                               cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
              for n in range(2)]
    for a in agents:
        _, err = a.communicate(timeout=300)
        assert a.returncode == 0, err[-2000:]
    local = subprocess.run([sys.executable, "-m", "octopipe.run", "mode=train", *args,
                            f"hydra.run.dir={tmp_path / 'local'}"], capture_output=True, text=True, cwd=ROOT,
                           timeout=300)
    assert local.returncode == 0, local.stderr[-2000:]
    s = json.loads((tmp_path / "torchrun" / "summary.json").read_text())
    assert (s["world"], s["dp"], s["pp"]) == (4, 2, 2)
    a, b = _losses(tmp_path / "torchrun" / "loss.csv"), _losses(tmp_path / "local" / "loss.csv")
    assert len(a) == len(b) == 3 and max(abs(x - y) / abs(y) for x, y in zip(a, b)) <= 1e-6, (a, b)
