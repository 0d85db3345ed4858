"""Split layers: a chain of pieces computes the whole layer, alone and in a pipeline."""
from __future__ import annotations

import pytest
import torch

from octopipe.layers import build_layer, carry_shape
from octopipe.layers.attention import Attention
from octopipe.layers.batch import microbatch
from octopipe.layers.edges import Head
from octopipe.layers.mlp import MLP, MoE
from octopipe.layers.pieces import build_piece, load_pieces, piece_tensors, pieces_state_dict
from octopipe.layers.ssm import Mamba2
from octopipe.model.layer import LayerKind as K
from octopipe.model.layer import LayerSpec
from octopipe.model.pieces import split_layer, split_model
from octopipe.plan import Plan, plan_model
from octopipe.runtime.launch import execute
from octopipe.runtime.stage import StageModule, max_rel_err, reference_run
from tests.runtime import tiny

RTOL = 1e-5
H = 24
H_TINY = tiny.H


def rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).norm() / want.norm()) if float(want.norm()) > 0 else float(got.norm())


WHOLE = {
    "head": LayerSpec(K.HEAD, H, vocab=50),
    "mlp_swiglu": LayerSpec(K.MLP, H, ffn=38, activation="swiglu"),
    "mlp_relu2": LayerSpec(K.MLP, H, ffn=38, activation="relu2"),
    "mlp_gelu_bias": LayerSpec(K.MLP, H, ffn=38, activation="gelu", bias=True),
    "moe_shared": LayerSpec(K.MOE, H, experts=5, top_k=2, expert_ffn=12, shared_experts=1, shared_ffn=10),
    "moe_top3": LayerSpec(K.MOE, H, experts=7, top_k=3, expert_ffn=8, activation="relu2"),
    "attention_gqa_bias": LayerSpec(K.ATTENTION, H, heads=6, kv_heads=3, head_dim=4, bias=True),
    "attention_sliding": LayerSpec(K.ATTENTION, H, heads=4, kv_heads=4, head_dim=6, window=5),
    "mamba2": LayerSpec(K.MAMBA2, H, ssm_heads=6, ssm_head_dim=4, ssm_state=5, ssm_groups=3,
                        ssm_chunk=4),
}


def whole_module(spec: LayerSpec):
    return {K.HEAD: lambda: Head(spec, spec.vocab), K.MLP: lambda: MLP(spec), K.MOE: lambda: MoE(spec),
            K.ATTENTION: lambda: Attention(spec), K.MAMBA2: lambda: Mamba2(spec)}[spec.kind]()


def run_chain(modules, x, batch, probe):
    """Forward through `modules`, a scalar (the loss, or the output against a fixed probe), backward."""
    y = x
    for mod in modules:
        y = mod(y, batch)
    (y if y.dim() == 0 else (y * probe).sum()).backward()
    return y.detach()


@pytest.mark.parametrize("k", [2, 3])
@pytest.mark.parametrize("name", list(WHOLE))
def test_chain_of_pieces_equals_the_whole_layer_forward_and_every_gradient(name, k):
    spec = WHOLE[name]
    torch.manual_seed(k)
    whole = whole_module(spec)
    pieces = [build_piece(p) for p in split_layer(spec, k)]
    load_pieces(whole, pieces)
    seq, tokens = 16, 16 if spec.kind is not K.HEAD else 19     # the head reads the last seq positions
    x = torch.randn(2, tokens, H)
    batch = {"targets": torch.randint(0, spec.vocab or 1, (2, seq))}
    probe = torch.randn(2, tokens, H)
    xw, xp = x.clone().requires_grad_(), x.clone().requires_grad_()
    want = run_chain([whole], xw, batch, probe)
    got = run_chain(pieces, xp, batch, probe)
    assert rel(got, want) <= RTOL
    assert xw.grad.norm() > 0 and rel(xp.grad, xw.grad) <= RTOL
    whole_grads = {n: p.grad for n, p in whole.named_parameters()}
    n_checked = 0
    for piece in pieces:
        params = dict(piece.named_parameters())
        want_g = piece_tensors(piece.spec, list(params), whole_grads)
        for pname, p in params.items():
            assert want_g[pname] is not None and p.grad is not None, (piece.spec.label, pname)
            assert rel(p.grad, want_g[pname]) <= RTOL, (piece.spec.label, pname)
            n_checked += p.numel()
    assert n_checked == sum(p.numel() for p in whole.parameters())   # pieces hold the layer exactly once


def test_pieces_are_named_and_shaped_as_the_analytic_parameter_counts():
    from octopipe.model.params import layer_params
    for name, spec in WHOLE.items():
        for p in split_layer(spec, 3):
            assert sum(t.numel() for t in build_piece(p).parameters()) == layer_params(p), (name, p.label)


def test_load_pieces_rejects_pieces_of_another_layer():
    pieces = [build_piece(p) for p in split_layer(WHOLE["mlp_relu2"], 2)]
    with pytest.raises(ValueError, match="shape"):
        load_pieces(MLP(LayerSpec(K.MLP, H, ffn=40, activation="relu2")), pieces)


PIECES = {1: 2, 2: 2, 3: 2, 4: 2, 10: 3}


def split_hybrid():
    """tiny.hybrid with its Mamba-2, relu2 MLP, sliding attention and MoE in 2 pieces and its
    head in 3 (17 layers: embedding 0, Mamba-2 1-2, MLP 3-4, attention 5-6, MoE 7-8, ..., head
    14-16)."""
    model = tiny.hybrid()
    return model, split_model(model, PIECES)


def test_split_model_starts_from_the_unsplit_weights_and_carries_the_predicted_shapes():
    model, split = split_hybrid()
    whole = StageModule(model, 0, model.n_layers, seed=3).state_dict()
    got = StageModule(split, 0, split.n_layers, seed=3).state_dict()
    want = pieces_state_dict(split, whole)
    assert set(got) == set(want) and all(torch.equal(got[n], want[n]) for n in got)
    batch = microbatch(split, 0, 0, 0)
    x = None
    for j in range(split.n_layers):
        x = build_layer(split, j)(x, batch)
        assert tuple(x.shape) == carry_shape(split, j), split.layers[j].label
    assert carry_shape(split, 14) == (2, 16, H_TINY + 2) and carry_shape(split, 7) == (2, 16, 2 * H_TINY + 4)
    assert carry_shape(split, 1) == carry_shape(split, 5) == (2, 16, 2 * H_TINY)



def test_pieces_state_dict_converts_a_checkpoint_of_other_weights():
    model, split = split_hybrid()
    src = StageModule(model, 0, model.n_layers, seed=11)
    dst = StageModule(split, 0, split.n_layers, seed=0)
    dst.load_state_dict(pieces_state_dict(split, src.state_dict()))
    batch = microbatch(model, 0, 0, 0)
    assert float(dst(None, batch)) == pytest.approx(float(src(None, batch)), rel=RTOL)


def _pipeline_case(table, partition):
    model, split = split_hybrid()
    m = table.n_microbatches
    got = execute(tiny.job(split, partition, table, timeout_s=60))
    ref = reference_run(model, m)
    assert got.losses[0] == pytest.approx(ref.losses[0], rel=RTOL)
    assert max_rel_err(got.grads, reference_run(split, m).grads) <= RTOL
    # against the whole model each tensor is compared at RTOL of its norm, or of 1e-3 where its
    # norm is smaller: Mamba-2's A_log gradient here is ~2e-7 (dt is ~1e-2), a sum of cancelling
    # terms whose fp32 rounding differs by ~3e-11 once the heads' partial sums are regrouped
    want = pieces_state_dict(split, ref.grads)
    for name, g in got.grads.items():
        assert float((g - want[name]).norm()) <= RTOL * max(float(want[name].norm()), 1e-3), name


def test_pipeline_1f1b_on_three_ranks_cuts_inside_split_mixers_and_equals_the_whole_model():
    from octopipe.schedule.library import build_schedule
    # cuts: between the Mamba-2's pieces (1|2) and the attention's (5|6)
    _pipeline_case(build_schedule("1f1b", 3, 3), ((0, 2), (2, 6), (6, 17)))


def test_pipeline_zero_bubble_v_with_split_backward_cuts_inside_the_moe_and_the_head():
    from octopipe.schedule.action import ActionKind
    from octopipe.schedule.library import build_schedule
    table = build_schedule("zbv", 2, 4)
    kinds = {a.kind for row in table.rows for a in row if a is not None}
    assert {ActionKind.I, ActionKind.W} <= kinds and table.placement == (0, 1, 1, 0)
    # cuts: MLP 3|4, MoE 7|8 and head 14|15 (the head's last two pieces sit on rank 0, its first
    # on rank 1)
    _pipeline_case(table, ((0, 4), (4, 8), (8, 15), (15, 17)))


def test_a_plan_with_meta_pieces_runs_the_split_model():
    from octopipe.plan import uniform_partition
    from octopipe.schedule.library import build_schedule
    model, split = split_hybrid()
    table = build_schedule("1f1b", 2, 2)
    plan = Plan(uniform_partition(split.n_layers, 2), table, meta={"pieces": {str(k): n for k, n in PIECES.items()}})
    assert plan_model(model, plan) == split
    assert plan_model(model, Plan(uniform_partition(model.n_layers, 2), table)) is model
