"""The real-compute tensor-parallel pipeline (pp = 2 x tp = 2: 4 gloo processes) against the
single-process reference, and mode=execute with runtime.tp."""
from __future__ import annotations

import json

import pytest
import torch

from octopipe.model.layer import LayerKind as K
from octopipe.model.layer import LayerSpec
from octopipe.plan import uniform_partition
from octopipe.runtime.launch import execute
from octopipe.runtime.stage import StageModule, max_rel_err, reference_run
from octopipe.runtime.tensor_parallel import TPBlocks, agreement_cost, assemble, rank_shards
from octopipe.schedule.action import Action
from octopipe.sim.agreement import agreement_stages, needs_agreement
from octopipe.sim.hints import KIND_CODE
from tests.reliability.cli import run_in_process
from tests.runtime import tiny
from tests.runtime.random_tables import random_table

RTOL = 1e-5


def tp_model():
    """Every layer kind with a TP variant (attention with QK-norm and biases, sliding attention,
    MoE with a shared expert, MLPs of two activations, the head) and replicated ones between
    them (patch embedding, ViT block, projector, embedding, Mamba-2)."""
    vit = LayerSpec(K.VIT_BLOCK, 24, heads=3, head_dim=8, causal=False, ffn=32, activation="gelu")
    return tiny.model([LayerSpec(K.PATCH_EMBED, 24, patch=2, channels=3, tokens=8), vit,
                       LayerSpec(K.PROJECTOR, tiny.H, in_hidden=48, ffn=48), tiny.emb(),
                       LayerSpec(K.ATTENTION, tiny.H, heads=4, kv_heads=2, head_dim=8, qk_norm=True, bias=True),
                       tiny.moe(), tiny.mamba2(), LayerSpec(K.MLP, tiny.H, ffn=48, activation="gelu", bias=True),
                       tiny.attn(window=5), tiny.mlp(), tiny.head()], name="tiny_tp")


def test_the_tp_ranks_shards_assemble_into_the_whole_model():
    """Each TP rank's weights (every split and replicated kind), mapped back by `shard_index` and
    put together, are the single-process model's, name for name; half the ranks leave holes."""
    model = tp_model()
    whole = dict(StageModule(model, 0, model.n_layers, seed=3).named_parameters())
    shards = [rank_shards([StageModule(TPBlocks(model, t, 2, None), 0, model.n_layers, seed=3)],
                          TPBlocks(model, t, 2, None), 3, lambda p: p.data) for t in range(2)]
    got = assemble(shards)
    assert set(got) == set(whole) and all(torch.equal(got[n], p.detach()) for n, p in whole.items())
    assert any(len(shards[0][n][1]) < p.numel() for n, p in whole.items())
    with pytest.raises(ValueError, match="no TP rank holds part of"):
        assemble(shards[:1])


@pytest.mark.parametrize("dispatch,transport", [("strict", "ordered"), ("ready_first", "tagged")])
def test_pp2_tp2_real_compute_equals_the_single_process_reference(dispatch, transport):
    """An irregular table with split backward, two SGD steps: the losses of both iterations and
    the gradients of the last one (each TP rank's shards assembled by the launcher) equal the
    single-process run's; strict runs on the ordered transport (NCCL's, here over gloo);
    ready-first (bfw, jittered compute) agrees before the tasks with TP collectives only
    (`agreement_stages`: W of the first stage and of QK-norm attention included, the other W not);
    the two TP ranks of each pipeline rank run those in the same order."""
    model = tp_model()
    table = random_table(n_devices=2, n_stages=4, n_microbatches=3, seed=1, split_prob=0.5)
    ready = dispatch == "ready_first"
    settings = dict(hint="bfw", jitter_cv=0.3, max_inflight=None) if ready else {}     # RRFP: no cap
    got = execute(tiny.job(model, uniform_partition(model.n_layers, 4), table, dispatch=dispatch, tp=2,
                           transport=transport, iterations=2, lr=0.5, stall_s=60.0, **settings))
    ref = reference_run(model, table.n_microbatches, iterations=2, lr=0.5)
    assert max_rel_err(got.grads, ref.grads) <= RTOL
    assert got.losses == pytest.approx(ref.losses, rel=RTOL)
    stages = agreement_stages(model, uniform_partition(model.n_layers, 4), 2)
    assert [w for _, _, w in stages] == [True, True, False, False]
    with_collectives = {a for ev in got.events for a in (Action.parse(e["action"]) for e in ev if "action" in e)
                        if needs_agreement(KIND_CODE[a.kind], *stages[a.stage])}
    orders = [[e["action"] for e in sorted((e for e in ev if "action" in e), key=lambda e: e["start"])
               if Action.parse(e["action"]) in with_collectives or not ready] for ev in got.events]
    assert len(orders) == 4 and orders[0] == orders[1] and orders[2] == orders[3]
    cost = agreement_cost(got.events, range(2))
    if ready:
        assert cost["us_per_round"] > 0
        assert [e["agree_tasks"] for ev in got.events for e in ev if "agree_tasks" in e and e["it"] == 1] == \
            [len(o) // 2 for o in orders]
        assert len(with_collectives) < len({e["action"] for ev in got.events for e in ev if "action" in e})
    else:
        assert cost is None     # strict: every TP rank runs the row in order, nothing to agree on


def test_mode_execute_runs_real_compute_with_tp2_and_reports_the_agreement(tmp_path, capsys):
    out = tmp_path / "run"
    code, err = run_in_process(
        ["mode=execute", "pp=2", "microbatches=2", "runtime.model=tiny_moe", "runtime.tp=2",
         "runtime.dispatch=ready_first", "runtime.iterations=1", "runtime.warmup=0", "runtime.calibrate=false",
         "runtime.pin=false", "cost=profiled", "cost.repeats=1", "cost.warmup=0",
         f"cost.cache_dir={tmp_path / 'cache'}", f"hydra.run.dir={out}"], capsys)
    assert code == 0, err[-5:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["tp"] == 2 and summary["grad_check_max_rel_err"] <= RTOL
    assert summary["measured_iteration_s"] > 0 and summary["simulated_iteration_s"] > 0
    assert summary["agreement"]["us_per_round"] > 0 and summary["agreement"]["rounds_per_task"] >= 1


@pytest.mark.parametrize("override,field", [
    ("runtime.tp=3", "runtime.tp=3 does not divide the hidden size"),
    ("runtime.tp=4", "runtime.tp=4 does not divide"),
    ("schedule=chimera", "runtime.tp=2 needs a schedule without replicated (Chimera) stages")])
def test_bad_tp_combinations_exit_2_with_one_line_naming_the_field(tmp_path, capsys, override, field):
    code, err = run_in_process(
        ["mode=execute", "pp=2", "microbatches=2", "runtime.model=tiny_hybrid", "runtime.tp=2", override,
         "runtime.iterations=1", "runtime.warmup=0", "runtime.calibrate=false", "runtime.pin=false",
         f"hydra.run.dir={tmp_path / 'run'}"], capsys)
    assert code == 2 and len(err) == 1 and field in err[0], err
