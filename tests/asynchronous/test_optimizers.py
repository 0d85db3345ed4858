"""The optimizer library against its oracles: PD from its table equals RPD replaying PD's
delays; RPD with delta = 0 is synchronous block SGD; LocalSGD with one replica is SGD."""
import numpy as np
import pytest

from octopipe.asynchronous import optimizers as op
from octopipe.asynchronous.clocks import clock_of
from octopipe.asynchronous.objectives import logistic, make_objective, quadratic
from octopipe.asynchronous.staleness import read_delays
from octopipe.asynchronous.tables import async_schedule, localsgd_rows
from octopipe.errors import ConfigError


def _setup(S=4, M=40):
    o = quadratic(S, d=64, n_batches=20)
    return o, 0.3 / o.smoothness, [k % o.n_batches for k in range(M)]


@pytest.mark.parametrize("S", [2, 4, 5])
def test_pd_from_its_table_equals_rpd_replaying_pd_delays(S):
    o, lr, batches = _setup(S, 8 * S)
    sch = async_schedule("pd", S, 8 * S)
    pd = op.pipedream(o, sch, lr, batches, clock_of(sch.table.rows, 8 * S))
    d = read_delays(sch)
    rpd = op.rpd(o, lr, len(d.update), op.RPDSampling(pd_delays=d, replay=True), batches=batches)
    np.testing.assert_array_equal(pd.final_w, rpd.final_w)
    # and staleness matters: sequential SGD over the same batches lands elsewhere
    assert not np.allclose(pd.final_w, op.sgd(o, lr, batches).final_w)


def test_rpd_with_zero_delay_is_synchronous_block_sgd():
    o = logistic(4, d=32, n_batches=20)
    lr = 0.5 / o.smoothness
    np.testing.assert_array_equal(op.block_sgd(o, lr, 300, seed=5),
                                  op.rpd(o, lr, 300, op.RPDSampling(delta=0), seed=5).final_w)


def test_localsgd_with_one_replica_is_sgd():
    o, lr, batches = _setup()
    rows = localsgd_rows(4, 40, 1, 5)
    loc = op.localsgd(o, lr, rows, 1, 5, batches, clock_of(rows, 40))
    np.testing.assert_array_equal(loc.final_w, op.sgd(o, lr, batches).final_w)
    # a single replica waits for its own backward: 2S ticks per micro-batch
    assert clock_of(rows, 40).span_ticks == 40 * 2 * 4


def test_localsgd_barrier_waits_for_stage_zero():
    rows = localsgd_rows(4, 32, 4, 2)
    tick = {a: t for r in rows for t, a in enumerate(r) if a is not None}
    last = max(t for a, t in tick.items() if a.stage == 0 and a.kind.value == "B" and a.microbatch == 7)
    assert min(t for a, t in tick.items() if a.kind.value == "F" and a.microbatch == 8) > last


def test_recorder_checkpoints_and_the_bound():
    o, lr, batches = _setup()
    sch = async_schedule("pd", 4, 40)
    clk = clock_of(sch.table.rows, 40)
    rec = op.Recorder(o, np.linspace(0, clk.span_ticks, 5), np.zeros(0), grad_norms=True)
    run = op.pipedream(o, sch, lr, batches, clk, rec)
    assert run.ticks_values[0] == pytest.approx(o.value(o.init()))
    assert run.ticks_values[-1] == pytest.approx(o.value(run.final_w))
    assert run.ticks_values[-1] < run.ticks_values[0] and len(run.grad_sq) == 5 and run.g2 > 0
    b = op.theory_bound(4, lr, run.updates, o.smoothness, run.g2, 14, o.value(o.init()))
    assert b > np.mean(run.grad_sq) > 0


@pytest.mark.parametrize("bad", [{"lr": -1.0}, {"lr": 0.0}])
def test_bad_learning_rate_names_the_field(bad):
    o, _, batches = _setup()
    with pytest.raises(ConfigError, match="lr"):
        op.sgd(o, bad["lr"], batches)


def test_negative_delta_and_unknown_objective_name_the_field():
    o, lr, _ = _setup()
    with pytest.raises(ConfigError, match="delta"):
        op.rpd(o, lr, 5, op.RPDSampling(delta=-1))
    with pytest.raises(ConfigError, match="objective"):
        make_objective("mnist", 4)


def test_char_lm_gradient_matches_finite_differences():
    lm = make_objective("char_lm", 2)
    w = lm.init()
    v = np.random.default_rng(0).normal(size=w.shape) * 1e-3
    fd = (lm.value(w + v) - lm.value(w - v)) / 2
    assert fd == pytest.approx(float(lm.full_grad(w) @ v), rel=5e-2)
    assert lm.value(w) == pytest.approx(np.log(len(set(lm.data.tolist()))), rel=0.05)
