"""The plan report (report.md), the timed bars of its simulation (trace.json) and its timeline.png."""
from __future__ import annotations

from pathlib import Path

from octopipe.report.markdown import cell, table
from octopipe.sim.trace import sim_timeline_png
from octopipe.tune.attribution import CAUSES

GIB = 2.0 ** 30


def sim_bars(sim) -> list[tuple]:
    """(lane, kind, start, end, text) per compute action and per transfer of a SimResult."""
    P = sim.program
    bars = []
    for c in range(P.n_compute):
        a = P.action(c)
        bars.append((f"dev {int(P.c_dev[c])}", a.kind.value, float(sim.start[c]), float(sim.end[c]), str(a)))
    for t in range(P.n_transfers):
        kind = "SEND_F" if int(P.t_dir[t]) == 0 else "SEND_B"
        bars.append((f"link {int(P.t_src[t])}→{int(P.t_dst[t])}", kind, float(sim.transfer_start[t]),
                     float(sim.transfer_end[t]), str(P.action(int(P.t_producer[t])))))
    return bars


def plan_timeline_png(path, sim, title: str) -> Path:
    """The plan's timeline.png: the device timeline of its simulation (`sim`, a SimResult)."""
    return sim_timeline_png(sim, path, title)


def search_sentence(stats: dict) -> str:
    """The search's budget and where it stopped, as a sentence (the figures are in summary.json)."""
    if not stats:
        return "No search ran."
    said = {"iterations", "evaluations", "max_evaluations", "stopped_by", "search_stopped_by",
            "polish_stopped_by", "time_cap_s", "capped_stages"}
    text = (f"The search ran {cell(stats.get('iterations'))} iterations and "
            f"{cell(stats.get('evaluations'))} of {cell(stats.get('max_evaluations'))} evaluations; "
            f"it stopped on {cell(stats.get('search_stopped_by', stats.get('stopped_by')))}, the polish on "
            f"{cell(stats.get('polish_stopped_by'))}")
    capped = stats.get("capped_stages") or []
    text += (f"; the {cell(stats.get('time_cap_s'))} s safety cap stopped {cell(capped)}." if capped
             else f"; the {cell(stats.get('time_cap_s'))} s safety cap was not reached.")
    rest = {k: v for k, v in stats.items() if k not in said}
    return text + ("" if not rest else " Also: " + cell(rest) + ".")


def ilp_table(ilp: dict) -> list[str]:
    """The ILP starting points (loop placement, V placement) as a table."""
    runs = [("loop", {k: v for k, v in (ilp or {}).items() if k != "v"})]
    if (ilp or {}).get("v"):
        runs.append(("V", ilp["v"]))
    runs = [(label, run) for label, run in runs if run]
    if not runs:
        return ["The ILP starting points did not run."]
    cols = ("method", "status", "schedule", "stages", "objective_s", "proven_optimal", "fits_memory",
            "solve_time_s", "reason")
    return ["The ILP starting points:", ""] + table(("placement", *cols),
                                                    [(label, *(run.get(c) for c in cols)) for label, run in runs])


def plan_report(res, model: str, cluster: str, pp: int, mb: int) -> str:
    """A Markdown page: the comparison, the plan's shape, where its bubbles come from, the search."""
    s = res.summary()
    tokens = res.tokens_per_iteration
    lines = [f"# OctoPipe plan: {model} on {pp} devices ({cluster}), {mb} micro-batches", ""]
    lines += [f"OctoPipe runs an iteration in **{res.makespan_s * 1e3:.1f} ms**, "
              f"{res.versus_text()}, at {s['efficiency_vs_lower_bound']:.1%} of the lower bound "
              f"({res.lower_bound_s * 1e3:.1f} ms = total work / devices). "
              f"Tuning took {res.tuner_seconds:.1f} s.", ""]
    lines += ["| schedule | partition | iteration (ms) | tokens/s | bubble | peak memory (GiB) | OctoPipe speedup |",
              "|---|---|---:|---:|---:|---:|---:|"]
    for b in res.baselines:
        r = b.row(tokens)
        if not b.feasible:
            lines.append(f"| {b.name} | {b.group} | — | — | — | — | {b.note} |")
        else:
            lines.append(f"| {b.name} | {b.group} | {r['makespan_s'] * 1e3:.1f} | "
                         f"{r['throughput_tokens_per_s']:,.0f} | {r['bubble_ratio']:.1%} | "
                         f"{r['peak_memory_bytes'] / GIB:.1f} | {res.speedup_vs(b):.2f}× |")
    lines.append(f"| **OctoPipe** | tuned | **{res.makespan_s * 1e3:.1f}** | "
                 f"**{s['throughput_tokens_per_s']:,.0f}** | {s['bubble_ratio']:.1%} | "
                 f"{s['peak_memory_bytes'] / GIB:.1f} | 1.00× |")
    lines += ["", "Uniform: Megatron-style equal layer counts. Balanced: Mist/AdaPipe-style DP "
              "partition (one stage per device). Balanced-v: ZB-V on min-max balanced stages.", ""]
    plan = res.plan
    lines += ["## The plan", "",
              f"- {plan.meta.get('candidate', '')} ({plan.meta.get('origin', '')})",
              f"- layers per stage: {s['partition_sizes']}"
              + (f" (of the model with {res.piece_text()})" if res.piece_text() else ""),
              f"- stage → device: {s['placement']}",
              f"- checks: {cell(s['checks'])}", ""]
    attr = res.attribution
    lines += ["## Where the remaining bubbles come from", "",
              "| device | busy (ms) | idle (ms) | " + " | ".join(CAUSES) + " |",
              "|---:|---:|---:|" + "---:|" * len(CAUSES)]
    for d in range(len(attr.busy)):
        lines.append(f"| {d} | {attr.busy[d] * 1e3:.1f} | {attr.idle[d] * 1e3:.1f} | "
                     + " | ".join(f"{getattr(attr, c)[d] * 1e3:.1f}" for c in CAUSES) + " |")
    lines += ["", "imbalance: the busiest device has more work; edges: pipeline fill/drain and "
              "waiting on other stages; transfer: exposed communication; memory: a ready action "
              "held back by the in-flight limit or row order.", ""]
    lines += ["## Search", "", search_sentence(res.search_stats), ""]
    lines += ilp_table(res.ilp) + ["", "| t (s) | iteration | estimate (ms) | move | candidate |",
                                   "|---:|---:|---:|---|---|"]
    for h in res.history:
        lines.append(f"| {h['t_s']:.2f} | {h['iteration']} | {h['makespan_s'] * 1e3:.1f} | "
                     f"{h['move']} | {h['candidate']} |")
    return "\n".join(lines) + "\n"

__all__ = ["plan_report", "plan_timeline_png", "sim_bars"]
