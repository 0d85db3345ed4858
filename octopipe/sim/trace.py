"""Exports of a SimResult: a Chrome/Perfetto trace with send→recv flow arrows, and the device
timeline (`octopipe.schedule.timeline`) drawn as a PNG."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from octopipe.report.trace import TraceBuilder, write_trace
from octopipe.schedule.timeline import Timeline, save_timeline_png, timeline
from octopipe.sim.program import FWD, KIND_OF_CODE
from octopipe.sim.sim_result import SimResult

KIND_NAME = {code: kind.value for code, kind in enumerate(KIND_OF_CODE)}
COMPUTE_TID, SEND_TID, RECV_TID = 0, 1, 2


def sim_trace(res: SimResult) -> dict:
    """Trace events (microseconds): per device a compute, a send and a receive lane, a memory
    counter, and a flow arrow from each transfer's send slice to its receive slice."""
    P = res.program
    us = 1e6
    tr = TraceBuilder()
    for d in range(P.n_devices):
        tr.process(d, f"device {d}")
        for tid, name in ((COMPUTE_TID, "compute"), (SEND_TID, "send"), (RECV_TID, "recv")):
            tr.thread(d, tid, name)
    for c in range(P.n_compute):
        k = int(P.c_kind[c])
        tr.slice(str(P.action(c)), KIND_NAME[k], (int(P.c_dev[c]), COMPUTE_TID), res.start[c] * us,
                 (res.end[c] - res.start[c]) * us, {"stage": int(P.c_stage[c]), "microbatch": int(P.c_mb[c])})
    for t in range(P.n_transfers):
        src, dst = int(P.t_src[t]), int(P.t_dst[t])
        ts, dur = res.transfer_start[t] * us, (res.transfer_end[t] - res.transfer_start[t]) * us
        label = P.transfer_label(t)
        direction = "activation" if P.t_dir[t] == FWD else "gradient"
        args = {"bytes": float(res.durations.transfer_bytes[t]), "direction": direction}
        tr.slice(label, "send", (src, SEND_TID), ts, dur, args)
        tr.slice(label, "recv", (dst, RECV_TID), ts, dur, args)
        tr.flow(t, "transfer", "flow", (src, SEND_TID, ts), (dst, RECV_TID, ts + dur))
    dur_ = res.durations
    for d in range(P.n_devices):
        ids = np.nonzero(P.c_dev == d)[0]
        times = np.concatenate([res.start[ids], res.end[ids]])
        delta = np.concatenate([dur_.alloc[ids], -dur_.free[ids]])
        order = np.lexsort((delta, times))
        level = dur_.static[d] + np.cumsum(delta[order])
        for tm, lv in zip(times[order], level):
            tr.counter("memory_bytes", d, tm * us, {"bytes": float(lv)})
    return tr.document({"table": P.table.name, "policy": res.policy, "semantics": res.semantics,
                        "makespan_s": res.makespan})


def write_sim_trace(res: SimResult, path: Path | str) -> None:
    write_trace(path, sim_trace(res))


def sim_timeline(res: SimResult) -> Timeline:
    """The device timeline of a simulation: every compute action and every transfer."""
    P = res.program
    return timeline(P.n_devices,
                    {"device": P.c_dev, "kind": [KIND_NAME[int(k)] for k in P.c_kind],
                     "start": res.start, "end": res.end, "stage": P.c_stage, "microbatch": P.c_mb},
                    {"src": P.t_src, "dst": P.t_dst,
                     "kind": ["SEND_F" if d == FWD else "SEND_B" for d in P.t_dir.tolist()],
                     "start": res.transfer_start, "end": res.transfer_end})


def sim_timeline_png(res: SimResult, path: Path | str, title: str | None = None) -> Path:
    """The device timeline PNG of a simulation (title: table, policy, makespan, bubble)."""
    scale, unit = (1e3, "ms") if res.makespan < 10 else (1.0, "s")
    title = title or (f"{res.program.table.name}: {res.policy}/{res.semantics}, makespan "
                      f"{res.makespan * scale:.4g} {unit}, bubble {res.bubble_ratio:.1%}")
    return save_timeline_png(path, sim_timeline(res), title)

__all__ = ["sim_timeline", "sim_timeline_png", "sim_trace", "write_sim_trace"]
