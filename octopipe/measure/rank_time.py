"""Where a rank's time goes in a measured run, from the events the workers record: computing
(the actions' own spans), deciding what runs next (the dispatcher), waiting (the rest of the
iteration: inputs not yet arrived, peers behind), the CPU its threads spend beyond computing
(transport and waiter threads; meaningful for real compute only, emulated actions sleep), and
how long each message took from its send to its arrival."""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from octopipe.runtime.trace import deliveries
from octopipe.sim.durations import Durations
from octopipe.sim.program import Program


def _mean(xs: list[float]) -> float | None:
    return float(np.mean(xs)) if xs else None


def rank_split(events: list[dict], iterations: list[int]) -> dict:
    """One rank's mean per iteration over `iterations`: span, compute, dispatch (decisions x
    their mean cost; `dispatch_us`: one decision's mean cost, where the rank recorded one),
    waiting (span less compute and dispatch), idle share (1 - compute / span) and CPU beyond
    compute (`cpu_s` less the compute spans)."""
    keep = set(iterations)
    span, compute, dispatch, waiting, extra_cpu, decision = [], [], [], [], [], []
    for it in sorted(keep):
        acts = [e for e in events if e.get("it") == it and "action" in e]
        rec = next((e for e in events if e.get("it") == it and "begin" in e), None)
        if rec is None or not acts:
            continue
        s = rec["finish"] - rec["begin"]
        c = sum(e["end"] - e["start"] for e in acts)
        d = len(acts) * (rec.get("dispatch_us") or 0.0) * 1e-6
        if rec.get("dispatch_us") is not None:
            decision.append(rec["dispatch_us"])
        span.append(s)
        compute.append(c)
        dispatch.append(d)
        waiting.append(max(s - c - d, 0.0))
        if rec.get("cpu_s") is not None:
            extra_cpu.append(max(rec["cpu_s"] - c, 0.0))
    mean_span = _mean(span)
    mean_compute = _mean(compute)
    return {"span_s": mean_span, "compute_s": mean_compute, "dispatch_s": _mean(dispatch),
            "dispatch_us": _mean(decision),
            "waiting_s": _mean(waiting), "cpu_beyond_compute_s": _mean(extra_cpu),
            "idle_share": (1.0 - mean_compute / mean_span) if mean_span else None}


def transfer_seconds(events: list[list[dict]], iterations: list[int]) -> list[float]:
    """Each message's send-to-arrival time over `iterations` (`runtime.trace.deliveries`)."""
    keep = set(iterations)
    return [end - e["start"] for _, e, end in deliveries(events, lambda e: e["it"] in keep)]


def rank_profile(events: list[list[dict]], iterations: list[int]) -> dict:
    """Per rank `rank_split`; over ranks the mean decision cost in µs, the mean transfer time in µs
    and the mean idle share."""
    ranks = [rank_split(ev, iterations) for ev in events]
    idle = [r["idle_share"] for r in ranks if r["idle_share"] is not None]
    transfers = transfer_seconds(events, iterations)
    costs = [r["dispatch_us"] for r in ranks if r["dispatch_us"] is not None]
    return {"ranks": ranks, "dispatch_us": _mean(costs), "transport_us": 1e6 * _mean(transfers) if transfers else None,
            "messages": len(transfers), "idle_share": _mean(idle)}


def host_seconds(events: list[list[dict]], program: Program, durations: Mapping[int, Durations]) -> float | None:
    """The mean, over the actions of the iterations in `durations`, of each action's span less the
    duration the model gave it that iteration (`durations[it].compute`; emulated compute sleeps
    exactly that): the runtime's host time inside an action (making and posting its message,
    the call itself); None without actions."""
    node = {str(program.action(c)): c for c in range(program.n_compute)}
    extra = [e["end"] - e["start"] - float(durations[e["it"]].compute[node[e["action"]]])
             for ev in events for e in ev if "action" in e and e.get("it") in durations]
    return float(np.mean(extra)) if extra else None
