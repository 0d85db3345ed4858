"""Looped BFS (Lamy-Poirier 2023, breadth-first pipeline parallelism): torch's ScheduleLoopedBFS.

Stages are looped over the devices (stage s on device s mod p, torch's placement) or zig-zag
("v"). Each device runs every forward of its lowest stage, then of its next one, and so on; then
the backwards in reverse. The order is a global topological order for any placement.
"""
from __future__ import annotations

from octopipe.schedule.action import Action, B, F
from octopipe.schedule.generators._common import Row, check_shape, placement_for, table
from octopipe.schedule.table import ScheduleTable


def looped_bfs(n_devices: int, n_microbatches: int, chunks: int = 2,
               placement: str = "loop") -> ScheduleTable:
    """Time-aligned as torch's table: d leading idle cells, 2(p-1-d) between F and B phases."""
    check_shape("looped_bfs", n_devices, n_microbatches, chunks)
    p, m = n_devices, n_microbatches
    stage_map = placement_for("looped_bfs", placement, ("loop", "v"), p, chunks)
    rows: list[Row] = []
    for d in range(p):
        stages = [s for s, home in enumerate(stage_map) if home == d]
        row: Row = [None] * d
        row += [Action(s, F, k) for s in stages for k in range(m)]
        row += [None] * (2 * (p - 1 - d))
        row += [Action(s, B, k) for s in reversed(stages) for k in reversed(range(m))]
        rows.append(row)
    return table(rows, stage_map, m, "looped_bfs")
