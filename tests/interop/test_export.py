"""Exported plans, read back by the stacks' own code: torch's schedule validator and lowering,
Megatron's layout parser, torchtitan's config dataclasses; and the exported torch CSV trained in
torch's runtime to our runtime's losses."""
from __future__ import annotations

import csv
import io
import json
import tempfile
import warnings
from pathlib import Path

import pytest
import tomllib

from octopipe.errors import ConfigError
from octopipe.interop.export import ExportError, export_files
from octopipe.interop.target_plan import plan_target
from octopipe.interop.targets import TARGETS
from octopipe.plan import Partition, Plan
from octopipe.schedule.csv_io import read_csv
from octopipe.schedule.library import build_schedule
from tests.interop.helpers import SSM, case, small_model


def _torch_checks(csv_text: str, stage_to_rank: list[int], n_microbatches: int) -> None:
    """torch's own reading of a compute-only CSV: parse, validate, lower."""
    from torch.distributed.pipelining.schedules import _Action, _add_send_recv, _validate_schedule
    rows = list(csv.reader(io.StringIO(csv_text)))
    actions = {r: [_Action.from_str(c) if c else None for c in row] for r, row in enumerate(rows)}
    n_stages = len(stage_to_rank)
    mapping = _validate_schedule(actions, len(rows), n_stages, n_microbatches)
    assert [mapping[s] for s in range(n_stages)] == stage_to_rank
    compute = {r: [a for a in row if a is not None] for r, row in actions.items()}
    lowered = _add_send_recv(compute, lambda s: stage_to_rank[s], n_stages)
    assert sum(len(v) for v in lowered.values()) > sum(len(v) for v in compute.values())


def _megatron_checks(doc: dict) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mod = pytest.importorskip("megatron.core.transformer.pipeline_parallel_layer_layout")
    layout = mod.PipelineParallelLayerLayout(doc["pipeline_model_parallel_layout"], doc["pipeline_model_parallel_size"])
    layout.validate_layer_layout(num_layers=doc["num_layers"], mtp_num_layers=0)
    assert layout.virtual_pipeline_model_parallel_size == doc["virtual_stages_per_rank"]


def _torchtitan_checks(doc: dict, toml_text: str) -> None:
    configs = pytest.importorskip("torchtitan.config.configs")
    par = configs.ParallelismConfig(**doc["parallelism"])
    train = configs.TrainingConfig(**doc["training"])
    assert train.local_batch_size // par.pipeline_parallel_microbatch_size == doc["num_pp_microbatches"]
    assert len(par.module_fqns_per_model_part) % par.pipeline_parallel_degree == 0
    assert tomllib.loads(toml_text) == {"parallelism": doc["parallelism"], "training": doc["training"]}


def check_export(target: str, plan: Plan, units, mbs: int = 1) -> dict[str, str]:
    files = export_files(plan, target, units, mbs)
    t = plan.table
    if target == "torch":
        doc = json.loads(files["torch.json"])
        _torch_checks(files["torch_schedule.csv"], doc["stage_to_rank"], t.n_microbatches)
        assert [tuple(s["layers"]) for s in doc["stages"]] == list(plan.partition)
    elif target == "torchtitan":
        doc = json.loads(files["torchtitan.json"])
        _torch_checks(files["torchtitan_schedule.csv"], list(t.placement), t.n_microbatches)
        _torchtitan_checks(doc, files["torchtitan.toml"])
        flat = [n for part in doc["module_fqns_per_model_part"] for n in part]
        assert flat == [n for names in units.names for n in names]
    elif target == "megatron":
        doc = json.loads(files["megatron.json"])
        if "pipeline_model_parallel_layout" in doc:
            _megatron_checks(doc)
        else:
            assert doc["hybrid_layer_pattern"].replace("|", "") == "".join(units.symbols[1:-1])
            assert doc["hybrid_layer_pattern"].count("|") == t.n_stages - 1
    else:
        doc = json.loads(files["deepspeed.json"])
        assert doc["parts"][0] == 0 and doc["parts"][-1] == units.n_units
        assert len(doc["parts"]) == doc["num_stages"] + 1 == t.n_stages + 1
        compile(files["deepspeed_parts.py"], "deepspeed_parts.py", "exec")
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
