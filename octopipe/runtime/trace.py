"""The measured run as a Chrome/Perfetto trace: a track per rank, each action a slice, each
transfer a flow arrow from the sending action to the moment its message arrived."""
from __future__ import annotations

from collections.abc import Callable, Iterator

from octopipe.report.trace import TraceBuilder
from octopipe.runtime.transport import BWD, Key


def measured_trace(events: list[list[dict]], iterations: list[int] | None = None) -> dict:
    """`events[rank]` as recorded by the workers (perf_counter seconds, comparable across the
    processes of one machine); `iterations` keeps only those iterations (all when None)."""
    keep = (lambda e: True) if iterations is None else (lambda e: e["it"] in iterations)
    acts = [e for ev in events for e in ev if "action" in e and keep(e)]
    tr = TraceBuilder()
    if not acts:
        return tr.document()
    t0 = min(e["start"] for e in acts)

    def us(t: float) -> float:
        return round((t - t0) * 1e6, 3)

    tr.process(0, "octopipe runtime")
    for r in range(len(events)):
        tr.thread(0, r, f"rank {r}", sort_index=r)
    for r, ev in enumerate(events):
        for e in ev:
            if keep(e) and "action" in e:
                kind = e["action"].rstrip("0123456789").lstrip("0123456789")
                tr.slice(e["action"], kind, (0, r), us(e["start"]), us(e["end"]) - us(e["start"]),
                         {"iteration": e["it"]})
    for flow, (r, e, end) in enumerate(deliveries(events, keep), start=1):
        key = Key(*e["send"])
        name = f"{'grad' if key.direction == BWD else 'act'} s{key.stage} mb{key.microbatch}"
        args = {"bytes": e["bytes"], "to": e["dst"], "iteration": e["it"]}
        tr.slice(f"send {name}", "comm", (0, r), us(e["start"]), 1, args)
        tr.slice(f"recv {name}", "comm", (0, e["dst"]), us(end), 1, args)
        tr.flow(flow, name, "comm", (0, r, us(e["start"])), (0, e["dst"], us(end)))
    return tr.document()


def deliveries(events: list[list[dict]], keep: Callable[[dict], bool]) -> Iterator[tuple[int, dict, float]]:
    """Each kept send of rank r with the time its message arrived at its destination (the
    arrival of the same key and iteration there); sends with no recorded arrival are skipped."""
    arrivals = {(e["it"], tuple(e["recv"]), r): e["end"]
                for r, ev in enumerate(events) for e in ev if "recv" in e and keep(e)}
    for r, ev in enumerate(events):
        for e in ev:
            if "send" in e and keep(e):
                end = arrivals.get((e["it"], tuple(e["send"]), e["dst"]))
                if end is not None:
                    yield r, e, end
