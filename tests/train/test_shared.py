"""A parameter several blocks share is one parameter: found by identity in the factory's own
model, one copy per stage holding it with their gradients summed, counted once; the pipeline
trains the model the factory returned (the reference is that module itself, not rebuilt block by
block) on both dispatches and with a split backward, and its copies end equal to the bit."""
from __future__ import annotations

import pytest
import torch

from octopipe.model.sharing import canonical_names, tied_tensors, unique_parameters
from octopipe.model.user_module import UserBlocks, check_blocks
from octopipe.plan import Partition, Plan
from octopipe.schedule.library import build_schedule
from octopipe.train.loop import reference_train
from octopipe.train.summary import compare
from tests.train import shared_models
from tests.train.helpers import OPTIM, ROOT, batches, train, weight_floor

FACTORY = f"{ROOT}/tests/train/shared_models.py"
SEQ, MBS, STEPS = 16, 2, 6
RTOL = 1e-5


def blocks_of(func: str, **kwargs) -> UserBlocks:
    return check_blocks(UserBlocks(f"{FACTORY}:{func}", SEQ, MBS, 256, tuple(kwargs.items())))


def plan_of(name: str, n_blocks: int, cuts: list[int] | None = None) -> Plan:
    table = build_schedule(name, 2, 4)
    part = Partition.from_cuts(cuts, n_blocks) if cuts else Partition.uniform(n_blocks, table.n_stages)
    return Plan(part, table)


def test_sharing_is_found_by_identity_and_counted_once():
    t = tied_tensors(list(shared_models.tied()))
    assert [(x.name, x.blocks, x.parameter) for x in t] == [("0.tok.weight", (0, 3), True)]
    r = tied_tensors(list(shared_models.repeated()))
    assert {x.blocks for x in r} == {(1, 2)} and all(x.name.startswith("1.") for x in r)
    n = tied_tensors(shared_models.shared_norm())
    assert {x.name for x in n} == {"1.norm1.weight", "1.norm1.bias"} and {x.blocks for x in n} == {(1, 4)}
    for model in (shared_models.tied(), shared_models.repeated(), torch.nn.Sequential(*shared_models.shared_norm())):
        assert unique_parameters(list(model)) == sum(p.numel() for p in model.parameters())
    names = canonical_names(list(shared_models.tied()))
    assert names[(3, "proj.weight")] == names[(0, "tok.weight")] == "0.tok.weight"


def test_a_stage_holding_both_holders_keeps_one_parameter():
    blocks = blocks_of("repeated")
    from octopipe.runtime.stage import StageModule
    stage = StageModule(blocks, 0, blocks.n_blocks, 0)
    assert stage.layers["1"].inner is stage.layers["2"].inner
    assert sum(p.numel() for p in stage.parameters()) == sum(p.numel() for p in shared_models.repeated().parameters())


CASES = [("tied", "1f1b", "strict", None), ("tied", "zbv", "ready_first", None),
         ("repeated", "1f1b", "ready_first", [2]), ("shared_norm", "zbv", "strict", None),
         pytest.param("tied", "interleaved", "strict", None, marks=pytest.mark.slow)]


@pytest.mark.parametrize("func,schedule,dispatch,cuts", CASES)
def test_the_pipeline_trains_the_factorys_model(func, schedule, dispatch, cuts):
    blocks = blocks_of(func)
    data = batches(SEQ, MBS)
    run = train(blocks, plan_of(schedule, blocks.n_blocks, cuts), data, steps=STEPS, dispatch=dispatch)
    ref = reference_train(blocks, data, 4, OPTIM, STEPS)
    loss_err, weight_err = compare(run, ref, blocks, {})
    assert set(run.params) == set(ref.params)        # the model's own names, the shared one once
    bound = max(RTOL, 8 * weight_floor(blocks, data, ref, OPTIM, STEPS))
    assert loss_err <= RTOL and weight_err <= bound, (loss_err, weight_err, bound)
    assert run.tied_equal is True                     # every copy took the same steps


def test_tied_and_untied_twins_start_equal_and_then_differ():
    data = batches(SEQ, MBS)
    runs = [train(blocks_of("tied", untie=u), plan_of("1f1b", 4), data, steps=3) for u in (False, True)]
    assert runs[0].losses[0] == pytest.approx(runs[1].losses[0], rel=1e-6)
    assert all(abs(a - b) > 1e-4 for a, b in zip(runs[0].losses[1:], runs[1].losses[1:]))
    assert "3.proj.weight" in runs[1].params and "3.proj.weight" not in runs[0].params


def test_asynchronous_schedules_refuse_a_parameter_shared_across_stages(tmp_path, capsys, monkeypatch):
    from tests.reliability.cli import run_in_process
    monkeypatch.chdir(ROOT)
    code, err = run_in_process(["mode=train", "model=module", "model.factory=tests/train/shared_models.py:tied",
                                "model.seq_len=16", "model.micro_batch_size=2", "train.microbatches=4",
                                "schedule=pipedream", "train.steps=2", "cost=profiled", "cost.repeats=1",
                                "cost.warmup=0", "cost.cache_dir=", f"hydra.run.dir={tmp_path}"], capsys)
    assert code == 2 and len(err) == 1 and "0.tok.weight is shared by stages" in err[0], err


def test_a_factory_file_imports_the_modules_beside_it_on_every_rank(tmp_path):
    (tmp_path / "my_layers.py").write_text("from torch import nn\n\n\nclass Mix(nn.Module):\n"
                                          "    def __init__(self, w):\n        super().__init__()\n"
                                          "        self.lin = nn.Linear(w, w)\n\n"
                                          "    def forward(self, x):\n        return x + self.lin(x)\n")
    (tmp_path / "model.py").write_text("from torch import nn\nfrom my_layers import Mix\n\n\n"
                                       "def build(vocab=256):\n"
                                       "    return [nn.Embedding(vocab, 16), Mix(16), Mix(16), nn.Linear(16, vocab)]\n")
    blocks = check_blocks(UserBlocks(f"{tmp_path / 'model.py'}:build", SEQ, MBS, 256))
    data = batches(SEQ, MBS)
    run = train(blocks, plan_of("1f1b", blocks.n_blocks), data, steps=2)
    ref = reference_train(blocks, data, 4, OPTIM, 2)
    assert compare(run, ref, blocks, {})[0] <= RTOL
