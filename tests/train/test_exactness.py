"""fp32 training on the pipeline equals the single-process run (same blocks, data order, AdamW,
schedule, clipping) over 20 steps: a user module on named schedules and the tuner's plan with
split layers and split backward on every text layer kind; a resumed run continues bit for bit;
bf16 stays close to the fp32-master reference.

Tolerances. The losses agree within rtol 1e-5 (observed about 1e-7: every step's loss is one
forward of the same weights). The final weights are held to the spread that fp32 rounding alone
gives this computation on this CPU: the pipeline adds the same micro-batch gradients in another
order (by stage, by micro-batch), and 20 AdamW steps carry that rounding on (AdamW divides by
sqrt(v), so a gradient element near zero turns a rounding difference into an update of up to
the learning rate). The reference run once more with its micro-batches in reverse order is the
same mathematics with the sums reordered; its distance from the reference is the floor, and the
pipeline must stay within `FLOOR_MULTIPLE` times it (and never needs to be closer than 1e-5). A
plan with split layers also reorders the sums inside each cut layer: the single-process run of
the split model is then a second floor (on one Intel host: 2.4e-7 for reordered micro-batches
and 7.2e-6 for the pieces of tiny_hybrid's tuned plan, so a bound of 5.7e-5 there).
A wrong gradient (a missing term, a tie broken) is orders of magnitude above either."""
from __future__ import annotations

import math

import pytest
import torch

from octopipe.cluster import Cluster, DeviceKind, Link
from octopipe.config.cost import AnalyticCost
from octopipe.config.solver import SolverConfig
from octopipe.config.tuner import TunerConfig
from octopipe.cost.analytic import analytic_costs
from octopipe.model.layer import LayerKind
from octopipe.plan import plan_model
from octopipe.runtime.stage import SpecBlocks
from octopipe.schedule.action import ActionKind
from octopipe.train.loop import reference_train
from octopipe.train.summary import compare
from octopipe.tune import TuneOptions, tune
from octopipe.tune.splitting import model_splitter
from tests.runtime import tiny
from tests.train.helpers import OPTIM, ReversedMicrobatches, batches, gpt, named_plan, train

RTOL = 1e-5
FLOOR_MULTIPLE = 8.0


def weight_bound(model, data, ref, split: tuple | None = None) -> float:
    """The final-weight tolerance: FLOOR_MULTIPLE x the reference's own spread under reordered
    sums (see the module docstring), at least RTOL. `split` = (the split model's blocks, the
    plan's pieces): a plan that cuts layers into pieces also reorders the sums inside each cut
    layer, so the single-process run of the split model is a second floor."""
    again = reference_train(model, ReversedMicrobatches(data, 4), 4, OPTIM, 20)
    floors = [compare(again, ref, model, {})[1]]
    if split is not None:
        blocks, pieces = split
        floors.append(compare(reference_train(blocks, data, 4, OPTIM, 20), ref, blocks, pieces)[1])
    return max(RTOL, FLOOR_MULTIPLE * max(floors))


@pytest.fixture(scope="module")
def user():
    blocks = gpt()
    data = batches(blocks.seq_len, blocks.micro_batch_size)
    return blocks, data, reference_train(blocks, data, 4, OPTIM, 20)


@pytest.fixture(scope="module")
def user_weight_bound(user):
    blocks, data, ref = user
    return weight_bound(blocks, data, ref)


@pytest.fixture(scope="module")
def zbv_run(user, tmp_path_factory):
    blocks, data, _ = user
    ckpt = tmp_path_factory.mktemp("ckpt")
    run = train(blocks, named_plan("zbv", blocks.n_blocks), data, checkpoint_every=10,
                checkpoint_dir=str(ckpt), meta={"model": "tiny_gpt"})
    return run, ckpt


def test_user_module_on_zbv_equals_the_single_process_run_and_learns(user, zbv_run, user_weight_bound):
    blocks, _, ref = user
    run, _ = zbv_run
    loss_err, weight_err = compare(run, ref, blocks, {})
    assert len(run.losses) == 20 and loss_err <= RTOL and weight_err <= user_weight_bound
    assert run.losses[-1] < 0.6 * math.log(256) < run.losses[0]


@pytest.mark.parametrize("schedule", ["1f1b", pytest.param("interleaved", marks=pytest.mark.slow),
                                      pytest.param("chimera", marks=pytest.mark.slow)])
def test_user_module_on_named_schedules(user, schedule, user_weight_bound):
    blocks, data, ref = user
    run = train(blocks, named_plan(schedule, blocks.n_blocks), data)
    loss_err, weight_err = compare(run, ref, blocks, {})
    assert loss_err <= RTOL and weight_err <= user_weight_bound


def test_resume_continues_bit_for_bit(user, zbv_run):
    blocks, data, _ = user
    run, ckpt = zbv_run
    path = ckpt / "step_000010"
    assert {p.name for p in path.iterdir()} >= {".metadata", "octopipe.json"}
    assert not list(ckpt.glob("*.tmp"))
    resumed = train(blocks, named_plan("zbv", blocks.n_blocks), data, start=10, resume=str(path))
    assert resumed.losses == run.losses[10:]
    assert all(torch.equal(resumed.params[k], v) for k, v in run.params.items())


def compute_bound_cluster(n: int) -> Cluster:
    """`n` devices whose memory bandwidth never binds, so that a tiny layer's pieces cost what
    their FLOPs do (on a bandwidth-bound device each piece re-reads its input: splitting loses)."""
    link = Link("link", 1e30, 0.0)
    return Cluster("compute", (DeviceKind("dev", 1e15, 1e18, 1e18),), (0,) * n, (0,) * n, link, link)


def test_tuned_plan_with_split_layers_and_split_backward_on_every_text_layer_kind():
    model = tiny.hybrid()
    cluster = compute_bound_cluster(2)
    cost = AnalyticCost()
    splitter = model_splitter(model, lambda m: analytic_costs(cost, m, cluster))
    tuner = TunerConfig(time_budget_s=2, max_iters=20, patience=5, ilp=False, split_layers="force",
                        split_share=0.15)
    plan = tune(analytic_costs(cost, model, cluster), cluster, 2, 4,
                TuneOptions(tuner, SolverConfig(), seed=0, model="tiny_hybrid", splitter=splitter)).plan
    split = {model.layers[i].kind for i in plan.pieces}
    assert {LayerKind.MAMBA2, LayerKind.ATTENTION, LayerKind.MOE, LayerKind.MLP} <= split
    assert any(a.kind is ActionKind.W for d in range(2) for a in plan.table.actions(d))
    blocks = SpecBlocks(plan_model(model, plan))
    data = batches(model.seq_len, model.micro_batch_size, vocab=tiny.VOCAB)
    ref = reference_train(model, data, 4, OPTIM, 20)
    run = train(blocks, plan, data)
    loss_err, weight_err = compare(run, ref, blocks, plan.pieces)
    assert loss_err <= RTOL and weight_err <= weight_bound(model, data, ref, (blocks, plan.pieces))


@pytest.mark.slow
def test_bf16_autocast_with_fp32_master_weights_stays_close(user):
    """bf16 forwards on the pipeline (each stage hands on fp32) against the single-process bf16
    run: losses within 1e-3 relative over 20 steps (bf16 rounding of the stage boundaries and of
    the reductions differs; the master weights and AdamW stay fp32)."""
    blocks, data, _ = user
    ref = reference_train(blocks, data, 4, OPTIM, 20, autocast=torch.bfloat16)
    run = train(blocks, named_plan("1f1b", blocks.n_blocks), data, autocast="bfloat16")
    loss_err, _ = compare(run, ref, blocks, {})
    assert loss_err <= 1e-3
    assert all(p.dtype == torch.float32 for p in run.params.values())


def test_the_weight_bound_sees_a_wrong_gradient(user, user_weight_bound):
    """The floor-derived bound is far below what a real defect gives: the reference trained on
    every micro-batch but the last (a gradient with one term missing) is outside it."""
    blocks, data, ref = user
    short = reference_train(blocks, data, 3, OPTIM, 20)
    _, weight_err = compare(short, ref, blocks, {})
    assert weight_err > 10 * user_weight_bound
