"""Aggregate a benchmark-suite multirun: `python -m octopipe.tune.report <multirun dir>`.

Reads every `summary.json` written by mode=plan under the directory and prints one table (model,
devices, micro-batches, sequence, OctoPipe iteration time, speedup over the best uniform, best
balanced and best overall baseline, efficiency against the lower bound (total work / devices)
and against the layer bound (also no device before the heaviest layer's work), tuner seconds), the
geometric-mean speedups over the heterogeneous cases, and writes `suite.md`, `suite.json` and
`suite.png` (speedups, efficiency and tuner time per case) into the directory.
"""
from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

from octopipe.errors import ConfigError, OctoPipeError
from octopipe.report.figures import pyplot, save

CONTROL_PREFIX = ("llama",)


def load_cases(root: Path) -> list[dict]:
    cases = []
    for p in sorted(root.rglob("summary.json")):
        doc = json.loads(p.read_text())
        if doc.get("mode") != "plan":
            continue
        # one key per baseline whatever its chunk count (older runs wrote "..._v_4")
        for k in [k for k in doc if k.startswith("speedup_vs_") and re.search(r"_v_\d+$", k)]:
            doc[re.sub(r"_v_\d+$", "", k)] = doc.pop(k)
        doc["_dir"] = str(p.parent.relative_to(root))
        cases.append(doc)
    return cases


def geomean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def aggregate(cases: list[dict]) -> dict:
    ok = [c for c in cases if c.get("status", "ok") == "ok"]
    het = [c for c in ok if not str(c.get("model", "")).startswith(CONTROL_PREFIX)]

    def col(rows, key):
        return [r[key] for r in rows if r.get(key) is not None]
    per_baseline = sorted({k for c in het for k in c if k.startswith("speedup_vs_")
                           and not k.startswith("speedup_vs_best")})
    return {
        "geomean_speedup_per_baseline": {k[len("speedup_vs_"):]: geomean(col(het, k)) for k in per_baseline},
        "cases": len(cases), "planned": len(ok), "heterogeneous": len(het),
        "infeasible": len(cases) - len(ok),
        "geomean_speedup_vs_best_uniform": geomean(col(het, "speedup_vs_best_uniform")),
        "geomean_speedup_vs_best_balanced": geomean(col(het, "speedup_vs_best_balanced")),
        "geomean_speedup_vs_best_baseline": geomean(col(het, "speedup_vs_best_baseline")),
        "min_speedup_vs_best_baseline": min(col(het, "speedup_vs_best_baseline"), default=None),
        "mean_efficiency_vs_lower_bound": (sum(col(ok, "efficiency_vs_lower_bound")) / len(ok)) if ok else None,
        "mean_efficiency_vs_lower_bound_heterogeneous":
            (sum(col(het, "efficiency_vs_lower_bound")) / len(het)) if het else None,
        "mean_efficiency_vs_layer_bound": (sum(col(ok, "efficiency_vs_layer_bound")) / len(ok)) if ok else None,
        "mean_efficiency_vs_fill_drain_bound": (sum(col(ok, "efficiency_vs_fill_drain_bound"))
                                                / len(col(ok, "efficiency_vs_fill_drain_bound"))
                                                if col(ok, "efficiency_vs_fill_drain_bound") else None),
        "mean_efficiency_vs_layout_bound": (sum(col(ok, "efficiency_vs_layout_bound"))
                                            / len(col(ok, "efficiency_vs_layout_bound"))
                                            if col(ok, "efficiency_vs_layout_bound") else None),
        "mean_efficiency_by_pp": {p: sum(col(rows, "efficiency_vs_lower_bound")) / len(rows)
                                  for p in sorted({c.get("pp") for c in ok})
                                  for rows in [[c for c in ok if c.get("pp") == p]]},
        "max_tuner_seconds": max(col(ok, "tuner_seconds"), default=None),
        "control_geomean_speedup_vs_best_baseline": geomean(
            col([c for c in ok if c not in het], "speedup_vs_best_baseline")),
    }


def _f(x, fmt):
    return "—" if x is None else format(x, fmt)


def table_md(cases: list[dict]) -> str:
    lines = ["| model | cluster | pp | mb | seq | OctoPipe ms | vs best uniform | vs best balanced | "
             "vs best baseline (which) | efficiency | eff. vs layer bound | split layers | tuner s |",
             "|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---|---:|"]
    key = lambda c: (str(c.get("model")), c.get("pp", 0), c.get("microbatches", 0), c.get("seq_len", 0))
    for c in sorted(cases, key=key):
        if c.get("status", "ok") != "ok":
            lines.append(f"| {c.get('model')} | {c.get('cluster')} | {c.get('pp')} | {c.get('microbatches')} | "
                         f"{c.get('seq_len')} | infeasible | | | {c.get('reason', '')[:60]} | | | | |")
            continue
        pieces = c.get("split_layers") or {}
        piece_txt = f"{len(pieces)} → {sum(pieces.values())} pieces" if pieces else "—"
        lines.append(
            f"| {c['model']} | {c.get('cluster')} | {c['pp']} | {c['microbatches']} | {c.get('seq_len')} | "
            f"{c['makespan_s'] * 1e3:.1f} | {_f(c.get('speedup_vs_best_uniform'), '.2f')} | "
            f"{_f(c.get('speedup_vs_best_balanced'), '.2f')} | "
            f"{_f(c.get('speedup_vs_best_baseline'), '.2f')} ({c.get('best_baseline')}) | "
            f"{c['efficiency_vs_lower_bound']:.3f} | {_f(c.get('efficiency_vs_layer_bound'), '.3f')} | "
            f"{piece_txt} | {c['tuner_seconds']:.1f} |")
    return "\n".join(lines)


def plot(cases: list[dict], path: Path) -> None:
    plt = pyplot()
    ok = [c for c in cases if c.get("status", "ok") == "ok"]
    if not ok:
        return
    labels = [f"{c['model']} p{c['pp']} m{c['microbatches']} s{c.get('seq_len')}" for c in ok]
    x = range(len(ok))
    fig, axes = plt.subplots(4, 1, figsize=(max(8, 0.35 * len(ok)), 13))
    for key, name in (("speedup_vs_best_uniform", "best uniform"),
                      ("speedup_vs_best_balanced", "best balanced"),
                      ("speedup_vs_best_baseline", "best baseline")):
        axes[0].plot(x, [c.get(key) or float("nan") for c in ok], "o", label=name)
    axes[0].axhline(1.0, color="gray", lw=0.8)
    axes[0].set_ylabel("OctoPipe speedup")
    axes[0].legend(fontsize=7)
    axes[1].bar(x, [c["efficiency_vs_lower_bound"] for c in ok])
    axes[1].axhline(0.9, color="red", lw=0.8)
    axes[1].set_ylabel("efficiency vs lower bound")
    axes[2].bar(x, [c["tuner_seconds"] for c in ok])
    axes[2].set_ylabel("tuner seconds")
    axes[2].set_xticks(list(x), labels, rotation=90, fontsize=6)
    axes[0].set_xticks([])
    axes[1].set_xticks([])
    per = aggregate(cases)["geomean_speedup_per_baseline"]
    names = [k for k, v in per.items() if v]
    axes[3].bar(range(len(names)), [per[k] for k in names])
    axes[3].axhline(1.0, color="gray", lw=0.8)
    axes[3].set_xticks(range(len(names)), names, rotation=30, fontsize=7)
    axes[3].set_ylabel("geomean speedup\n(heterogeneous)")
    save(fig, path, dpi=110)


def report(root: Path) -> dict:
    if not root.is_dir():
        raise ConfigError(f"{root} is not a directory; pass the multirun directory of experiment=suite")
    cases = load_cases(root)
    if not cases:
        raise ConfigError(f"no mode=plan summary.json under {root}; run `python -m octopipe.run "
                          "experiment=suite` first")
    agg = aggregate(cases)
    md = table_md(cases)
    def fmt(v):
        if isinstance(v, float):
            return _f(v, ".3f")
        if isinstance(v, dict):
            return ", ".join(f"{k} {_f(x, '.3f')}" for k, x in v.items())
        return v
    text = "# OctoPipe benchmark suite\n\n" + md + "\n\n" + "\n".join(
        f"- {k}: {fmt(v)}" for k, v in agg.items()) + "\n"
    (root / "suite.md").write_text(text)
    (root / "suite.json").write_text(json.dumps({"aggregate": agg, "cases": cases}, indent=1, default=str))
    plot(cases, root / "suite.png")
    return {"aggregate": agg, "markdown": text}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m octopipe.tune.report <multirun dir>", file=sys.stderr)
        return 2
    try:
        out = report(Path(argv[0]))
    except OctoPipeError as e:
        print(f"octopipe: error: {e}", file=sys.stderr)
        return 2
    print(out["markdown"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
