"""`mode=plan target=...`, `mode=export` and the stack configurations `mode=simulate` reads,
through the CLI: the summary keys, the export/ files, and bad input as one line with exit 2."""
from __future__ import annotations

import json

import pytest

from tests.reliability.cli import ROOT, main_in_process, results_in, run_in_process

FAST = ["tuner.max_evaluations=300", "tuner.finalists=2", "tuner.polish_sims=4", "tuner.ilp=false"]
TINY = ["model=tiny_hybrid", "pp=2", "microbatches=4", *FAST]


@pytest.fixture
def run(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)

    def go(*argv: str) -> dict:
        out = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
        ran = main_in_process([*argv, f"hydra.run.dir={out}"], capsys)
        assert ran.returncode == 0, ran.stderr
        return {"dir": out, **json.loads((out / "summary.json").read_text())}
    return go


@pytest.fixture
def refused(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)

    def go(*argv: str) -> str:
        out = tmp_path / f"bad{len(list(tmp_path.iterdir()))}"
        code, err = run_in_process([*argv, f"hydra.run.dir={out}"], capsys)
        assert code == 2 and len(err) == 1 and err[0].startswith("octopipe: error: "), (code, err)
        assert results_in(out) == []
        return err[0][len("octopipe: error: "):]
    return go


def test_plan_for_a_target_reports_both_plans_and_writes_its_files(run):
    s = run("target=megatron", *TINY)
    assert s["target"] == "megatron" and s["makespan_s"] >= s["free_makespan_s"] > 0
    assert s["target_speedup_vs_best_baseline"] >= 1.0 - 1e-12
    assert s["costliest_rule"] in ("granularity", "placement", "schedule", None)
    assert "leaves" in s["target_note"] and s["export"] == ["export/megatron.json"]
    doc = json.loads((s["dir"] / "export/megatron.json").read_text())
    assert doc["hybrid_layer_pattern"].replace("|", "") == "M-*-M-*-M-"    # tiny_hybrid's M-*-m-S-M-
    assert (s["dir"] / "free_plan.json").is_file() and (s["dir"] / "plan.json").is_file()
    again = run("mode=export", f"plan={s['dir'] / 'plan.json'}", "target=torchtitan", "model=tiny_hybrid")
    assert again["export"][0] == "export/torchtitan.json" and again["runnable_by"]["megatron"] == "yes"


def test_simulate_reads_a_megatron_layout_and_compares(run):
    s = run("mode=simulate", "model=tiny_moe", "pp=2", "microbatches=4", *FAST,
            "schedule.megatron_layout='Ett|ttL'")
    c = s["comparison"]
    assert c["imported"] == "megatron" and c["imported_makespan_s"] == pytest.approx(s["makespan_s"])
    assert c["target_plan_makespan_s"] <= c["imported_makespan_s"] * (1 + 1e-12)
    assert c["free_makespan_s"] <= c["target_plan_makespan_s"]


def test_bad_target_input_is_one_line(refused, tmp_path):
    assert "target" in refused("target=titan", *TINY)
    assert refused("mode=export", "model=tiny_hybrid").startswith("plan: mode=export needs plan=PATH")
    assert "encoder" in refused("target=megatron", "model=tiny_vlm", "pp=2", "microbatches=4", *FAST)
    msg = refused("mode=simulate", "model=tiny_moe", "pp=2", "schedule.megatron_layout='Et|tx|L'")
    assert "position 4: unknown layer symbol 'x'" in msg
    msg = refused("mode=simulate", "model=tiny_moe", "pp=2", "schedule.torchtitan_fqns=[[tok_embeddings],[layer.0]]")
    assert "'layer.0', which is not a module" in msg
    assert "one stage per rank" in refused("mode=simulate", "model=tiny_moe", "pp=2",
                                           "schedule.deepspeed_parts=[0,1,3,6]")
    assert "end at 6, the model's module count" in refused("mode=simulate", "model=tiny_moe", "pp=2",
                                                          "schedule.deepspeed_parts=[0,1,4]")


def test_a_target_that_cannot_run_the_asked_stages_per_rank_is_refused_before_searching(refused):
    assert refused("target=deepspeed", "chunks=2", "model=tiny_moe", "pp=2").startswith(
        "chunks=2: DeepSpeed PipelineModule (parts) runs 1 stage(s) per rank")
    assert "needs at least one of the model's 6 decoder layers" in refused(
        "target=torchtitan", "chunks=2", "model=tiny_moe", "pp=4")


@pytest.mark.parametrize("model, first", [("module", ["0", "1"]), ("hf", ["model.embed_tokens", "model.layers.0"])])
def test_a_user_models_plan_exports_under_its_own_module_names(run, tmp_path, model, first):
    from octopipe.plan import Partition, Plan
    from octopipe.plan_io import save_plan
    from octopipe.schedule.library import build_schedule
    path = save_plan(Plan(Partition((2, 2)), build_schedule("1f1b", 2, 4), model="tiny_gpt"), tmp_path / "p.json")
    s = run("mode=export", f"plan={path}", "target=torchtitan", f"model={model}")
    doc = json.loads((s["dir"] / "export/torchtitan.json").read_text())
    assert doc["module_fqns_per_model_part"][0] == first
