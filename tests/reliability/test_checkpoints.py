"""Training checkpoints are never lost, overwritten or loaded damaged, a run stops at the first
non-finite value, and a resume never reports what did not run: each case through the CLI (one
line and exit 2 for what is refused) or on the checkpoint functions the CLI calls."""
from __future__ import annotations

import json
import os
import shutil
import sys
import textwrap
from pathlib import Path

import pytest

from octopipe.errors import ConfigError
from octopipe.train import checkpoint
from octopipe.train.checkpoint_dir import OWNER, claim
from tests.reliability.cli import ROOT, run_in_process, run_process

SMALL = ["mode=train", "model=module", "model.factory=examples/tiny_gpt.py:build", "model.seq_len=32",
         "model.micro_batch_size=2", "train.microbatches=4", "train.plan=schedule", "schedule=1f1b",
         "cost=profiled", "cost.repeats=1", "cost.warmup=0", "cost.cache_dir="]


def _train(capsys, run_dir: Path, *args: str) -> tuple[int, list[str]]:
    return run_in_process([*SMALL, *args, f"hydra.run.dir={run_dir}"], capsys)


@pytest.fixture(scope="module")
def first(tmp_path_factory):
    """A 4-step run saving every 2 steps into its run directory's default checkpoint folder, run
    from a scratch working directory (where the old default, runs/checkpoints, would land)."""
    base = tmp_path_factory.mktemp("ckpt")
    r = run_process([*SMALL, "train.steps=4", "train.checkpoint_every=2", f"hydra.run.dir={base / 'run'}"],
                    cwd=base)
    assert r.returncode == 0, r.stderr[-2000:]
    return base


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _step(first: Path, n: int) -> Path:
    return first / "run" / "checkpoints" / f"step_{n:06d}"


def test_checkpoints_go_under_the_run_directory_not_the_working_directory(first):
    assert sorted(p.name for p in (first / "run" / "checkpoints").glob("step_*")) == ["step_000002", "step_000004"]
    assert not (first / "runs" / "checkpoints").exists()
    summary = json.loads((first / "run" / "summary.json").read_text())
    assert summary["checkpoint"] == str(_step(first, 4))


def test_a_second_run_never_overwrites_another_runs_checkpoints(first, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    ckpt = first / "run" / "checkpoints"
    before = {p: p.read_bytes() for p in ckpt.rglob("*") if p.is_file()}
    code, err = _train(capsys, tmp_path / "second", "train.steps=2", "train.checkpoint_every=2",
                       f"train.checkpoint_dir={ckpt}")
    assert code == 2 and len(err) == 1 and "train.checkpoint_dir" in err[0] and "another run" in err[0], err
    assert {p: p.read_bytes() for p in ckpt.rglob("*") if p.is_file()} == before


def test_a_directory_in_use_by_a_live_run_is_refused(tmp_path):
    claim(tmp_path / "c", "run-a")
    (tmp_path / "c" / OWNER).write_text(json.dumps({"run": "a", "pid": os.getppid(),
                                                    "host": __import__("socket").gethostname()}))
    with pytest.raises(ConfigError, match="in use by another training run"):
        claim(tmp_path / "c", "run-b")


@pytest.mark.parametrize("where", ["file", "under_file", "proc"])
def test_an_unwritable_checkpoint_dir_is_refused_before_training(tmp_path, where):
    (tmp_path / "f").write_text("x")
    path = {"file": tmp_path / "f", "under_file": tmp_path / "f" / "c", "proc": Path("/proc/octopipe-ckpt")}[where]
    with pytest.raises(ConfigError, match=r"^train\.checkpoint_dir=.*(not a directory|cannot write)"):
        claim(path, "run")


def test_an_unwritable_checkpoint_dir_stops_the_cli_before_any_step(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    (tmp_path / "f").write_text("x")
    code, err = _train(capsys, tmp_path / "run", "train.steps=2", "train.checkpoint_every=1",
                       f"train.checkpoint_dir={tmp_path / 'f' / 'c'}")
    assert code == 2 and len(err) == 1 and err[0].startswith("octopipe: error: train.checkpoint_dir="), err
    assert not (tmp_path / "run" / "summary.json").exists()


def _damage(step: Path, how: str) -> None:
    shards = sorted(step.glob("*.distcp"))
    if how == "random_bytes":
        data = bytearray(shards[0].read_bytes())
        mid = len(data) // 2
        data[mid:mid + 4096] = os.urandom(4096)
        shards[0].write_bytes(bytes(data))
    elif how == "truncated_shard":
        shards[1].write_bytes(shards[1].read_bytes()[:-100])
    elif how == "missing_shard":
        shards[0].unlink()
    elif how == "swapped_shards":
        a, b = shards[0].read_bytes(), shards[1].read_bytes()
        shards[0].write_bytes(b)
        shards[1].write_bytes(a)
    elif how == "truncated_metadata":
        md = step / ".metadata"
        md.write_bytes(md.read_bytes()[:200])
    elif how == "negative_step":
        doc = json.loads((step / checkpoint.META).read_text())
        (step / checkpoint.META).write_text(json.dumps({**doc, "step": -3}))
    elif how == "edited_meta":
        doc = json.loads((step / checkpoint.META).read_text())
        doc["model_desc"]["seed"] = 7
        (step / checkpoint.META).write_text(json.dumps(doc))
    elif how == "not_json":
        (step / checkpoint.META).write_text("{ not json")
    elif how == "extra_file":
        (step / "__9_0.distcp").write_bytes(b"x")


DAMAGE = ["random_bytes", "truncated_shard", "missing_shard", "swapped_shards", "truncated_metadata",
          "negative_step", "edited_meta", "not_json", "extra_file"]


@pytest.mark.parametrize("how", DAMAGE)
def test_a_damaged_checkpoint_is_one_line_naming_what(first, tmp_path, how):
    step = _copy(_step(first, 2), tmp_path / "step_000002")
    _damage(step, how)
    with pytest.raises(ConfigError) as e:
        checkpoint.read_meta(step)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"train.resume={step}")
    named = {"random_bytes": ".distcp", "truncated_shard": "bytes", "missing_shard": "missing",
             "swapped_shards": ".distcp", "truncated_metadata": ".metadata", "negative_step": "step -3",
             "edited_meta": "edited", "not_json": "JSON", "extra_file": "__9_0.distcp"}[how]
    assert named in msg, msg


def test_a_corrupted_checkpoint_is_refused_by_the_cli_before_any_rank(first, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    step = _copy(_step(first, 2), tmp_path / "step_000002")
    _damage(step, "random_bytes")
    code, err = _train(capsys, tmp_path / "run", "train.steps=4", f"train.resume={step}")
    assert code == 2 and len(err) == 1 and "damaged" in err[0] and ".distcp" in err[0], err
    assert not (tmp_path / "run" / "summary.json").exists()


def test_the_intact_checkpoint_verifies(first):
    meta = checkpoint.read_meta(_step(first, 2))
    assert meta["verified"] and meta["step"] == 2 and set(meta["files"]) >= {".metadata", "plan.json"}


def test_a_resume_with_another_seed_says_seed(first, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    code, err = _train(capsys, tmp_path / "run", "train.steps=4", "seed=5", f"train.resume={_step(first, 2)}")
    assert code == 2 and len(err) == 1 and "seed 0 (this run: 5)" in err[0], err


def test_a_resume_on_another_pp_runs_it_reports_it_and_continues_the_loss(first, tmp_path, capsys, monkeypatch):
    """A pp=2 checkpoint resumed at train.pp=3: loaded by the model's names onto a 3-rank plan,
    reported as 3 ranks, ending within rounding of the uninterrupted pp=2 run."""
    monkeypatch.chdir(ROOT)
    code, err = _train(capsys, tmp_path / "run", "train.steps=4", "train.pp=3", f"train.resume={_step(first, 2)}")
    assert code == 0, err
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    whole = json.loads((first / "run" / "summary.json").read_text())
    assert s["pp"] == 3 and s["start_step"] == 2 and json.loads((tmp_path / "run" / "plan.json").read_text())
    assert abs(s["final_loss"] - whole["final_loss"]) <= 1e-4 * abs(whole["final_loss"]), (s, whole)


def test_a_resume_with_more_microbatches_reports_what_ran(first, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    code, err = _train(capsys, tmp_path / "run", "train.steps=3", "train.microbatches=8",
                       f"train.resume={_step(first, 2)}")
    assert code == 0, err
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["microbatches"] == 8 and s["pp"] == 2 and s["steps"] == 3


def test_a_resumed_run_reports_the_shape_it_ran(first, tmp_path, capsys, monkeypatch):
    """Resumed into the directory it came from: the unfinished save a killed rank left there is
    removed, the run continues and writes the next step beside the old ones."""
    monkeypatch.chdir(ROOT)
    ckpt = _copy(first / "run" / "checkpoints", tmp_path / "ckpt")
    shutil.rmtree(ckpt / "step_000004")
    (ckpt / "step_000004.tmp").mkdir()
    (ckpt / "step_000004.tmp" / "__0_0.distcp").write_bytes(b"partial")
    code, err = _train(capsys, tmp_path / "run", "train.steps=4", "train.checkpoint_every=2",
                       f"train.checkpoint_dir={ckpt}", f"train.resume={ckpt / 'step_000002'}")
    assert code == 0, err
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["pp"] == 2 and s["microbatches"] == 4 and s["start_step"] == 2
    assert sorted(p.name for p in ckpt.iterdir() if p.name.startswith("step_")) == ["step_000002", "step_000004"]
    assert checkpoint.read_meta(ckpt / "step_000004")["verified"]


def test_an_unfinished_save_is_not_a_checkpoint(tmp_path):
    (tmp_path / "step_000003.tmp").mkdir()
    with pytest.raises(ConfigError, match="unfinished checkpoint"):
        checkpoint.read_meta(tmp_path / "step_000003.tmp")


def test_a_resume_that_would_overwrite_a_later_step_is_refused(first):
    with pytest.raises(ConfigError, match="holds step_000004, after the resumed step 2"):
        claim(first / "run" / "checkpoints", "again", 2, str(_step(first, 2)))


def test_a_changed_factory_width_is_one_line_before_any_rank(tmp_path, capsys, monkeypatch):
    factory = tmp_path / "model.py"
    source = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT / 'examples')!r})
        from tiny_gpt import build as gpt

        def build(vocab=256):
            return gpt(vocab=vocab, width=WIDTH, depth=2, heads=2)
        """)
    factory.write_text(source.replace("WIDTH", "32"))
    args = [*SMALL[:2], f"model.factory={factory}:build", *SMALL[3:]]

    monkeypatch.chdir(ROOT)
    code, err = run_in_process([*args, "train.steps=2", "train.checkpoint_every=2", f"hydra.run.dir={tmp_path / 'a'}"],
                               capsys)
    assert code == 0, err[-20:]
    factory.write_text(source.replace("WIDTH", "48"))
    for name in [n for n, m in sys.modules.items() if getattr(m, "__file__", None) == str(factory)]:
        monkeypatch.delitem(sys.modules, name)                 # the edited file is read again, as a new process would
    code, err = run_in_process([*args, "train.steps=4",
                                f"train.resume={tmp_path / 'a' / 'checkpoints' / 'step_000002'}",
                                f"hydra.run.dir={tmp_path / 'b'}"], capsys)
    assert code == 2 and len(err) == 1 and "has shape" in err[0] and "in this model" in err[0], err


def test_pipedream_refuses_checkpoints_inside_its_stream(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    code, err = _train(capsys, tmp_path / "run", "schedule=pipedream", "train.steps=4", "train.checkpoint_every=1")
    assert code == 2 and len(err) == 1 and err[0].startswith("octopipe: error: train.checkpoint_every=1"), err


POISON = """
import sys
sys.path.insert(0, {examples!r})
import torch
from torch import nn
from tiny_gpt import build as gpt


class Poison(nn.Module):
    '''The identity for its first {after} forwards in a process, then NaN.'''

    def __init__(self):
        super().__init__()
        self.g = nn.Parameter(torch.ones(()))
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return x * self.g * (float("nan") if self.calls > {after} else 1.0)


def build(vocab=256):
    blocks = list(gpt(vocab=vocab, width=32, depth=2, heads=2))
    return blocks[:2] + [Poison()] + blocks[2:]
"""


def test_a_nan_loss_stops_the_run_naming_step_and_stage_and_keeps_the_last_good_checkpoint(tmp_path, capsys,
                                                                                         monkeypatch):
    monkeypatch.chdir(ROOT)
    factory = tmp_path / "poison.py"
    factory.write_text(POISON.format(examples=str(ROOT / "examples"), after=8))   # 4 micro-batches a step
    code, err = run_in_process([*SMALL[:2], f"model.factory={factory}:build", *SMALL[3:], "train.steps=5",
                                "train.checkpoint_every=1", f"hydra.run.dir={tmp_path / 'run'}"], capsys)
    assert code == 2 and len(err) == 1, err
    assert "training stopped at step 3" in err[0] and "stage 0 (blocks 0-2)" in err[0], err
    last = tmp_path / "run" / "checkpoints" / "step_000002"
    assert str(last) in err[0] and checkpoint.read_meta(last)["verified"]
    assert not (tmp_path / "run" / "checkpoints" / "step_000003").exists()
    assert not (tmp_path / "run" / "summary.json").exists()
