"""GPipe (Huang et al. 2019): every forward, then every backward (all-forward-all-backward)."""
from __future__ import annotations

from octopipe.schedule.action import Action, B, F
from octopipe.schedule.generators._common import check_shape, require, table
from octopipe.schedule.table import ScheduleTable, loop_placement


def gpipe(n_devices: int, n_microbatches: int, chunks: int = 1) -> ScheduleTable:
    """Device d runs F0..F(m-1) then B0..B(m-1) of its stage d (torch's ScheduleGPipe order)."""
    check_shape("gpipe", n_devices, n_microbatches, chunks)
    require(chunks == 1, f"gpipe runs one stage per device (chunks=1), got chunks={chunks}; "
            "use looped_bfs for all-forward-all-backward over several stages per device")
    m = n_microbatches
    rows = [[Action(d, F, k) for k in range(m)] + [Action(d, B, k) for k in range(m)]
            for d in range(n_devices)]
    return table(rows, loop_placement(n_devices, 1), m, "gpipe")
