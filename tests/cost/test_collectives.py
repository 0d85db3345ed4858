"""Collective costs against hand-computed alpha-beta values; TP in the analytic table; ZeRO memory."""
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from octopipe.cluster import Cluster, DeviceKind, Link
from octopipe.cost.analytic import AnalyticCostModel
from octopipe.cost.collectives import (
    Op,
    all_gather_seconds,
    all_reduce_seconds,
    all_to_all_seconds,
    dp_sync_seconds,
    group_link,
    reduce_scatter_seconds,
    static_bytes_per_param,
    tp_collective_seconds,
    tp_layer_collectives,
)
from octopipe.errors import ConfigError
from octopipe.model.build import build_model
from octopipe.model.layer import LayerKind as K

CONF = Path(__file__).resolve().parents[2] / "conf" / "model"
L = Link("l", 100e9, 1e-6)           # 100 GB/s, 1 us
NV = Link("nv", 450e9, 3e-6)
IB = Link("ib", 46e9, 8e-6)
H100 = DeviceKind("H100-SXM", 989.4e12, 80e9, 3350e9)
ONE = Cluster("one", (H100,), (0,), (0,), NV, IB)


def preset(name):
    return build_model(OmegaConf.load(CONF / f"{name}.yaml"))


def test_ring_and_tree_all_reduce_by_hand():
    # ring: 2(n-1) alpha + 2(n-1)/n B/beta = 6 us + 1.5 * 10 ms
    assert all_reduce_seconds(1e9, 4, L) == pytest.approx(6e-6 + 0.015)
    # tree: 2 log2(n) alpha + 2 B/beta
    assert all_reduce_seconds(1e9, 4, L, "tree") == pytest.approx(4e-6 + 0.020)
    assert all_reduce_seconds(1e9, 5, L, "tree") == pytest.approx(6e-6 + 0.020)
    assert all_reduce_seconds(1e9, 1, L) == 0.0 and all_reduce_seconds(0, 8, L) == 0.0
    with pytest.raises(ConfigError):
        all_reduce_seconds(1.0, 2, L, "butterfly")


def test_gather_scatter_all_to_all_by_hand():
    for fn in (all_gather_seconds, reduce_scatter_seconds, all_to_all_seconds):
        assert fn(1e9, 4, L) == pytest.approx(3e-6 + 0.0075)
        assert fn(8e8, 8, L) == pytest.approx(7e-6 + 7 / 8 * 8e-3)
    # all-gather + reduce-scatter move what one ring all-reduce moves, with the same latency count
    assert all_gather_seconds(1e9, 8, L) + reduce_scatter_seconds(1e9, 8, L) == \
        pytest.approx(all_reduce_seconds(1e9, 8, L))


def test_megatron_tp_collectives_per_layer():
    m = preset("llama3_8b")
    n = m.seq_len * m.micro_batch_size
    act = 2.0 * n * 4096
    attn = next(x for x in m.layers if x.kind is K.ATTENTION)
    ops = tp_layer_collectives(attn, n, 8)
    assert [(c.op, c.phase) for c in ops] == [(Op.ALL_REDUCE, "f"), (Op.ALL_REDUCE, "i")]
    assert all(c.nbytes == act for c in ops)
    sp = tp_layer_collectives(attn, n, 8, sequence_parallel=True)
    assert [(c.op, c.phase) for c in sp] == [(Op.ALL_GATHER, "f"), (Op.REDUCE_SCATTER, "f"),
                                              (Op.ALL_GATHER, "i"), (Op.REDUCE_SCATTER, "i")]
    c = tp_collective_seconds(attn, n, 8, NV)
    ar = 14 * 3e-6 + 2 * 7 / 8 * act / 450e9
    assert c.f == pytest.approx(ar) and c.i == pytest.approx(ar)
    head = next(x for x in m.layers if x.kind is K.HEAD)
    h = tp_collective_seconds(head, n, 8, NV)
    assert h.f == pytest.approx(3 * (14 * 3e-6 + 2 * 7 / 8 * 4.0 * n / 450e9))
    assert h.i == pytest.approx(ar)
    emb = next(x for x in m.layers if x.kind is K.EMBEDDING)
    e = tp_collective_seconds(emb, n, 8, NV)
    assert e.f == pytest.approx(ar) and e.i == 0.0
    assert tp_collective_seconds(attn, n, 1, NV).f == 0.0


def test_moe_expert_parallel_all_to_all():
    m = preset("qwen3_30b_a3b")
    moe = next(x for x in m.layers if x.kind is K.MOE)
    n = m.seq_len * m.micro_batch_size
    ops = tp_layer_collectives(moe, n, 4)
    assert [c.op for c in ops] == [Op.ALL_TO_ALL] * 4           # dispatch + combine, F and I
    per_rank = 2.0 * moe.top_k * n / 4 * moe.hidden
    c = tp_collective_seconds(moe, n, 4, NV)
    assert c.f == pytest.approx(2 * (3 * 3e-6 + 3 / 4 * per_rank / 450e9))


def test_tp_collectives_enter_f_and_i_of_the_table():
    m = preset("llama3_8b")
    n = m.seq_len * m.micro_batch_size
    off = AnalyticCostModel(tp=8, tp_collectives=False).table(m, ONE)
    on = AnalyticCostModel(tp=8).table(m, ONE)
    j = next(k for k, x in enumerate(m.layers) if x.kind is K.ATTENTION)
    ar = 14 * 3e-6 + 2 * 7 / 8 * 2.0 * n * 4096 / 450e9
    assert on.f[j, 0] - off.f[j, 0] == pytest.approx(ar)
    assert on.i[j, 0] - off.i[j, 0] == pytest.approx(ar)
    assert np.array_equal(on.w, off.w)
    ov = AnalyticCostModel(tp=8, tp_overlap=True).table(m, ONE)
    assert ov.f[j, 0] == pytest.approx(max(off.f[j, 0], ar))
    inter = AnalyticCostModel(tp=8, tp_link="inter").table(m, ONE)
    assert inter.f[j, 0] - off.f[j, 0] == pytest.approx(14 * 8e-6 + 2 * 7 / 8 * 2.0 * n * 4096 / 46e9)


def test_dp_sync_by_hand():
    p = 1e9
    assert dp_sync_seconds(p, 8, IB) == pytest.approx(14 * 8e-6 + 2 * 7 / 8 * 4e9 / 46e9)
    z1 = 7 * 8e-6 + 7 / 8 * 4e9 / 46e9 + 7 * 8e-6 + 7 / 8 * 2e9 / 46e9
    assert dp_sync_seconds(p, 8, IB, zero=1) == pytest.approx(z1)
    assert dp_sync_seconds(p, 8, IB, zero=2) == pytest.approx(z1)
    assert dp_sync_seconds(p, 1, IB) == 0.0


def test_zero_memory_by_hand():
    # Megatron's 18 bytes: bf16 weight 2 + fp32 grad 4 + optimizer 12
    assert static_bytes_per_param(18, dp=8, zero=0) == 18
    assert static_bytes_per_param(18, dp=8, zero=1) == pytest.approx(2 + 4 + 12 / 8)
    assert static_bytes_per_param(18, dp=8, zero=2) == pytest.approx(2 + 4 / 8 + 12 / 8)
    # ZeRO's own accounting: 16 bytes with 16-bit gradients; ZeRO-2 at dp=64: 2 + 14/64
    assert static_bytes_per_param(16, dp=64, zero=2, grad_bytes=2) == pytest.approx(2 + 14 / 64)
    m = preset("llama3_8b")
    base = AnalyticCostModel(tp=2, tp_collectives=False).table(m, ONE)
    z2 = AnalyticCostModel(tp=2, dp=4, zero=2, tp_collectives=False).table(m, ONE)
    assert np.allclose(z2.static_bytes, base.params * (2 + 1 + 3) / 2)
    assert np.allclose(base.static_bytes, base.params * 18 / 2)
    with pytest.raises(ConfigError):
        static_bytes_per_param(5)


def test_group_link():
    c = Cluster("two", (H100,), (0, 0, 0, 0), (0, 0, 1, 1), NV, IB)
    assert group_link(c, [0, 1]) is NV and group_link(c, [1, 2]) is IB and group_link(c, [3]) is None
