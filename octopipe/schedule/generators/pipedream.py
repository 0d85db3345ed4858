"""PipeDream (Narayanan et al. SOSP'19): asynchronous 1F1B with weight stashing.

PipeDream never flushes: every backward updates its stage's weights at once, and the forward of
a later micro-batch reads whatever version is current. Weight stashing keeps the version a
micro-batch's forward read so that its backward uses the same weights. The table is the
steady-state 1F1B order of a window of m micro-batches; `weight_versions` gives the weight
version every action reads.
"""
from __future__ import annotations

from octopipe.schedule.action import Action, B, F, W
from octopipe.schedule.generators._common import check_shape, require, table
from octopipe.schedule.generators.one_f_one_b import one_f_one_b_row
from octopipe.schedule.table import ScheduleTable, loop_placement


def pipedream(n_devices: int, n_microbatches: int, chunks: int = 1) -> ScheduleTable:
    """Device d admits p-d micro-batches (NOAM) and then alternates F and B."""
    check_shape("pipedream", n_devices, n_microbatches, chunks)
    require(chunks == 1, f"pipedream runs one stage per device (chunks=1), got chunks={chunks}")
    rows = [one_f_one_b_row(n_devices, d, n_microbatches, d) for d in range(n_devices)]
    return table(rows, loop_placement(n_devices, 1), n_microbatches, "pipedream")


def pipedream_vsync(n_devices: int, n_microbatches: int, chunks: int = 1) -> ScheduleTable:
    """PipeDream's order under vertical sync (every stage reads the version stage 0 read; see
    octopipe.asynchronous.tables): the same stream of actions, named for its update rule."""
    t = pipedream(n_devices, n_microbatches, chunks)
    return table(t.rows, t.placement, n_microbatches, "pipedream_vsync")


def pipedream_2bw(n_devices: int, n_microbatches: int, chunks: int = 1) -> ScheduleTable:
    """PipeDream-2BW (Narayanan et al. ICML'21): PipeDream's order with one update per window of
    p micro-batches and two weight buffers (octopipe.asynchronous.tables); the window must
    divide the stream."""
    require(n_microbatches % n_devices == 0 and n_microbatches >= n_devices,
            f"pipedream_2bw updates once per window of pp={n_devices} micro-batches; the window "
            f"does not divide microbatches={n_microbatches}")
    t = pipedream(n_devices, n_microbatches, chunks)
    return table(t.rows, t.placement, n_microbatches, "pipedream_2bw")


def weight_versions(sched: ScheduleTable) -> dict[Action, int]:
    """Weight version each compute action reads under PipeDream's update rule.

    A stage's version counts the weight updates it has applied: each B (or W) of that stage
    is one update. An F reads the version current when it runs (the updates earlier in its
    device's order); its I, B and W read the version stashed by that F.
    """
    updates: dict[int, int] = {}
    version: dict[Action, int] = {}
    for d in range(sched.n_devices):
        for a in sched.actions(d):
            if a.kind is F:
                version[a] = updates.get(a.stage, 0)
            else:
                version[a] = version[Action(a.stage, F, a.microbatch)]
                if a.kind in (B, W):
                    updates[a.stage] = updates.get(a.stage, 0) + 1
    return version


def forward_version(n_devices: int, stage: int, microbatch: int) -> int:
    """Closed form of the version F(stage, k) reads in steady state: max(0, k - (p-1-stage))."""
    return max(0, microbatch - (n_devices - 1 - stage))
