"""Random valid irregular tables through the runtime: never a hang, never a failure, and the
gradients of the single-process reference (180 random tables held; this keeps it so).

A table is a random topological order of every action dealt to rows (tests/runtime/random_tables),
over a random placement with several non-adjacent stages per rank and a random full/split
backward per (stage, micro-batch). The default run takes one table per (transport, dispatch);
the slow set 52 per pair, 208 in all."""
from __future__ import annotations

import functools
import random

import pytest

from octopipe.plan import uniform_partition
from octopipe.runtime.launch import execute
from octopipe.runtime.stage import max_rel_err, reference_run
from tests.runtime import tiny
from tests.runtime.random_tables import random_table

RTOL = 1e-5
PAIRS = [(t, d) for t in ("tagged", "ordered") for d in ("strict", "ready_first")]
MODEL = tiny.hybrid()


@functools.cache
def reference(n_microbatches: int):
    return reference_run(MODEL, n_microbatches)


def shape(seed: int) -> tuple[int, int, int]:
    """Devices, stages, micro-batches of table `seed`: 2-4 ranks, up to 2 stages per rank."""
    rng = random.Random(seed)
    devices = rng.randint(2, 4)
    return devices, rng.randint(devices, min(2 * devices, MODEL.n_layers)), rng.randint(1, 4)


def check_tables(transport: str, dispatch: str, seeds: range) -> float:
    worst = 0.0
    for seed in seeds:
        devices, stages, mbs = shape(seed)
        table = random_table(devices, stages, mbs, seed=seed)
        got = execute(tiny.job(MODEL, uniform_partition(MODEL.n_layers, stages), table, dispatch=dispatch,
                               transport=transport, timeout_s=120, stall_s=60))
        ref = reference(mbs)
        err = max_rel_err(got.grads, ref.grads)
        assert err <= RTOL, (seed, transport, dispatch, table.as_strings())
        assert got.losses[0] == pytest.approx(ref.losses[0], rel=RTOL), seed
        worst = max(worst, err)
    return worst


@pytest.mark.parametrize("transport, dispatch", PAIRS)
def test_a_random_table_matches_the_reference(transport, dispatch):
    check_tables(transport, dispatch, range(PAIRS.index((transport, dispatch)), 1 + PAIRS.index((transport, dispatch))))


@pytest.mark.slow
@pytest.mark.parametrize("transport, dispatch", PAIRS)
def test_208_random_tables_match_the_reference(transport, dispatch):
    start = 1000 + 100 * PAIRS.index((transport, dispatch))
    worst = check_tables(transport, dispatch, range(start, start + 52))
    print(f"{transport}/{dispatch}: 52 tables, largest relative gradient error {worst:.2e}")
