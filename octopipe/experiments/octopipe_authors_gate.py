"""The OctoPipe authors' simulator's interleaved-1F1B gate, replayed to explain its baseline figure.

The authors' tool (PipelineSimulator, `Device.execute_workload` for STANDARD_INTERLEAVED)
runs each device's static interleaved order with one extra rule: on every device but the last,
once the warm-up forwards are done and forwards remain, the next forward may start only when
the next device has completed more backward passes than this one and the next device's latest
completed operation is a backward. It stands in for Megatron's paired `send_forward_recv_backward`
calls, which tie a device's steady-state forward to its successor's backward.

`gated_makespan` replays a compute-only table (F and full B, free communication) under that rule,
event by event. It exists for the `experiment=octopipe_authors` check only; OctoPipe's own
simulator (`octopipe.sim`) models communication semantics explicitly instead.
"""
from __future__ import annotations

from collections.abc import Sequence
from heapq import heappop, heappush

import numpy as np

from octopipe.errors import ScheduleError
from octopipe.schedule.action import ActionKind
from octopipe.schedule.table import ScheduleTable


def gated_makespan(table: ScheduleTable, stage_f: Sequence[float], stage_b: Sequence[float],
                   chunks: int) -> float:
    """Makespan of `table` (F/B actions, stage s on device s mod p) under the authors' gate."""
    p, m = table.n_devices, table.n_microbatches
    n_s = table.n_stages
    rows = [[a for a in r if a is not None] for r in table.rows]
    if any(a.kind not in (ActionKind.F, ActionKind.B) for r in rows for a in r):
        raise ScheduleError("the gated replay takes F and full-B tables only")
    warm = [(chunks - 1) * p + 2 * (p - d - 1) for d in range(p)]
    done: dict[tuple[ActionKind, int, int], float] = {}
    ptr = [0] * p
    n_f = [0] * p           # forwards started
    n_b_done = [0] * p      # backwards completed
    last_done = [None] * p  # kind of the latest completed action
    busy_until = [0.0] * p
    running: list[tuple[float, int, tuple[ActionKind, int, int]]] = []
    now = 0.0

    def ready(d: int) -> bool:
        a = rows[d][ptr[d]]
        if a.kind == ActionKind.F:
            if a.stage > 0 and done.get((ActionKind.F, a.stage - 1, a.microbatch), np.inf) > now:
                return False
            if d < p - 1 and warm[d] <= n_f[d] < chunks * m:
                return n_b_done[d] < n_b_done[d + 1] and last_done[d + 1] == ActionKind.B
            return True
        deps = [(ActionKind.F, a.stage, a.microbatch)]
        if a.stage < n_s - 1:
            deps.append((ActionKind.B, a.stage + 1, a.microbatch))
        return all(done.get(x, np.inf) <= now for x in deps)

    while True:
        for d in range(p):
            if busy_until[d] <= now and ptr[d] < len(rows[d]) and ready(d):
                a = rows[d][ptr[d]]
                dur = stage_f[a.stage] if a.kind == ActionKind.F else stage_b[a.stage]
                busy_until[d] = now + dur
                heappush(running, (busy_until[d], d, (a.kind, a.stage, a.microbatch)))
                n_f[d] += a.kind == ActionKind.F
                ptr[d] += 1
        if not running:
            break
        now = running[0][0]
        while running and running[0][0] <= now:
            t, d, key = heappop(running)
            done[key] = t
            last_done[d] = key[0]
            n_b_done[d] += key[0] == ActionKind.B
    if any(ptr[d] < len(rows[d]) for d in range(p)):
        stuck = [d for d in range(p) if ptr[d] < len(rows[d])]
        raise ScheduleError(f"the gated replay stalls on devices {stuck}")
    return max(done.values())
