"""Messages that misled and work that ran unbounded: each now says
what is wrong, where, and what to do, in one line (plus a marked grid for table errors)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from octopipe.errors import ScheduleError
from octopipe.schedule.csv_io import read_csv_text
from octopipe.schedule.table import ScheduleTable
from octopipe.schedule.validate import validate
from tests.reliability.cli import results_in, run_in_process

SIM = ["mode=simulate", "model=tiny_hybrid"]


def fails(argv: list[str], tmp_path: Path, capsys) -> str:
    """The CLI's error for `argv`: exit 2, no traceback, no results; its first stderr line."""
    run = tmp_path / "run"
    code, lines = run_in_process([*argv, f"hydra.run.dir={run}"], capsys)
    assert code == 2, lines
    assert lines and lines[0].startswith("octopipe: error: ") and not any("Traceback" in ln for ln in lines)
    assert results_in(run) == []
    return lines[0]


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_trailing_blank_lines_of_a_csv_are_not_ranks():
    table = read_csv_text("0F0,0F1,0B0,0B1\n1F0,1F1,1B0,1B1\n\n\n")
    assert table.n_devices == 2


@pytest.mark.parametrize("rows, cell, words", [
    ("0F0,0F1,0B0,0B1\n1F0,5F0,1B0,1B1\n", ">5F0<", ["'5F0'", "stage 5", "row 1", "column 1"]),
    ("0F0,0F1,0B0,0B1\n1F0,1F9,1B0,1B1\n", ">1F9<", ["'1F9'", "micro-batch 9", "row 1", "column 1"]),
])
def test_an_out_of_range_cell_is_named_and_marked(rows, cell, words):
    with pytest.raises(ScheduleError) as e:
        read_csv_text(rows)
    head, *grid = str(e.value).splitlines()
    for w in words:
        assert w in head, head
    assert [ln for ln in grid if ">" in ln] == [ln for ln in grid if cell in ln] and len(grid) == 2


def test_a_three_device_cycle_is_listed_and_every_cell_marked():
    table = ScheduleTable.from_strings([["0F0", "0B0", "3F0", "3B0"], ["1F0", "1B0"], ["2F0", "2B0"]],
                                       (0, 1, 2, 0), 1)
    with pytest.raises(ScheduleError) as e:
        validate(table)
    head, *grid = str(e.value).splitlines()
    assert "0B0 (device 0) needs 1B0 (device 1), which needs 2B0 (device 2), which needs 3B0 (device 0)" in head
    assert "device(s) 0, 1, 2" in head
    for cell in ("0B0", "3F0", "3B0", "1B0", "2B0"):
        assert f">{cell}<" in "\n".join(grid), grid


def test_pp_against_a_schedule_file_of_another_rank_count(tmp_path, capsys):
    csv = write(tmp_path, "two.csv", "0F0,0F1,0B0,0B1\n1F0,1F1,1B0,1B1\n")
    line = fails([*SIM, "pp=4", f"schedule.file={csv}"], tmp_path, capsys)
    assert "pp=4" in line and "2 ranks" in line


def test_an_unknown_profile_label_is_refused_by_simulate(tmp_path, capsys):
    prof = write(tmp_path, "odd.csv", "# name: odd\n# hidden: 1024\nlabel,f_ms,b_ms\n*,1,2\nQ,1,2\n-,1,2\n*,1,2\n")
    line = fails([*SIM, "pp=2", "microbatches=4", "cost=file", f"cost.path={prof}"], tmp_path, capsys)
    assert "'Q'" in line


def test_simulate_with_a_profile_records_the_profile_s_model(tmp_path, capsys):
    run = tmp_path / "run"
    code, _ = run_in_process([*SIM, "pp=2", "microbatches=4", "cost=file", "cost.preset=gpt_13b",
                              f"hydra.run.dir={run}"], capsys)
    assert code == 0
    assert json.loads((run / "summary.json").read_text())["model"] == "gpt-13B"


def test_compare_with_more_stages_than_layers_says_so(tmp_path, capsys):
    line = fails(["mode=compare", "model=tiny_hybrid", "pp=8", "chunks=2", "microbatches=16"], tmp_path, capsys)
    assert "no named schedule applies" in line and "layers" in line and "deadlock" not in line


def test_compare_on_a_model_that_fits_nowhere_refuses_to_rank(tmp_path, capsys):
    line = fails(["mode=compare", "model=llama3_8b", "pp=8", "microbatches=8", "model.seq_len=131072",
                  "sim.seeds=1"], tmp_path, capsys)
    assert "no schedule fits memory" in line and "GiB" in line


def test_plan_s_memory_message_counts_the_activations(tmp_path, capsys):
    # nothing fits, so the search runs to its wall-clock cap; the message is the model's sums
    line = fails(["mode=plan", "model=llama3_8b", "pp=8", "microbatches=8", "model.seq_len=131072",
                  "tuner.time_budget_s=1"], tmp_path, capsys)
    assert "activations" in line and "(plus activations)" not in line
    need, have = line.split(" GiB at least, against ")
    assert float(need.rsplit(" ", 1)[1]) > float(have.split(" GiB")[0])   # what it quotes does not fit


@pytest.mark.parametrize("mode, mbs", [("simulate", 100_000_000), ("compare", 1_000_000)])
def test_unbounded_simulations_are_refused_up_front_with_the_override(mode, mbs, tmp_path, capsys):
    line = fails([f"mode={mode}", "model=tiny_hybrid", f"microbatches={mbs}"], tmp_path, capsys)
    assert "sim.max_actions=" in line and f"{mbs} micro-batches" in line


def test_max_inflight_counts_micro_batches_so_one_runs_zbv_on_two_devices(tmp_path, capsys):
    """`sim.max_inflight` counted forward actions while its doc said micro-batches, so 1 deadlocked
    ZB-V on 2 devices (a V-shaped device holds two stages of each micro-batch)."""
    run = tmp_path / "run"
    code, err = run_in_process([*SIM, "schedule=zbv", "pp=2", "microbatches=4", "sim.policy=ready_first",
                                "sim.max_inflight=1", f"hydra.run.dir={run}"], capsys)
    assert code == 0, err
    assert json.loads((run / "summary.json").read_text())["makespan_s"] > 0
