"""Input that would exhaust the machine, hang or be silently ignored is refused up front in one
line naming the field, and every message names the field the user set."""
from __future__ import annotations

import os
import time
from types import SimpleNamespace

import pytest

from octopipe.config.fields import Bounds
from octopipe.cost.profile_format import parse_csv
from octopipe.errors import ConfigError
from octopipe.runtime.launch import _action_of
from octopipe.schedule.library import build_schedule
from octopipe.train.data import load_corpus
from tests.reliability.cli import ROOT, results_in, run_in_process

TRAIN = ["mode=train", "model=module", "model.factory=examples/tiny_gpt.py:build", "model.seq_len=16",
         "model.micro_batch_size=2", "train.microbatches=4", "cost=profiled", "cost.repeats=1", "cost.warmup=0",
         "cost.cache_dir="]


@pytest.fixture
def cli(tmp_path, capsys, monkeypatch):
    """Run the CLI in this process; assert one line on stderr (with `grid`, then the marked table),
    exit 2 and no result files."""
    monkeypatch.chdir(ROOT)

    def run(*argv: str, grid: bool = False) -> str:
        out = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
        t0 = time.monotonic()
        code, err = run_in_process([*argv, f"hydra.run.dir={out}"], capsys)
        lines = len(err) if not grid else 1     # a table error adds the marked grid below its line
        assert code == 2 and lines == 1 and err[0].startswith("octopipe: error: "), (code, err)
        assert results_in(out) == [] and time.monotonic() - t0 < 120
        return err[0][len("octopipe: error: "):]
    return run


def test_a_tiny_csv_naming_a_huge_index_is_one_line_without_the_memory(cli, tmp_path):
    path = tmp_path / "huge.csv"
    path.write_text("0F0,99999999999999999999F0,0B0\n1F0,1B0\n")
    msg = cli("mode=simulate", f"schedule.file={path}", grid=True)
    assert "stage 99999999999999999999 is out of range" in msg and "no cell names stage 2..99999999999999999998" in msg


def test_a_schedule_file_too_large_for_the_work_limit_is_refused_before_reading(cli, tmp_path):
    path = tmp_path / "big.csv"
    path.write_text("0F0,0B0\n1F0,1B0\n" * 50)
    msg = cli("mode=simulate", f"schedule.file={path}", "sim.max_actions=10")
    assert msg.startswith(f"schedule.file='{path}'") and "above sim.max_actions=10" in msg


@pytest.mark.parametrize("kind", ["fifo", "loop"])
def test_a_special_schedule_file_is_named_for_what_it_is(cli, tmp_path, kind):
    path = tmp_path / "table.csv"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        os.symlink(tmp_path / "other.csv", path)
        os.symlink(path, tmp_path / "other.csv")
    msg = cli("mode=simulate", f"schedule.file={path}")
    assert ("a FIFO (named pipe), not a regular file" if kind == "fifo" else "a symbolic link loop") in msg


@pytest.mark.parametrize("kind", ["fifo", "dev_zero"])
def test_a_special_corpus_is_refused_not_read(tmp_path, kind):
    path = "/dev/zero" if kind == "dev_zero" else str(tmp_path / "corpus.txt")
    if kind == "fifo":
        os.mkfifo(path)
    with pytest.raises(ConfigError, match="not a regular file"):
        load_corpus(path)


def test_a_corpus_above_the_limit_is_refused_before_reading(tmp_path):
    (tmp_path / "a.txt").write_text("hello world " * 1000)
    with pytest.raises(ConfigError, match=r"train.corpus=.*above the 0.001 MB limit \(train.max_corpus_mb\)"):
        load_corpus(str(tmp_path), max_mb=0.001)
    with pytest.raises(ConfigError, match="train.max_corpus_mb"):
        load_corpus(str(tmp_path / "a.txt"), max_mb=0.001)


def test_training_work_is_bounded_before_it_starts(cli):
    assert cli(*TRAIN, "train.microbatches=2000", "train.steps=5000").startswith("train.timeout_s=1800: the run "
                                                                                 "would take about")
    msg = cli("mode=train", "train.model=llama3_8b")
    assert msg.startswith("train.model: llama3_8b has 8.03B parameters") and "GiB" in msg
    msg = cli(*TRAIN, "train.microbatches=200000", "train.plan=schedule", "schedule=gpipe", "train.steps=1",
              "train.timeout_s=1e9", "sim.max_actions=10000000")
    assert msg.startswith("train.microbatches=200000: plan gpipe would hold about")


@pytest.mark.parametrize("argv,start", [
    (("mode=train", "seed=99999999999999999999"), "seed=99999999999999999999: out of range; valid: >= 0 and < "
                                                  "9223372036854775808"),
    (("mode=execute", "seed=99999999999999999999"), "seed=99999999999999999999: out of range"),
    (("mode=layout", "layout.micro_batch_sizes=[]"), "layout.micro_batch_sizes=[]: give at least 1 item"),
    (("experiment=tabular", "experiment.stages=[]"), "experiment.stages=[]: give at least 1 item"),
    (("experiment=tabular", "experiment.schedules=[bogus]"), "experiment.schedules[0]=bogus: unknown schedule"),
    (("experiment=tabular", "experiment.driver=os"), "experiment.driver=os: the module has no run(inputs)"),
    (("experiment=layouts", "experiment.cases=[]"), "experiment.cases=[]: give at least 1 item"),
    (("experiment=ablation", "experiment.models=[]", "experiment.profiles=[]"),
     "experiment.models and experiment.profiles are both empty"),
    (("experiment=octopipe_authors", "experiment.profiles=[bogus]"), "experiment.profiles[0]=bogus: not a shipped"),
    (("tuner.time_budget_s=inf",), "tuner.time_budget_s=inf: must be a finite number > 0"),
    (("tuner.time_budget_s=1e309",), "tuner.time_budget_s=inf: must be a finite number > 0 (a value beyond"),
    (("mode=train", "train.pp=7"), "train.pp=7 exceeds the 6 blocks"),
])
def test_bad_values_are_one_line_naming_the_field(cli, argv, start):
    assert cli(*argv).startswith(start)


def test_a_pp_the_schedule_file_does_not_have_is_refused_by_execute(cli, tmp_path):
    path = tmp_path / "two.csv"
    path.write_text("0F0,0B0\n1F0,1B0\n")
    msg = cli("mode=execute", "pp=3", f"schedule.file={path}", "runtime.compute=emulated")
    assert msg == f"pp=3 but schedule.file '{path}' has 2 ranks; drop pp or set pp=2"


def test_a_training_time_limit_is_named_as_train_timeout_s(cli):
    assert cli(*TRAIN, "train.timeout_s=0.001", "train.steps=3", "train.plan=schedule").startswith(
        "train.timeout_s=0.001: the run would take about")


def test_a_profile_naming_a_column_twice_says_so():
    with pytest.raises(ConfigError, match="the header names column f_ms twice"):
        parse_csv("f_ms,b_ms,f_ms\n1,2,3\n", "p.csv")


def test_where_a_waiting_rank_stands_reads_naturally():
    table = build_schedule("1f1b", 4, 8)
    control = SimpleNamespace(world=4, status=lambda r: (0, 0, 2, True, False))
    where = _action_of(control, table, 3)
    assert where == f"{table.actions(3)[2]} (iteration 0, position 3/{len(table.actions(3))} in its row, waiting for " \
                    f"its inputs)"
    assert Bounds(ge=0, lt=2 ** 63).text() == ">= 0 and < 9223372036854775808"


def test_the_bpe_vocabulary_message_names_model_vocab():
    pytest.importorskip("tokenizers")
    from octopipe.train.tokenizer import tokenize
    with pytest.raises(ConfigError, match=r"model.vocab=256 leaves no room for merges.*set model.vocab above 256"):
        tokenize(load_corpus(""), "bpe", 256)
