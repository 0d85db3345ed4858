"""Interleaved 1F1B (Narayanan et al. 2021, Megatron's virtual pipeline; torch's Interleaved1F1B).

Stage s lives on device s mod p. Micro-batches are taken in rounds (groups): a device runs the
forwards of one group through its first chunk, then the same group through its next chunk, and
so on (depth first); backwards visit the chunks in reverse. torch allows only micro-batch counts
divisible by the number of rounds max(1, m // p); we also accept the others by giving the first
m mod rounds groups one extra micro-batch, which reproduces torch exactly where torch applies.
"""
from __future__ import annotations

from octopipe.schedule.action import Action, B, F, I, W
from octopipe.schedule.generators._common import Row, check_shape, table
from octopipe.schedule.table import ScheduleTable, loop_placement


def microbatch_groups(n_devices: int, n_microbatches: int) -> list[range]:
    """Rounds of micro-batches: max(1, m // p) groups, sizes differing by at most one."""
    rounds = max(1, n_microbatches // n_devices)
    base, extra = divmod(n_microbatches, rounds)
    groups, lo = [], 0
    for g in range(rounds):
        size = base + (1 if g < extra else 0)
        groups.append(range(lo, lo + size))
        lo += size
    return groups


def chunk_orders(n_devices: int, device: int, n_microbatches: int, chunks: int
                 ) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(stage, micro-batch) visiting order of a device's forwards and of its backwards."""
    groups = microbatch_groups(n_devices, n_microbatches)
    fwd = [(c * n_devices + device, k) for g in groups for c in range(chunks) for k in g]
    bwd = [(c * n_devices + device, k) for g in groups for c in reversed(range(chunks)) for k in g]
    return fwd, bwd


def interleaved_row(n_devices: int, device: int, n_microbatches: int, chunks: int,
                    zero_bubble: bool) -> Row:
    """One device's time-aligned order: warm-up forwards, F/backward pairs, cool-down.

    Without `zero_bubble` (Interleaved 1F1B) the warm-up holds (v-1)·G + 2(p-1-d) forwards and
    each cool-down backward is preceded by an idle cell. With it (torch's ZB1P) the warm-up
    holds (v-1)·G + p-1-d forwards, the backward is split into I then W, and the device runs
    its first d pairs without W, so its W passes trail the I passes by d (filling the drain).
    """
    p, d, m, v = n_devices, device, n_microbatches, chunks
    fwd, bwd = chunk_orders(p, d, m, v)
    g = len(microbatch_groups(p, m)[0])
    total = v * m
    warm = min((v - 1) * g + (1 if zero_bubble else 2) * (p - 1 - d), total)
    back = I if zero_bubble else B
    row: Row = [None] * d
    row += [Action(s, F, k) for s, k in fwd[:warm]]
    if zero_bubble:
        row += [None] * (p - 1 - d)
    else:
        row += [None] * max(0, v * p + 2 * (p - 1 - d) - warm - d)
    weights = 0
    for n, (s, k) in enumerate(bwd):
        if warm + n < total:
            fs, fk = fwd[warm + n]
            row.append(Action(fs, F, fk))
        elif not zero_bubble:
            row.append(None)
        row.append(Action(s, back, k))
        if zero_bubble and n >= d:
            ws, wk = bwd[weights]
            row.append(Action(ws, W, wk))
            weights += 1
    if zero_bubble:
        row += [Action(s, W, k) for s, k in bwd[weights:]]
    return row


def interleaved(n_devices: int, n_microbatches: int, chunks: int = 2) -> ScheduleTable:
    """Interleaved 1F1B over `chunks` looped stages per device, torch's time-aligned table."""
    check_shape("interleaved", n_devices, n_microbatches, chunks)
    rows = [interleaved_row(n_devices, d, n_microbatches, chunks, zero_bubble=False)
            for d in range(n_devices)]
    return table(rows, loop_placement(n_devices, chunks), n_microbatches, "interleaved")
