"""DualPipeV (DeepSeek-AI 2024, DualPipe's V-shaped "cut-in-half" variant; torch's ScheduleDualPipeV).

Two chunks per device in a V. The steady state pairs a forward of one chunk with a full
backward of the other (torch's OVERLAP_F_B composite, meant to overlap their communication);
here each pair is expanded into its F followed by its B. The last phases switch to split
backward (I, with W queued and issued later) to fill the drain.
"""
from __future__ import annotations

from collections import deque

from octopipe.schedule.action import Action, B, F, I, W
from octopipe.schedule.generators._common import Row, check_shape, require, table
from octopipe.schedule.table import ScheduleTable, v_placement


def _dualpipev_row(p: int, d: int, m: int) -> Row:
    down, up = d, 2 * p - 1 - d
    fwd = {down: 0, up: 0}
    bwd = {down: 0, up: 0}
    weights: deque[Action] = deque()
    row: Row = []

    def forward(stage: int) -> None:
        row.append(Action(stage, F, fwd[stage]))
        fwd[stage] += 1

    def backward(stage: int, split: bool) -> None:
        a = Action(stage, I if split else B, bwd[stage])
        row.append(a)
        bwd[stage] += 1
        if split:
            weights.append(Action(stage, W, a.microbatch))

    def pending_weight() -> None:
        if weights:
            row.append(weights.popleft())

    for _ in range(2 * (p - d - 1)):
        forward(down)
    for _ in range(d + 1):
        forward(down)
        forward(up)
    for _ in range(p - d - 1):
        backward(up, split=True)
        pending_weight()
        forward(up)
    for _ in range(m - 2 * p + d + 1):
        forward(down)
        backward(up, split=False)
        forward(up)
        backward(down, split=False)
    for _ in range(p - d - 1):
        backward(up, split=False)
        forward(up)
        backward(down, split=False)
    split = False
    for n in range(d + 1):
        if n == (d + 1) // 2 and d % 2 == 1:
            split = True
        backward(up, split)
        if n == (d + 1) // 2 and d % 2 == 0:
            split = True
        backward(down, split)
    for _ in range(p - d - 1):
        pending_weight()
        backward(down, split)
    for _ in range(d + 1):
        pending_weight()
    return row


def dualpipev(n_devices: int, n_microbatches: int, chunks: int = 2) -> ScheduleTable:
    """DualPipeV on p devices (2p stages in a V); needs chunks=2 and m ≥ 2p."""
    check_shape("dualpipev", n_devices, n_microbatches, chunks)
    require(chunks == 2, f"dualpipev needs exactly 2 chunks per device (one V), got chunks={chunks}")
    require(n_microbatches >= 2 * n_devices,
            f"dualpipev needs at least as many micro-batches as stages (2·{n_devices} = "
            f"{2 * n_devices}), got n_microbatches={n_microbatches}; use n_microbatches >= "
            f"{2 * n_devices}")
    rows = [_dualpipev_row(n_devices, d, n_microbatches) for d in range(n_devices)]
    return table(rows, v_placement(n_devices, 2), n_microbatches, "dualpipev")
