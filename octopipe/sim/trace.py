"""Exports of a SimResult: a Chrome/Perfetto trace with send→recv flow arrows, a PNG timeline."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from octopipe.sim.program import FWD
from octopipe.sim.result import SimResult

KIND_COLOR = {0: "#4C72B0", 1: "#DD8452", 2: "#55A868", 3: "#C44E52"}
KIND_NAME = {0: "F", 1: "I", 2: "W", 3: "B"}
COMPUTE_TID, SEND_TID, RECV_TID = 0, 1, 2


def chrome_trace(res: SimResult) -> dict:
    """Trace events (microseconds): per device a compute, a send and a receive lane, a memory
    counter, and a flow arrow from each transfer's send slice to its receive slice."""
    P = res.program
    us = 1e6
    ev: list[dict] = []
    for d in range(P.n_devices):
        ev.append({"ph": "M", "name": "process_name", "pid": d, "args": {"name": f"device {d}"}})
        for tid, name in ((COMPUTE_TID, "compute"), (SEND_TID, "send"), (RECV_TID, "recv")):
            ev.append({"ph": "M", "name": "thread_name", "pid": d, "tid": tid, "args": {"name": name}})
    for c in range(P.n_compute):
        k = int(P.c_kind[c])
        ev.append({"ph": "X", "name": str(P.action(c)), "cat": KIND_NAME[k], "pid": int(P.c_dev[c]),
                   "tid": COMPUTE_TID, "ts": res.start[c] * us, "dur": (res.end[c] - res.start[c]) * us,
                   "args": {"stage": int(P.c_stage[c]), "microbatch": int(P.c_mb[c])}})
    for t in range(P.n_transfers):
        src, dst = int(P.t_src[t]), int(P.t_dst[t])
        ts, dur = res.transfer_start[t] * us, (res.transfer_end[t] - res.transfer_start[t]) * us
        label = P.transfer_label(t)
        direction = "activation" if P.t_dir[t] == FWD else "gradient"
        args = {"bytes": float(res.durations.transfer_bytes[t]), "direction": direction}
        ev.append({"ph": "X", "name": label, "cat": "send", "pid": src, "tid": SEND_TID, "ts": ts,
                   "dur": dur, "args": args})
        ev.append({"ph": "X", "name": label, "cat": "recv", "pid": dst, "tid": RECV_TID, "ts": ts,
                   "dur": dur, "args": args})
        ev.append({"ph": "s", "id": t, "name": "transfer", "cat": "flow", "pid": src, "tid": SEND_TID,
                   "ts": ts})
        ev.append({"ph": "f", "bp": "e", "id": t, "name": "transfer", "cat": "flow", "pid": dst,
                   "tid": RECV_TID, "ts": ts + dur})
    dur_ = res.durations
    for d in range(P.n_devices):
        ids = np.nonzero(P.c_dev == d)[0]
        times = np.concatenate([res.start[ids], res.end[ids]])
        delta = np.concatenate([dur_.alloc[ids], -dur_.free[ids]])
        order = np.lexsort((delta, times))
        level = dur_.static[d] + np.cumsum(delta[order])
        for tm, lv in zip(times[order], level):
            ev.append({"ph": "C", "name": "memory_bytes", "pid": d, "ts": tm * us, "args": {"bytes": float(lv)}})
    return {"traceEvents": ev, "displayTimeUnit": "ms",
            "otherData": {"table": P.table.name, "policy": res.policy, "semantics": res.semantics,
                          "makespan_s": res.makespan}}


def write_chrome_trace(res: SimResult, path: Path | str) -> None:
    Path(path).write_text(json.dumps(chrome_trace(res)))


def timeline_png(res: SimResult, path: Path | str, title: str | None = None) -> None:
    """One bar row per device (F/I/W/B colours) with its outgoing transfers as a thin lane."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    P = res.program
    scale, unit = (1e3, "ms") if res.makespan < 10 else (1.0, "s")
    fig, ax = plt.subplots(figsize=(min(24, 6 + 0.02 * P.n_compute / max(1, P.n_devices)),
                                    1.0 + 0.45 * P.n_devices))
    for d in range(P.n_devices):
        for k, color in KIND_COLOR.items():
            ids = np.nonzero((P.c_dev == d) & (P.c_kind == k))[0]
            if len(ids):
                ax.broken_barh(list(zip(res.start[ids] * scale, (res.end[ids] - res.start[ids]) * scale)),
                               (d - 0.4, 0.6), facecolors=color, edgecolor="white", linewidth=0.3)
        ts = np.nonzero(P.t_src == d)[0]
        if len(ts):
            ax.broken_barh(list(zip(res.transfer_start[ts] * scale,
                                    (res.transfer_end[ts] - res.transfer_start[ts]) * scale)),
                           (d + 0.25, 0.15), facecolors="#777777")
    ax.set_yticks(range(P.n_devices))
    ax.set_yticklabels([f"dev {d}" for d in range(P.n_devices)])
    ax.invert_yaxis()
    ax.set_xlabel(f"time ({unit})")
    ax.set_xlim(0, res.makespan * scale * 1.01 if res.makespan > 0 else 1)
    ax.set_title(title or f"{P.table.name}: {res.policy}/{res.semantics}, makespan "
                 f"{res.makespan * scale:.4g} {unit}, bubble {res.bubble_ratio:.1%}")
    handles = [Patch(color=c, label=KIND_NAME[k]) for k, c in KIND_COLOR.items()
               if (P.c_kind == k).any()] + [Patch(color="#777777", label="send")]
    ax.legend(handles=handles, loc="upper right", fontsize=8, ncol=len(handles))
    fig.tight_layout()
    fig.savefig(str(path), dpi=110)
    plt.close(fig)
