"""Our plan on torch's own runtime (PipelineStage + _PipelineScheduleRuntime from our
schedule.csv) trains exactly as our runtime does."""
from __future__ import annotations

from dataclasses import replace

import pytest

from octopipe.config.cost import ProfiledCost
from octopipe.config.solver import SolverConfig
from octopipe.config.tuner import TunerConfig
from octopipe.cost.profiled import profile_blocks
from octopipe.errors import ScheduleError
from octopipe.runtime.stage import SpecBlocks
from octopipe.schedule.action import ActionKind
from octopipe.train.summary import compare
from octopipe.train.torch_runtime import check_torch_plan, train_with_torch
from octopipe.tune import TuneOptions, tune
from tests.runtime import tiny
from tests.train.helpers import OPTIM, batches, gpt, named_plan, train
from tests.tune.helpers import free_cluster


def test_the_tuned_plan_on_torch_runtime_gives_our_losses_and_weights():
    blocks = gpt()
    data = batches(blocks.seq_len, blocks.micro_batch_size)
    cluster = free_cluster(2)
    costs = profile_blocks(blocks, ProfiledCost(repeats=3, warmup=1, cache_dir=""), cluster)
    assert costs.n_layers == blocks.n_blocks and (costs.f > 0).all() and costs.params.sum() > 0
    # B costed as I + W (the measured B left out), so that the tuner splits backwards: torch's
    # runtime must then run our I and W on an uneven placement
    split_costs = replace(costs, full_b=None, _prefix={})
    plan = tune(split_costs, cluster, 2, 4, TuneOptions(TunerConfig(time_budget_s=2), SolverConfig(), seed=0)).plan
    assert any(a.kind is ActionKind.W for d in range(2) for a in plan.table.actions(d))
    theirs = train_with_torch(blocks, plan, data, OPTIM, 8)
    ours = train(blocks, plan, data, steps=8)
    assert theirs.losses == pytest.approx(ours.losses, rel=1e-6)
    assert max(compare(theirs, ours, blocks, {})) <= 1e-5


def test_torch_runtime_refuses_replicas_and_preset_layers():
    blocks = gpt()
    with pytest.raises(ScheduleError, match="several ranks"):
        check_torch_plan(blocks, named_plan("chimera", blocks.n_blocks))
    with pytest.raises(ScheduleError, match="user's blocks"):
        check_torch_plan(SpecBlocks(tiny.dense()), named_plan("1f1b", 6))
