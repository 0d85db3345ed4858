"""The files exported for torch and torchtitan, read back into a plan and trained on torch's own
runtime (`_PipelineScheduleRuntime` from the exported CSV), give our runtime's losses."""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from octopipe.config.cost import ProfiledCost
from octopipe.cost.profiled import profile_blocks
from octopipe.interop.export import export_files
from octopipe.interop.target_plan import TargetCase, plan_target
from octopipe.interop.targets import TARGETS
from octopipe.interop.units import block_units, sequential_names
from octopipe.plan import Partition, Plan
from octopipe.schedule.csv_io import read_csv
from octopipe.train.torch_runtime import train_with_torch
from octopipe.tune import TuneOptions
from tests.interop.helpers import FAST
from tests.train.helpers import OPTIM, batches, gpt, train
from tests.tune.helpers import free_cluster


def _read_back(files: dict[str, str], target: str, units) -> Plan:
    """The plan the exported files describe, read as the stack would: stages from the module
    lists (torchtitan) or layer ranges (torch), ranks and order from the CSV."""
    with tempfile.TemporaryDirectory() as d:
        if target == "torch":
            doc = json.loads(files["torch.json"])
            part = Partition.from_ranges([s["layers"] for s in doc["stages"]])
            placement, csv_name = tuple(doc["stage_to_rank"]), doc["schedule_csv"]
        else:
            doc = json.loads(files["torchtitan.json"])
            owner = {n: u for u, names in enumerate(units.names) for n in names}
            sizes = [len({owner[n] for n in part}) for part in doc["module_fqns_per_model_part"]]
            part = units.to_layers(Partition(tuple(sizes)))
            placement, csv_name = None, doc["pipeline_parallel_schedule_csv"]
        path = Path(d) / csv_name
        path.write_text(files[csv_name])
        table = read_csv(path, placement=placement)
    return Plan(part, table)


@pytest.mark.slow
@pytest.mark.parametrize("target", ["torch", "torchtitan"])
def test_exported_plan_trains_on_torch_runtime_to_our_losses(target):
    blocks = gpt()
    data = batches(blocks.seq_len, blocks.micro_batch_size)
    cluster = free_cluster(2)
    costs = profile_blocks(blocks, ProfiledCost(repeats=2, warmup=1, cache_dir=""), cluster)
    units = block_units(sequential_names(blocks.n_blocks), "the factory's nn.Sequential")
    got = plan_target(TARGETS[target], TargetCase(costs, units, cluster, 2, 4, TuneOptions(FAST)))
    plan = _read_back(export_files(got.best.plan, target, units, blocks.micro_batch_size), target, units)
    assert plan.partition == got.best.plan.partition
    assert plan.table.rows == got.best.plan.table.compute_only().rows
    theirs = train_with_torch(blocks, plan, data, OPTIM, 6)
    ours = train(blocks, plan, data, steps=6)
    assert theirs.losses == pytest.approx(ours.losses, rel=1e-6)
