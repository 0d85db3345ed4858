"""`mode=compare`: every applicable named schedule at the three abstraction levels.

1. formula: `library.bubble_ratio` and peak in-flight activations (closed forms, uniform
   stages, F:I:W = 1:1:1);
2. idealized table: the table on unit slots (F = I = W = 1, B = 2; `idealized.idealize`):
   idle ratio, length in slots, peak live activations;
3. communication-aware simulation on the model's CostTable and the cluster (`sim.semantics`):
   makespan, bubble ratio, peak activation and total memory, throughput.

Each level ranks the schedules (by bubble ratio at the first two, by makespan at the third).
Then, per schedule, `strict` against `ready_first` (eager messages; hint = the table's order,
and the BF and BFW hints) without jitter and with lognormal jitter at each `sim.jitter_levels`
CV over `sim.seeds` seeds (the same draws for every policy). Artifacts: report.md, and
trace.json / timeline.png of the fastest simulated schedule.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from rich.table import Table

from octopipe.cluster import Cluster
from octopipe.cost.table import CostTable
from octopipe.errors import ConfigError, DeadlockError, InfeasibleError, OctoPipeError
from octopipe.modes.artifacts import compact_json_artifact, text_artifact
from octopipe.modes.inputs import Inputs
from octopipe.modes.mode_result import Artifact, Result
from octopipe.modes.simulate import check_work, estimated_actions
from octopipe.modes.targeting import import_comparison, imported_plan
from octopipe.plan import Plan, uniform_partition
from octopipe.schedule.idealized import idealize
from octopipe.schedule.library import SCHEDULES, bubble_ratio, build_schedule, inflight_microbatches
from octopipe.schedule.table import ScheduleTable
from octopipe.sim import Jitter, ReadyFirst, SimResult, Simulator
from octopipe.sim.trace import sim_timeline_png, sim_trace

Partitioner = Callable[[int], Sequence[tuple[int, int]]]


def applicable_tables(names: Sequence[str], p: int, m: int, chunks: int | None) -> tuple[dict, dict]:
    """Tables of the named schedules that exist for (p, m, chunks); and why the others don't."""
    tables, skipped = {}, {}
    for name in names:
        try:
            tables[name] = build_schedule(name, p, m, chunks)
        except OctoPipeError as e:
            skipped[name] = str(e).splitlines()[0]
    return tables, skipped


def _rank(values: Sequence[float | None]) -> list[int | None]:
    """1 = best (smallest); ties share a rank; None stays None."""
    present = sorted({round(v, 12) for v in values if v is not None})
    return [None if v is None else present.index(round(v, 12)) + 1 for v in values]


def three_levels(tables: dict[str, ScheduleTable], costs: CostTable, cluster: Cluster,
                 partition_of: Partitioner, semantics: str = "eager",
                 keep: bool = False) -> tuple[list[dict], dict[str, SimResult]]:
    """One row per schedule with the three levels' figures and ranks."""
    rows, results = [], {}
    for name, table in tables.items():
        p, m, n_s = table.n_devices, table.n_microbatches, table.n_stages
        chunks = n_s // p if not table.replicas else 1
        partition = tuple(partition_of(n_s))
        act_stage = costs.act_bytes.sum() / n_s
        row: dict[str, Any] = {"schedule": name, "n_devices": p, "microbatches": m,
                               "n_stages": n_s, "chunks": chunks}
        try:
            row["formula_bubble_ratio"] = bubble_ratio(name, p, m, chunks)
            row["formula_peak_activation_bytes"] = float(act_stage * max(
                inflight_microbatches(name, p, d, m, chunks) for d in range(p)))
        except OctoPipeError:
            row["formula_bubble_ratio"] = row["formula_peak_activation_bytes"] = None
        it = idealize(table, "1:1:1")
        row["idealized_bubble_ratio"] = it.bubble_ratio
        row["idealized_makespan_slots"] = it.makespan
        row["idealized_peak_activation_bytes"] = float(act_stage * it.peak_inflight().max())
        try:
            res = Simulator(Plan(partition, table), costs, cluster).run(semantics=semantics)
        except DeadlockError as e:
            row["sim_note"] = str(e).splitlines()[0]
            row.update(makespan_s=None, bubble_ratio=None)
            rows.append(row)
            continue
        over = res.over_capacity
        row.update(makespan_s=res.makespan, bubble_ratio=res.bubble_ratio,
                   peak_activation_memory_bytes=float(res.peak_activation_memory.max()),
                   peak_memory_bytes=float(res.peak_memory.max()),
                   capacity_bytes=float(res.durations.capacity.min()), fits_memory=not over,
                   throughput_tokens_per_s=res.throughput_tokens_per_s, mfu=res.mfu)
        if over:
            row["sim_note"] = (f"over memory on device(s) {list(over)}: peak "
                               f"{res.peak_memory.max() / 2**30:.1f} GiB > "
                               f"{res.durations.capacity.min() / 2**30:.1f} GiB")
        if keep:
            results[name] = res
        rows.append(row)
    for key, rank in (("formula_bubble_ratio", "rank_formula"), ("idealized_bubble_ratio", "rank_idealized"),
                      ("makespan_s", "rank_sim")):
        # the simulation ranks only the schedules that fit memory: an infeasible one has no rank
        values = [row.get(key) if key != "makespan_s" or row.get("fits_memory") else None for row in rows]
        for row, r in zip(rows, _rank(values)):
            row[rank] = r
    return rows, results


def policy_study(tables: dict[str, ScheduleTable], costs: CostTable, cluster: Cluster,
                 partition_of: Partitioner, levels: Sequence[float], seeds: int, seed: int) -> list[dict]:
    """strict vs ready_first per schedule, without and with jitter (the same draws for every
    policy); ready_first with the table's own order as hint, and with the BF and BFW hints."""
    out = []
    for name, table in tables.items():
        sim = Simulator(Plan(tuple(partition_of(table.n_stages)), table), costs, cluster)
        row: dict[str, Any] = {"schedule": name}
        for cv in (0.0, *levels):
            runs: dict[str, list[float]] = {"strict": [], "table": [], "bf": [], "bfw": []}
            for k in range(seeds if cv > 0 else 1):
                j = Jitter(cv=cv)
                runs["strict"].append(sim.run(jitter=j, seed=seed + k).makespan)
                for hint in ("table", "bf", "bfw"):
                    runs[hint].append(sim.run(jitter=j, seed=seed + k, policy=ReadyFirst(hint)).makespan)
            tag = f"cv{cv:g}"
            strict, ready = runs["strict"], runs["table"]
            row[f"strict_makespan_s_{tag}"] = float(np.mean(strict))
            row[f"ready_first_makespan_s_{tag}"] = float(np.mean(ready))
            row[f"ready_first_speedup_{tag}"] = float(np.mean(strict) / np.mean(ready))
            row[f"ready_first_wins_{tag}"] = int(sum(r < s * (1 - 1e-9) for s, r in zip(strict, ready)))
            row[f"ready_first_losses_{tag}"] = int(sum(r > s * (1 + 1e-9) for s, r in zip(strict, ready)))
            for hint in ("bf", "bfw"):
                row[f"ready_first_{hint}_speedup_{tag}"] = float(np.mean(strict) / np.mean(runs[hint]))
        out.append(row)
    return out


def _fmt(v: Any, pct: bool = False) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.1%}" if pct else f"{v:.4g}"
    return str(v)


def level_table(rows: list[dict]) -> Table:
    t = Table(title="three abstraction levels (rank 1 = best)")
    for col in ("schedule", "formula bubble", "rank", "table bubble", "slots", "rank",
                "sim bubble", "makespan s", "rank", "peak act GB (sim)"):
        t.add_column(col)
    for r in rows:
        t.add_row(r["schedule"], _fmt(r.get("formula_bubble_ratio"), True), _fmt(r.get("rank_formula")),
                  _fmt(r["idealized_bubble_ratio"], True), _fmt(r["idealized_makespan_slots"]),
                  _fmt(r.get("rank_idealized")), _fmt(r.get("bubble_ratio"), True),
                  _fmt(r.get("makespan_s")), _fmt(r.get("rank_sim")),
                  _fmt((r.get("peak_activation_memory_bytes") or 0) / 1e9))
    return t


def report_md(title: str, rows: list[dict], policy_rows: list[dict], skipped: dict, levels) -> str:
    lines = [f"# {title}", "", "## Three abstraction levels", "",
             "| schedule | formula bubble | rank | table bubble | slots | rank | sim bubble | makespan (s) | rank | "
             "peak act (GB) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append("| " + " | ".join([
            r["schedule"], _fmt(r.get("formula_bubble_ratio"), True), _fmt(r.get("rank_formula")),
            _fmt(r["idealized_bubble_ratio"], True), _fmt(r["idealized_makespan_slots"]),
            _fmt(r.get("rank_idealized")), _fmt(r.get("bubble_ratio"), True), _fmt(r.get("makespan_s")),
            _fmt(r.get("rank_sim")), _fmt((r.get("peak_activation_memory_bytes") or 0) / 1e9)]) + " |")
    if policy_rows:
        lines += ["", "## strict vs ready_first (mean makespan in s; speedup = strict / ready_first)", "",
                  "| schedule | " + " | ".join(f"CV {cv:g}: strict / ready_first / speedup (wins-losses); BF, BFW "
                                               f"speedups"
                                                for cv in (0.0, *levels)) + " |",
                  "|---|" + "---|" * (1 + len(levels))]
        for r in policy_rows:
            cells = []
            for cv in (0.0, *levels):
                tag = f"cv{cv:g}"
                cells.append(f"{r[f'strict_makespan_s_{tag}']:.4g} / {r[f'ready_first_makespan_s_{tag}']:.4g} / "
                             f"{r[f'ready_first_speedup_{tag}']:.3f} ({r[f'ready_first_wins_{tag}']}-"
                             f"{r[f'ready_first_losses_{tag}']}); BF {r[f'ready_first_bf_speedup_{tag}']:.3f}, "
                             f"BFW {r[f'ready_first_bfw_speedup_{tag}']:.3f}")
            lines.append(f"| {r['schedule']} | " + " | ".join(cells) + " |")
        def losses(key: str) -> str:
            out = [f"{r['schedule']} ({min(r[f'{key}_cv{cv:g}'] for cv in (0.0, *levels)):.3f})"
                   for r in policy_rows if min(r[f"{key}_cv{cv:g}"] for cv in (0.0, *levels)) < 1 - 1e-9]
            return ", ".join(out) or "none"
        top = max(policy_rows, key=lambda r: r[f"ready_first_speedup_cv{levels[-1]:g}"] if levels else 0)
        lines += ["", "Seen here (lowest speedup over the CV levels where below 1): table hint: "
                  f"{losses('ready_first_speedup')}; BF: {losses('ready_first_bf_speedup')}; BFW: "
                  f"{losses('ready_first_bfw_speedup')}. Largest table-hint gain: {top['schedule']}.", "",
                  "ready_first never idles while a ranked action is ready, but what it starts can delay "
                  "an action another device waits for. With the table's own order as hint it departs from "
                  "the row only when the row's next action is not ready, so it rarely loses. BF ranks every "
                  "backward, W included, above forwards: on zero-bubble schedules it runs the W's that the "
                  "table deferred to fill bubbles early and delays the forwards downstream devices wait for; "
                  "on interleaved schedules it breaks the chunk order. BFW (I/B, then F, then W) keeps the "
                  "deferral. Where strict order leaves a device idle because its next cell is not ready "
                  "(imbalanced stages, bidirectional pipelines, jitter), ready_first fills the gap."]
    if skipped:
        lines += ["", "## Not applicable", ""] + [f"- {k}: {v}" for k, v in skipped.items()]
    return "\n".join(lines) + "\n"


def _imported(inputs: Inputs, best_named_s: float) -> tuple[dict, list[str]]:
    """The stack configuration `schedule.*` gives, simulated beside the named schedules and
    OctoPipe's plans."""
    cfg = inputs.config
    plan = imported_plan(inputs)
    stack = cfg.schedule.imported()
    res = Simulator(plan, inputs.costs, inputs.cluster).run(policy="strict", semantics=cfg.sim.semantics)
    out, lines = import_comparison(inputs, float(res.makespan), stack)
    out["best_named_makespan_s"] = best_named_s
    return out, [f"{stack} configuration: {float(res.makespan):.4g} s (best named schedule on uniform stages: "
                 f"{best_named_s:.4g} s)", *lines]


def run(inputs: Inputs) -> Result:
    cfg = inputs.config
    model, cluster, costs = inputs.model, inputs.cluster, inputs.costs
    p, m, chunks = cfg.pp, cfg.microbatches, cfg.chunks
    semantics, levels, seeds = cfg.sim.semantics, list(cfg.sim.jitter_levels), cfg.sim.seeds
    check_work(cfg, *max((estimated_actions(cfg, name) for name in SCHEDULES), key=lambda e: e[0]))
    tables, skipped = applicable_tables(list(SCHEDULES), p, m, chunks)
    n_layers = costs.n_layers
    for name in [n for n, t in tables.items() if t.n_stages > n_layers]:
        skipped[name] = f"{tables.pop(name).n_stages} stages for {n_layers} layers"
    if not tables:
        raise ConfigError(f"no named schedule applies to pp={p}, microbatches={m}, chunks={chunks} for "
                          f"{n_layers} layers ({'; '.join(f'{k}: {v}' for k, v in skipped.items())}); "
                          "lower pp or chunks, or raise microbatches")
    part = lambda n_s: uniform_partition(n_layers, n_s)
    rows, results = three_levels(tables, costs, cluster, part, semantics, keep=True)
    simulated = [r for r in rows if r.get("makespan_s") is not None]
    if not simulated:
        raise DeadlockError(f"no schedule could be simulated: every one deadlocked ({rows[0]['schedule']}: "
                            f"{rows[0].get('sim_note')})")
    fitting = [r for r in simulated if r["fits_memory"]]
    if not fitting:
        low = min(simulated, key=lambda r: r["peak_memory_bytes"])
        raise InfeasibleError(f"no schedule fits memory: the lowest peak is {low['schedule']}'s "
                              f"{low['peak_memory_bytes'] / 2**30:.1f} GiB on a "
                              f"{low['capacity_bytes'] / 2**30:.1f} GiB device; use more devices (pp), fewer "
                              "micro-batches in flight, recomputation (cost.recompute) or a shorter model.seq_len")
    simulated = fitting
    policy_rows = policy_study(tables, costs, cluster, part, levels, seeds, cfg.seed)
    title = f"mode=compare: {model.name} on {cluster.name}, pp={p}, microbatches={m}"
    report = (level_table(rows), report_md(title, [], policy_rows, {}, levels).split("## strict", 1)[-1])
    best = min(simulated, key=lambda r: r["makespan_s"])
    res = results[best["schedule"]]
    artifacts = (text_artifact("report.md", report_md(title, rows, policy_rows, skipped, levels)),
                 compact_json_artifact("trace.json", sim_trace(res)),
                 Artifact("timeline.png", lambda path: sim_timeline_png(res, path)))
    changed = len({tuple(r.get(k) for r in rows) for k in ("rank_formula", "rank_idealized", "rank_sim")}) > 1
    extra = {}
    if cfg.schedule.imported():
        extra["comparison"], lines = _imported(inputs, best["makespan_s"])
        report = (*report, *lines)
    return Result({**extra, "model": model.name, "cluster": cluster.name, "n_devices": p, "microbatches": m,
                   "semantics": semantics, "best_schedule": best["schedule"],
                   "makespan_s": best["makespan_s"], "bubble_ratio": best["bubble_ratio"],
                   "peak_memory_bytes": best["peak_memory_bytes"],
                   "peak_activation_memory_bytes": best["peak_activation_memory_bytes"],
                   "throughput_tokens_per_s": best["throughput_tokens_per_s"], "mfu": best["mfu"],
                   "rankings_differ_between_levels": changed, "schedules": rows,
                   "policies": policy_rows, "skipped": skipped}, report, artifacts)
