"""The Chrome/Perfetto trace-event vocabulary (open a trace in ui.perfetto.dev or
chrome://tracing): one builder for the simulated, measured and bar traces, so every trace names
its processes, threads, slices, flows and counters the same way. Times are in microseconds."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class TraceBuilder:
    """Trace events in the order they are added, and the document that holds them."""

    def __init__(self) -> None:
        self.events: list[dict] = []

    def process(self, pid: int, name: str) -> None:
        self.events.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": name}})

    def thread(self, pid: int, tid: int, name: str, sort_index: int | None = None) -> None:
        self.events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}})
        if sort_index is not None:
            self.events.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                                "args": {"sort_index": sort_index}})

    def slice(self, name: str, cat: str, where: tuple[int, int], ts: float, dur: float,
              args: dict | None = None) -> None:
        """A complete event ("X") on thread `where` = (pid, tid)."""
        ev = {"ph": "X", "name": name, "cat": cat, "pid": where[0], "tid": where[1], "ts": ts, "dur": dur}
        if args is not None:
            ev["args"] = args
        self.events.append(ev)

    def flow(self, flow_id: int, name: str, cat: str, start: tuple[int, int, float],
             end: tuple[int, int, float]) -> None:
        """An arrow from (pid, tid, ts) `start` to `end` (a "s" and a "f" event)."""
        self.events.append({"ph": "s", "id": flow_id, "name": name, "cat": cat, "pid": start[0],
                            "tid": start[1], "ts": start[2]})
        self.events.append({"ph": "f", "bp": "e", "id": flow_id, "name": name, "cat": cat, "pid": end[0],
                            "tid": end[1], "ts": end[2]})

    def counter(self, name: str, pid: int, ts: float, args: dict) -> None:
        self.events.append({"ph": "C", "name": name, "pid": pid, "ts": ts, "args": args})

    def document(self, other: dict[str, Any] | None = None) -> dict:
        """The trace document (`otherData` when given)."""
        doc: dict[str, Any] = {"traceEvents": self.events, "displayTimeUnit": "ms"}
        if other is not None:
            doc["otherData"] = other
        return doc


def write_trace(path: str | Path, trace: dict) -> Path:
    """Write a trace document as compact JSON."""
    path = Path(path)
    path.write_text(json.dumps(trace))
    return path
