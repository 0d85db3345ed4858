"""The measured run as a Chrome/Perfetto trace: a track per rank, each action a slice, each
transfer a flow arrow from the sending action to the moment its message arrived."""
from __future__ import annotations

from octopipe.runtime.transport import BWD, Key


def measured_trace(events: list[list[dict]], iterations: list[int] | None = None) -> dict:
    """`events[rank]` as recorded by the workers (perf_counter seconds, comparable across the
    processes of one machine); `iterations` keeps only those iterations (all when None)."""
    keep = (lambda e: True) if iterations is None else (lambda e: e["it"] in iterations)
    acts = [e for ev in events for e in ev if "action" in e and keep(e)]
    if not acts:
        return {"traceEvents": [], "displayTimeUnit": "ms"}
    t0 = min(e["start"] for e in acts)
    us = lambda t: round((t - t0) * 1e6, 3)
    out: list[dict] = [{"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "octopipe runtime"}}]
    for r in range(len(events)):
        out.append({"ph": "M", "name": "thread_name", "pid": 0, "tid": r, "args": {"name": f"rank {r}"}})
        out.append({"ph": "M", "name": "thread_sort_index", "pid": 0, "tid": r, "args": {"sort_index": r}})
    arrivals = {}
    for r, ev in enumerate(events):
        for e in ev:
            if not keep(e):
                continue
            if "action" in e:
                kind = e["action"].rstrip("0123456789").lstrip("0123456789")
                out.append({"ph": "X", "name": e["action"], "cat": kind, "pid": 0, "tid": r,
                            "ts": us(e["start"]), "dur": us(e["end"]) - us(e["start"]),
                            "args": {"iteration": e["it"]}})
            elif "recv" in e:
                arrivals[(e["it"], tuple(e["recv"]), r)] = e["end"]
    flow = 0
    for r, ev in enumerate(events):
        for e in ev:
            if "send" not in e or not keep(e):
                continue
            key = Key(*e["send"])
            end = arrivals.get((e["it"], tuple(key), e["dst"]))
            if end is None:
                continue
            flow += 1
            name = f"{'grad' if key.direction == BWD else 'act'} s{key.stage} mb{key.microbatch}"
            args = {"bytes": e["bytes"], "to": e["dst"], "iteration": e["it"]}
            out.append({"ph": "X", "name": f"send {name}", "cat": "comm", "pid": 0, "tid": r,
                        "ts": us(e["start"]), "dur": 1, "args": args})
            out.append({"ph": "s", "name": name, "cat": "comm", "id": flow, "pid": 0, "tid": r,
                        "ts": us(e["start"])})
            out.append({"ph": "X", "name": f"recv {name}", "cat": "comm", "pid": 0, "tid": e["dst"],
                        "ts": us(end), "dur": 1, "args": args})
            out.append({"ph": "f", "bp": "e", "name": name, "cat": "comm", "id": flow, "pid": 0,
                        "tid": e["dst"], "ts": us(end)})
    return {"traceEvents": out, "displayTimeUnit": "ms"}
