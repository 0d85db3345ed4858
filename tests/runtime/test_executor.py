"""Multi-process runs (gloo on 127.0.0.1) against the single-process reference."""
from __future__ import annotations

from dataclasses import replace

import pytest

from octopipe.cost.table import CostTable
from octopipe.plan import uniform_partition
from octopipe.runtime.launch import execute, process_context
from octopipe.runtime.stage import max_rel_err, reference_run
from octopipe.schedule.table import v_placement
from tests.runtime import tiny
from tests.runtime.random_tables import random_table

RTOL = 1e-5


def check(model, table, dispatch="ready_first", iterations=1, lr=0.0, partition=None):
    partition = partition or uniform_partition(model.n_layers, table.n_stages)
    got = execute(tiny.job(model, partition, table, dispatch=dispatch, iterations=iterations, lr=lr,
                           timeout_s=60))
    ref = reference_run(model, table.n_microbatches, iterations=iterations, lr=lr)
    assert max_rel_err(got.grads, ref.grads) <= RTOL
    for a, b in zip(got.losses, ref.losses):
        assert a == pytest.approx(b, rel=RTOL)
    return got


@pytest.mark.parametrize("dispatch", ["strict", "ready_first"])
def test_random_irregular_tables_are_exact_and_never_hang(dispatch):
    model = tiny.hybrid()
    for seed in range(3):
        table = random_table(n_devices=3, n_stages=5, n_microbatches=3, seed=seed)
        check(model, table, dispatch)


def test_v_shape_with_split_backward_on_a_vision_language_model():
    model = tiny.vlm()
    table = random_table(2, 4, 4, seed=7, split_prob=1.0, placement=v_placement(2, 2))
    check(model, table, "strict")


def test_several_sgd_steps_give_the_reference_losses():
    model = tiny.dense(2)
    table = random_table(2, 3, 2, seed=1, placement=(0, 1, 0))
    got = check(model, table, iterations=3, lr=0.5)
    assert got.losses[0] != pytest.approx(got.losses[-1], rel=1e-3)


def preset(name: str):
    from omegaconf import OmegaConf

    from octopipe.io import CONF_DIR
    from octopipe.model.build import build_model
    return build_model(OmegaConf.load(CONF_DIR / "model" / f"{name}.yaml"))


NAMED = ["gpipe", "1f1b", "interleaved", "looped_bfs", "zbh1", "zbh2", "zbv", "dualpipev", "hanayo"]


def test_every_named_schedule_is_exact_on_the_hybrid_preset():
    from octopipe.schedule.library import build_schedule
    model = preset("tiny_hybrid")
    ref = reference_run(model, 4)
    for name in NAMED:
        table = build_schedule(name, 2, 4)
        got = execute(tiny.job(model, uniform_partition(model.n_layers, table.n_stages), table, timeout_s=60))
        assert max_rel_err(got.grads, ref.grads) <= RTOL, name
        assert got.losses[0] == pytest.approx(ref.losses[0], rel=RTOL), name


@pytest.mark.parametrize("name", ["tiny_moe", "tiny_vlm"])
def test_presets_on_four_ranks_with_uneven_stages(name):
    from octopipe.schedule.library import build_schedule
    model = preset(name)
    table = build_schedule("zbh1", 4, 4)
    check(model, table, partition=((0, 1), (1, 4), (4, 8), (8, model.n_layers)))


def test_chimera_replicas_all_reduce_their_gradients_to_the_reference():
    from octopipe.schedule.library import build_schedule
    model = tiny.dense(2)
    table = build_schedule("chimera", 2, 4)
    assert table.replicas
    check(model, table, iterations=2, lr=0.3)


@pytest.mark.parametrize("dispatch", ["strict", "ready_first"])
def test_many_random_tables_on_four_ranks_finish(dispatch):
    """Emulated compute (sub-millisecond sleeps, real messages): random orders, random
    placements with several non-adjacent stages per rank, mixed B and I/W — none may hang
    (a hang becomes a RuntimeExecutionError after `stall_s`, failing the test). Every stage
    sleeps F 0.2 ms, I 0.2 ms, W 0.1 ms and sends 64 floats."""
    costs = CostTable.uniform(7, f=1.0, i=1.0, w=0.5, out_bytes=256)
    for seed in range(6):
        table = random_table(n_devices=4, n_stages=7, n_microbatches=4, seed=100 + seed)
        job = tiny.job(None, uniform_partition(table.n_stages, table.n_stages), table, dispatch=dispatch,
                       compute="emulated", emulate_step_s=2e-4, max_message_bytes=256, timeout_s=60, stall_s=10)
        res = execute(replace(job, costs=costs))
        done = sum(1 for ev in res.events for e in ev if "action" in e)
        assert done == sum(len(table.actions(d)) for d in range(4))


def test_ranks_keep_freed_memory_instead_of_page_faulting_it_in_every_iteration():
    """glibc maps a block above its mmap threshold afresh and unmaps it when freed; the threshold
    rises by itself to a freed block's size, but only up to 32 MiB, so larger activations fault
    their pages in again every iteration. A rank asks glibc to keep the heap (`keep_heap`), which
    cut a rank's page faults ~450x on the tiny interleaved run. In a child process (the setting is
    per process; one from the runtime's forkserver, which never sets it): a 48 MiB block freed and
    allocated again 6 times faults every page each time by default, and at most about once after."""
    with process_context().Pool(1) as pool:
        applied, plain, kept = pool.apply(_faults_without_and_with_keep_heap)
    if not applied:
        pytest.skip("not glibc: mallopt is unavailable")
    pages = 6 * (48 << 20) // 4096
    assert plain > pages * 4 // 5, plain            # the default: about one fault per page per round
    # kept: none alone; in a child that already ran other tests' work, one round's worth was seen
    # (the heap's free space sat elsewhere the first time)
    assert kept < pages // 4, (kept, plain)


def _faults_without_and_with_keep_heap() -> tuple[bool, int, int]:
    import resource

    import torch

    from octopipe.runtime.worker import keep_heap

    def faults() -> int:
        torch.empty(12 << 20).fill_(1.0)           # 48 MiB, once to settle
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(6):
            torch.empty(12 << 20).fill_(1.0)
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

    plain = faults()
    applied = keep_heap()
    return applied, plain, faults()
