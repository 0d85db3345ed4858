"""1F1B (PipeDream-Flush, Narayanan et al. 2021): warm-up forwards, then one forward per backward."""
from __future__ import annotations

from octopipe.schedule.action import Action, B, F
from octopipe.schedule.generators._common import Row, check_shape, require, table
from octopipe.schedule.table import ScheduleTable, loop_placement


def one_f_one_b_row(n_devices: int, device: int, n_microbatches: int, stage: int) -> Row:
    """Device order of synchronous 1F1B: p-1-d warm-up F, then F/B pairs, then the cool-down B."""
    m = n_microbatches
    warm = min(n_devices - 1 - device, m)
    row: Row = [Action(stage, F, k) for k in range(warm)]
    for k in range(m - warm):
        row += [Action(stage, F, warm + k), Action(stage, B, k)]
    row += [Action(stage, B, k) for k in range(m - warm, m)]
    return row


def one_f_one_b(n_devices: int, n_microbatches: int, chunks: int = 1) -> ScheduleTable:
    """Synchronous 1F1B with a flush; needs m ≥ p (as torch's Schedule1F1B)."""
    check_shape("1f1b", n_devices, n_microbatches, chunks)
    require(chunks == 1, f"1f1b runs one stage per device (chunks=1), got chunks={chunks}; "
            "use interleaved for several stages per device")
    require(n_microbatches >= n_devices,
            f"1f1b needs at least as many micro-batches as devices ({n_devices}) to reach its "
            f"one-forward-one-backward steady state, got n_microbatches={n_microbatches}; use "
            f"n_microbatches >= {n_devices}, or gpipe")
    rows = [one_f_one_b_row(n_devices, d, n_microbatches, d) for d in range(n_devices)]
    return table(rows, loop_placement(n_devices, 1), n_microbatches, "1f1b")
