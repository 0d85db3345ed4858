"""Tables, plots, report.md and summary.json of `experiment=octopipe_authors` (the side-effect
edge)."""
from __future__ import annotations

import csv
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from rich.table import Table

from octopipe.config.experiment import OctoPipeAuthorsExperiment
from octopipe.experiments.octopipe_authors_results import Case, Outcome, Results, speedups
from octopipe.modes.mode_result import Artifact
from octopipe.report.figures import pyplot, save


def _by_case(outcomes: Sequence[Outcome]) -> dict[Case, list[Outcome]]:
    out: dict[Case, list[Outcome]] = {}
    for o in outcomes:
        out.setdefault(o.case, []).append(o)
    return out


def _geomean(xs: Sequence[float]) -> float | None:
    return float(math.exp(np.mean(np.log(xs)))) if xs else None


def summarize(res: Results, exp: OctoPipeAuthorsExperiment) -> dict[str, Any]:
    """The summary.json document: every row, the check against the authors' figures, and the
    aggregates."""
    rows = []
    per_case = _by_case(res.outcomes)
    for _case, outs in per_case.items():
        sp = speedups(outs)
        for o in outs:
            row = o.row()
            if o.schedule == "octopipe":
                row.update(sp)
            rows.append(row)
    schedules = sorted({o.schedule for o in res.outcomes})
    eff = {}
    for comm in ("free", "node"):
        for s in schedules:
            xs = [o.efficiency for o in res.outcomes if o.schedule == s and o.case.comm == comm]
            if xs:
                eff[f"{s}_{comm}"] = float(np.mean(xs))
    summary: dict[str, Any] = {
        "experiment": "octopipe_authors",
        "n_cases": len(per_case),
        "tuner_used": res.tuner,
        "rows": rows,
        "mean_efficiency_vs_lower_bound": eff,
        "authors_check": [{"schedule": c.schedule, "ours_ms": c.ours_ms,
                           "authors_ms": c.authors_ms, "difference_ms": c.difference_ms,
                           "convention": c.convention} for c in res.check],
    }
    ours = [o for o in res.outcomes if o.schedule == "octopipe"]
    if not ours:
        summary["note"] = res.note
        return summary
    sp = {c: speedups(outs) for c, outs in per_case.items() if any(o.schedule == "octopipe" for o in outs)}
    summary["geomean_speedup_vs_best_baseline"] = {
        comm: _geomean([v["speedup_vs_best_baseline"] for c, v in sp.items() if c.comm == comm])
        for comm in ("free", "node")}
    summary["min_efficiency_vs_lower_bound"] = {
        f"p{p}_{comm}": min((o.efficiency for o in ours if o.case.devices == p and o.case.comm == comm),
                            default=None)
        for p in sorted({o.case.devices for o in ours}) for comm in ("free", "node")}
    summary["min_efficiency_vs_device_bound"] = {
        f"p{p}_{comm}": min((o.device_bound_s / o.makespan_s for o in ours if o.case.devices == p
                             and o.case.comm == comm and o.device_bound_s), default=None)
        for p in sorted({o.case.devices for o in ours}) for comm in ("free", "node")}
    summary["tuner_s_max"] = max(o.tuner_s or 0.0 for o in ours)
    ref = exp.authors_reference
    for o in ours:
        if o.case == Case(ref.profile, ref.devices, ref.microbatches, "free"):
            summary["reference_case"] = {
                "makespan_ms": o.makespan_s * 1e3, "tuner_s": o.tuner_s,
                "authors_octopipe_ms": float(ref.octopipe_ms),
                "speedup_vs_authors_octopipe": float(ref.octopipe_ms) / (o.makespan_s * 1e3)}
    # How much of each plan's advantage survives real transfers: speedup with comm / without.
    survive = {}
    for c, v in sp.items():
        if c.comm == "node":
            twin = Case(c.profile, c.devices, c.microbatches, "free")
            if twin in sp:
                survive[f"{c.profile}_p{c.devices}_m{c.microbatches}"] = (
                    v["speedup_vs_best_baseline"] / sp[twin]["speedup_vs_best_baseline"])
    summary["speedup_retained_with_comm"] = survive
    return summary


def _short(name: str) -> str:
    return {"nemotron_nano_v2_9b": "nemotron-9b", "gpt_oss_20b": "gpt-oss-20b",
            "deepseek_16b": "deepseek-16b", "gpt_13b": "gpt-13b"}.get(name, name)


def print_tables(console: Any, res: Results) -> None:
    for item in report_items(res):
        console.print(item)


def report_items(res: Results) -> tuple[Any, ...]:
    """The terminal report: the results table, the conventions check and the note."""
    t = Table(title="experiment=octopipe_authors: makespan, efficiency vs lower bound, bubbles")
    for col in ("model", "p", "m", "comm", "schedule", "ms", "eff", "eff dev", "bubble",
                "per device %", "pieces", "tuner s"):
        t.add_column(col, justify="left" if col in ("model", "comm", "schedule") else "right")
    for case, outs in _by_case(res.outcomes).items():
        for o in outs:
            t.add_row(_short(case.profile), str(case.devices), str(case.microbatches), case.comm,
                      o.schedule, f"{o.makespan_s * 1e3:.1f}", f"{o.efficiency:.3f}",
                      "" if not o.device_bound_s else f"{o.device_bound_s / o.makespan_s:.3f}",
                      f"{o.bubble_ratio.mean():.1%}",
                      "/".join(f"{100 * x:.0f}" for x in o.bubble_ratio),
                      _piece_text(o.pieces),
                      "" if o.tuner_s is None else f"{o.tuner_s:.1f}")
        t.add_section()
    c = Table(title="the authors' tool's baseline conventions on its quoted case (comm free)")
    for col in ("schedule", "ours ms", "authors ms", "diff ms", "convention"):
        c.add_column(col)
    for r in res.check:
        c.add_row(r.schedule, f"{r.ours_ms:.1f}", f"{r.authors_ms:.1f}",
                  f"{r.difference_ms:+.1f}", r.convention)
    return (t, c, f"[yellow]{res.note}[/yellow]") if res.note else (t, c)


def artifacts(res: Results, exp: OctoPipeAuthorsExperiment, summary: dict) -> tuple[Artifact, ...]:
    """results.csv, the three plots and report.md."""
    text = _report_md(res, summary)
    return (Artifact("results.csv", lambda path: _write_csv(path, summary["rows"])),
            Artifact("efficiency.png", lambda path: _plot_efficiency(path, res)),
            Artifact("bubbles.png", lambda path: _plot_bubbles(path, res, exp)),
            Artifact("speedup.png", lambda path: _plot_speedup(path, res)),
            Artifact("report.md", lambda path: Path(path).write_text(text)))


def write_artifacts(out_dir: Path, res: Results, exp: OctoPipeAuthorsExperiment,
                    summary: dict) -> None:
    """Write `artifacts` into `out_dir` (the CLI's reporter does this atomically)."""
    for a in artifacts(res, exp, summary):
        a.write(Path(out_dir) / a.name)


def _write_csv(path: Path, rows: Sequence[dict]) -> None:
    if not rows:
        return
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=keys)
        w.writeheader()
        for r in rows:
            w.writerow({k: (" ".join(f"{x:.4f}" for x in v) if isinstance(v, list) else v)
                        for k, v in r.items()})


def _plot_efficiency(path: Path, res: Results) -> None:
    plt = pyplot()
    profiles = list(dict.fromkeys(o.case.profile for o in res.outcomes))
    schedules = list(dict.fromkeys(o.schedule for o in res.outcomes))
    fig, axes = plt.subplots(len(profiles), 1, figsize=(12, 3 * max(1, len(profiles))), squeeze=False)
    for ax, prof in zip(axes[:, 0], profiles):
        cs = [c for c in _by_case(res.outcomes) if c.profile == prof]
        x = np.arange(len(cs))
        width = 0.8 / max(1, len(schedules))
        for j, s in enumerate(schedules):
            ys = [next((o.efficiency for o in res.outcomes if o.case == c and o.schedule == s), 0.0)
                  for c in cs]
            ax.bar(x + j * width, ys, width, label=s)
        ax.set_xticks(x + 0.4 - width / 2,
                      [f"p{c.devices} m{c.microbatches}\n{c.comm}" for c in cs], fontsize=7)
        ax.set_ylim(0, 1.25)
        ax.axhline(1.0, color="k", lw=0.5)
        ax.set_ylabel("efficiency")
        ax.set_title(prof, fontsize=9)
        ax.legend(fontsize=7, ncol=len(schedules), loc="upper center")
    save(fig, path, dpi=110)


def _plot_bubbles(path: Path, res: Results, exp: OctoPipeAuthorsExperiment) -> None:
    plt = pyplot()
    ref = exp.authors_reference
    target = Case(ref.profile, ref.devices, ref.microbatches, "free")
    outs = [o for o in res.outcomes if o.case == target]
    if not outs:
        return
    fig, ax = plt.subplots(figsize=(8, 3.5))
    width = 0.8 / len(outs)
    for j, o in enumerate(outs):
        ax.bar(np.arange(target.devices) + j * width, o.bubble_ratio, width, label=o.schedule)
    ax.set_xticks(np.arange(target.devices) + 0.4 - width / 2,
                  [f"device {d}" for d in range(target.devices)])
    ax.set_ylabel("bubble ratio")
    ax.set_title(f"per-device bubbles: {target.label}", fontsize=9)
    ax.legend(fontsize=7)
    save(fig, path, dpi=110)


def _plot_speedup(path: Path, res: Results) -> None:
    """OctoPipe's speedup over the best baseline per case, communication free against modelled."""
    sp = {c: speedups(outs) for c, outs in _by_case(res.outcomes).items()}
    sp = {c: v["speedup_vs_best_baseline"] for c, v in sp.items() if v}
    if not sp:
        return
    plt = pyplot()
    keys = list(dict.fromkeys((c.profile, c.devices, c.microbatches) for c in sp))
    fig, ax = plt.subplots(figsize=(max(6, 0.6 * len(keys)), 3.5))
    x = np.arange(len(keys))
    for j, comm in enumerate(("free", "node")):
        ys = [sp.get(Case(k[0], k[1], k[2], comm), 0.0) for k in keys]
        ax.bar(x + 0.4 * j, ys, 0.4, label=f"comm {comm}")
    ax.axhline(1.0, color="k", lw=0.5)
    ax.set_xticks(x + 0.2, [f"{_short(k[0])}\np{k[1]} m{k[2]}" for k in keys], fontsize=6)
    ax.set_ylabel("speedup vs best baseline")
    ax.legend(fontsize=7)
    save(fig, path, dpi=110)


def _report_md(res: Results, summary: dict) -> str:
    lines = ["# experiment=octopipe_authors", "",
             "Makespan per schedule on the OctoPipe authors' per-layer profiles; efficiency = lower "
             "bound "
             "(total work / devices) / makespan; eff dev = the device bound (whole layers per device, "
             "each device's unavoidable fill and drain; octopipe.tune.bounds) / makespan, which a "
             "plan that splits rows into pieces may pass (above 1); pieces = rows split and their "
             "pieces (each piece an even share of its measured row); bubble = idle share of the makespan per device. "
             "`comm=free` charges nothing for transfers (the authors' tool's assumption), "
             "`comm=node` charges latency + bytes / bandwidth on the node's links.", ""]
    for line in summary.get("cost", {}).get("profiles", []):
        lines.append(f"- {line}")
    if res.note:
        lines += ["", res.note]
    lines += ["", "| profile | p | m | comm | schedule | makespan ms | efficiency | eff dev | mean bubble | "
              "per-device bubble % | cross-device boundaries | pieces | speedup vs best baseline | tuner s |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in summary["rows"]:
        sp = r.get("speedup_vs_best_baseline")
        sp = "" if sp is None else f"{sp:.3f}"
        tuner = "" if r["tuner_s"] is None else f"{r['tuner_s']:.1f}"
        bubbles = "/".join(f"{100 * x:.0f}" for x in r["bubble_ratio_per_device"])
        effd = r.get("efficiency_vs_device_bound")
        effd = "" if effd is None else f"{effd:.3f}"
        lines.append(
            f"| {r['profile']} | {r['devices']} | {r['microbatches']} | {r['comm']} | "
            f"{r['schedule']} | {r['makespan_ms']:.1f} | {r['efficiency_vs_lower_bound']:.3f} | {effd} | "
            f"{r['bubble_ratio_mean']:.1%} | {bubbles} | {r.get('cross_device_boundaries', '')} | "
            f"{_piece_text({int(k): v for k, v in (r.get('split_rows') or {}).items()})} | {sp} | {tuner} |")
    for key in ("geomean_speedup_vs_best_baseline", "min_efficiency_vs_lower_bound",
                "min_efficiency_vs_device_bound",
                "reference_case", "speedup_retained_with_comm"):
        if key in summary:
            lines += ["", f"**{key}**: `{summary[key]}`"]
    lines += ["", "## The authors' tool's conventions on its quoted case", "",
              "| schedule | ours ms | authors ms | diff ms | convention |", "|---|---|---|---|---|"]
    for c in summary["authors_check"]:
        lines.append(f"| {c['schedule']} | {c['ours_ms']:.1f} | {c['authors_ms']:.1f} | "
                     f"{c['difference_ms']:+.1f} | {c['convention']} |")
    return "\n".join(lines) + "\n"


def _piece_text(pieces: Mapping[int, int]) -> str:
    """'3 → 6' (rows split → pieces) or '' for whole rows."""
    return f"{len(pieces)} → {sum(pieces.values())}" if pieces else ""
