"""TuneResult: what `tune` found, and the summary.json figures of it."""
from __future__ import annotations

from dataclasses import dataclass, field

from octopipe.cost.table import CostTable
from octopipe.plan import Plan
from octopipe.sim.sim_result import SimResult
from octopipe.tune.attribution import Attribution
from octopipe.tune.evaluate import Evaluated
from octopipe.tune.fill_drain import FillDrain


@dataclass
class TuneResult:
    """What `tune` found: the checked plan, its simulation, and how it compares."""

    plan: Plan
    sim_result: SimResult                 # the simulation of `plan`
    evaluated: Evaluated
    history: list[dict]
    baselines: list[Evaluated]
    tuner_seconds: float
    lower_bound_s: float
    tokens_per_iteration: float
    layer_bound_s: float
    search_stats: dict = field(default_factory=dict)
    ilp: dict = field(default_factory=dict)
    costs: CostTable | None = None        # the costs the plan's layers index (split model if split)
    piece_counts: dict = field(default_factory=dict)   # original layer -> pieces the search used
    fill_drain: FillDrain | None = None   # over every plan the tuner may emit (octopipe.tune.fill_drain)
    contiguous_bound_s: float | None = None   # the same argument over one-block-per-device plans
    layout_bound_s: float | None = None   # no table on the plan's own partition + placement is shorter

    @property
    def makespan_s(self) -> float:
        return float(self.sim_result.makespan)

    @property
    def attribution(self) -> Attribution:
        return self.evaluated.attribution()

    def best_baseline(self, group: str | None = None) -> Evaluated | None:
        ok = [b for b in self.baselines if b.feasible and (group is None or b.group == group)]
        return min(ok, key=lambda b: b.makespan_s) if ok else None

    def speedup_vs(self, ev: Evaluated | None) -> float | None:
        return None if ev is None else ev.makespan_s / self.makespan_s

    def versus_text(self) -> str:
        """'1.12× faster than the best baseline (ZB-H1 balanced)', or why there is no ratio."""
        best = self.best_baseline()
        if best is None:
            return ("no baseline fits in memory (or runs) here, the OctoPipe plan does"
                    if self.baselines else "no baselines were run")
        return f"{self.speedup_vs(best):.2f}× faster than the best baseline ({best.name})"

    def piece_text(self) -> str:
        """'head (layer 53) in 2 pieces, ...' for a plan that splits layers, else ''."""
        meta = self.plan.meta
        pieces, names = self.plan.pieces, meta.get("piece_names", {})
        if not pieces:
            return ""
        parts = [f"{names.get(k, names.get(str(k), 'layer'))} (layer {k}) in {v}"
                 for k, v in sorted(pieces.items(), key=lambda kv: int(kv[0]))]
        total = sum(int(v) for v in pieces.values())
        if len(parts) > 4:
            parts = parts[:3] + [f"{len(parts) - 3} more layers"]
        how = ("pieces priced from their shapes" if meta.get("piece_costs") == "model"
               else "each piece costed as an even share of its measured layer")
        return f"{', '.join(parts)} ({len(pieces)} layers into {total} pieces; {how})"

    def _fill_drain_figures(self) -> dict:
        fd = self.fill_drain
        if fd is None:
            return {}
        return {"fill_drain_bound_s": fd.bound_s,
                "efficiency_vs_fill_drain_bound": fd.bound_s / self.makespan_s,
                "fill_drain_bound_how": fd.how,
                "fill_drain_partition_s": fd.partition_s,
                "contiguous_bound_s": self.contiguous_bound_s,
                "efficiency_vs_contiguous_bound": (None if self.contiguous_bound_s is None
                                                   else self.contiguous_bound_s / self.makespan_s)}

    def summary(self) -> dict:
        """The summary.json figures (snake_case, units in the names)."""
        s = self.sim_result
        best = self.best_baseline()
        bu, bb = self.best_baseline("uniform"), self.best_baseline("balanced")
        out = {
            "makespan_s": self.makespan_s,
            "throughput_tokens_per_s": self.tokens_per_iteration / self.makespan_s,
            "bubble_ratio": float(s.bubble_ratio),
            "peak_memory_bytes": float(max(s.peak_memory)),
            "device_peak_memory_bytes": [float(x) for x in s.peak_memory],
            "lower_bound_s": self.lower_bound_s,
            "efficiency_vs_lower_bound": self.lower_bound_s / self.makespan_s,
            "layer_bound_s": self.layer_bound_s,
            "efficiency_vs_layer_bound": self.layer_bound_s / self.makespan_s,
            **self._fill_drain_figures(),
            "layout_bound_s": self.layout_bound_s,
            "efficiency_vs_layout_bound": (None if self.layout_bound_s is None
                                           else self.layout_bound_s / self.makespan_s),
            "tuner_seconds": self.tuner_seconds,
            "best_baseline": best.name if best else None,
            "speedup_vs_best_baseline": self.speedup_vs(best),
            "best_uniform_baseline": bu.name if bu else None,
            "speedup_vs_best_uniform": self.speedup_vs(bu),
            "best_balanced_baseline": bb.name if bb else None,
            "speedup_vs_best_balanced": self.speedup_vs(bb),
            "n_stages": len(self.plan.partition),
            "partition_sizes": [hi - lo for lo, hi in self.plan.partition],
            "placement": list(self.plan.placement),
            "plan_origin": self.plan.meta.get("origin", ""),
            "split_layers": {str(k): v for k, v in self.plan.pieces.items()},
            "bubble_causes_s": self.attribution.totals(),
            "checks": self.evaluated.checks,
            "search": self.search_stats,
            "memory_lower_bound_s": self.search_stats.get("memory_lower_bound_s"),
            "efficiency_vs_memory_bound": (self.search_stats["memory_lower_bound_s"] / self.makespan_s
                                           if self.search_stats.get("memory_lower_bound_s") else None),
            "objective": self.search_stats.get("robust", {}).get("objective", "nominal"),
            "robust_score_s": self.plan.meta.get("robust", {}).get("score_s"),
            "robust_hint": self.plan.meta.get("robust", {}).get("hint"),
        }
        for b in self.baselines:
            label = b.name.split(" (")[0]          # "I-1F1B (v=4)" -> one key for any chunk count
            key = "".join(ch if ch.isalnum() else "_" for ch in label.lower()).strip("_")
            while "__" in key:
                key = key.replace("__", "_")
            out[f"speedup_vs_{key}"] = self.speedup_vs(b) if b.feasible else None
        return out
