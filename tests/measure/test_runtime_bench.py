"""The runtime benchmark's arithmetic on hand-made summaries, and one quick launch."""
import json

import pytest

from octopipe.measure.bench.runtime import main, markdown, median_rows, overrides, row_of


def _summary(measured: float, cpu: float | None) -> dict:
    ranks = [{"span_s": 2.0, "waiting_s": 0.5, "cpu_beyond_compute_s": cpu},
             {"span_s": 2.0, "waiting_s": 1.0, "cpu_beyond_compute_s": None if cpu is None else cpu / 2}]
    return {"measured_iteration_s": measured, "simulated_iteration_s": 1.0, "fidelity_error": 0.1,
            "schedules": {"1f1b": {"rank_time": {"ranks": ranks, "dispatch_us": 40.0, "transport_us": 300.0,
                                                 "idle_share": 0.3}}}}


def test_row_reads_the_first_schedule_and_derives_shares():
    r = row_of(_summary(1.1, 0.4), (4, "strict", "real"))
    assert (r["ranks"], r["dispatch"], r["compute"]) == (4, "strict", "real")
    assert r["measured_s"] == 1.1 and r["error"] == 0.1 and r["transport_us"] == 300.0
    assert r["waiting_share"] == pytest.approx((0.25 + 0.5) / 2)
    assert r["cpu_beyond_compute_s"] == 0.4
    assert row_of(_summary(1.1, None), (2, "strict", "emulated"))["cpu_beyond_compute_s"] is None


def test_median_over_rounds_per_setting_and_markdown():
    s = (8, "ready_first", "emulated")
    rounds = [[row_of(_summary(m, None), s)] for m in (3.0, 1.0, 2.0)]
    (row,) = median_rows(rounds)
    assert row["measured_s"] == 2.0 and row["cpu_beyond_compute_s"] is None
    text = markdown([row])
    assert "| 8 | ready_first | emulated | 2.0000 | 1.0000 | 10.0% | 40 | 300 | 30.0% |" in text


def test_overrides_use_sixteen_microbatches_at_eight_ranks():
    assert "microbatches=16" in overrides(8, "strict", "real")
    assert "microbatches=8" in overrides(2, "strict", "real")


def test_quick_run_writes_results(tmp_path):
    doc = main(["--quick", "--out", str(tmp_path)])
    saved = json.loads((tmp_path / "results.json").read_text())
    (row,) = saved["rows"]
    assert row == doc["rows"][0] and row["ranks"] == 2 and row["measured_s"] > 0
    assert 0 <= row["idle_share"] < 1 and (tmp_path / "results.md").read_text().startswith("| ranks")
