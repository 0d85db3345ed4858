"""Exported plans, read back by the stacks' own code: torch's schedule validator and lowering,
Megatron's layout parser, torchtitan's config dataclasses; and the exported torch CSV trained in
torch's runtime to our runtime's losses."""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from octopipe.errors import ConfigError
from octopipe.interop.export import ExportError, export_files
from octopipe.interop.target_plan import plan_target
from octopipe.interop.targets import TARGETS
from octopipe.interop.validate import deepspeed_accepts, megatron_accepts, torch_accepts, torchtitan_accepts
from octopipe.plan import Partition, Plan
from octopipe.schedule.csv_io import read_csv
from octopipe.schedule.library import build_schedule
from tests.interop.helpers import SSM, case, small_model


def check_export(target: str, plan: Plan, units, mbs: int = 1) -> dict[str, str]:
    files = export_files(plan, target, units, mbs)
    t = plan.table
    if target == "torch":
        doc = json.loads(files["torch.json"])
        torch_accepts(files["torch_schedule.csv"], doc["stage_to_rank"], t.n_microbatches)
        assert [tuple(s["layers"]) for s in doc["stages"]] == list(plan.partition)
    elif target == "torchtitan":
        doc = json.loads(files["torchtitan.json"])
        torch_accepts(files["torchtitan_schedule.csv"], list(t.placement), t.n_microbatches)
        torchtitan_accepts(doc, files["torchtitan.toml"])
        flat = [n for part in doc["module_fqns_per_model_part"] for n in part]
        assert flat == [n for names in units.names for n in names]
    elif target == "megatron":
        doc = json.loads(files["megatron.json"])
        if "pipeline_model_parallel_layout" in doc:
            pytest.importorskip("megatron.core")
            assert megatron_accepts(doc) == "accepted"
        else:
            assert doc["hybrid_layer_pattern"].replace("|", "") == "".join(units.symbols[1:-1])
            assert doc["hybrid_layer_pattern"].count("|") == t.n_stages - 1
    else:
        doc = json.loads(files["deepspeed.json"])
        deepspeed_accepts(doc, files["deepspeed_parts.py"], units.n_units)
        assert doc["num_stages"] == t.n_stages
    return files


@pytest.mark.parametrize("target", ["torch", "torchtitan", "megatron", "deepspeed"])
@pytest.mark.parametrize("model", ["dense", "hybrid"])
def test_every_target_plan_is_accepted_by_its_stack(target, model):
    m = small_model("(*-)x8") if model == "dense" else small_model("M-M*-M-M-M-", SSM)
    for pp in (2, 4):
        c = case(m, pp, 8)
        got = plan_target(TARGETS[target], c)
        check_export(target, got.best.plan, c.units)


def test_named_schedules_export_where_their_stack_runs_them():
    u = case(small_model("(*-)x8"), 2, 8).units
    interleaved = Plan(u.to_layers(Partition((3, 2, 3, 2))), build_schedule("interleaved", 2, 8, 2))
    check_export("megatron", interleaved, u)
    check_export("torchtitan", interleaved, u)
    zbv = Plan(u.to_layers(Partition((3, 2, 3, 2))), build_schedule("zbv", 2, 8))
    files = check_export("torchtitan", zbv, u)
    assert json.loads(files["torchtitan.json"])["pipeline_parallel_schedule"] == "ZBVZeroBubble"
    with pytest.raises(ExportError, match="placement"):
        export_files(zbv, "megatron", u)
    with pytest.raises(ExportError, match="placement"):
        export_files(zbv, "deepspeed", u)


def test_exported_csv_reads_back_as_the_plan():
    u = case(small_model("(*-)x8"), 2, 8).units
    plan = Plan(u.to_layers(Partition((3, 2, 3, 2))), build_schedule("zbv", 2, 8))
    files = export_files(plan, "torch", u)
    doc = json.loads(files["torch.json"])
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "s.csv"
        p.write_text(files["torch_schedule.csv"])
        table = read_csv(p, placement=tuple(doc["stage_to_rank"]), n_microbatches=doc["n_microbatches"])
    assert table.rows == plan.table.compute_only().rows


def test_a_plan_without_module_names_exports_only_for_torch():
    plan = Plan(Partition((5, 9)), build_schedule("1f1b", 2, 4))
    assert "torch.json" in export_files(plan, "torch", None)
    with pytest.raises(ConfigError, match="no module names"):
        export_files(plan, "torchtitan", None)
