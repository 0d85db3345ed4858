"""experiment=robust's report: the table of points, what the figures say, and the gain plot."""
from __future__ import annotations

from octopipe.config.experiment import RobustExperiment
from octopipe.modes.mode_result import Artifact
from octopipe.report.figures import pyplot, save


def table_md(points: list[dict]) -> str:
    rows = ["| workload | evaluated | CV | straggler | nominal mean / p90 (s) | robust mean / p90 (s) | gain | "
            "hints (nominal, robust) | same plan |", "|---|---|---|---|---|---|---|---|---|"]
    for p in points:
        rows.append(f"| {p['workload']} | {p['evaluated']} | {p['jitter_cv']:g} | {'yes' if p['straggler'] else 'no'} "
                    f"| {p['nominal_mean_s']:.5g} / {p['nominal_p90_s']:.5g} | {p['robust_mean_s']:.5g} / "
                    f"{p['robust_p90_s']:.5g} | {p['gain']:.3f} | {p['nominal_hint']}, {p['robust_hint']} | "
                    f"{'yes' if p['same_plan'] else 'no'} |")
    return "\n".join(rows)


def findings(points: list[dict]) -> list[str]:
    """Where robustness pays and where it does not, from the points themselves."""
    out = []
    for ev in ("simulated", "emulated"):
        sel = [p for p in points if p["evaluated"] == ev]
        if not sel:
            continue
        hi = [p for p in sel if p["jitter_cv"] >= 0.3 or p["straggler"]]
        zero = [p for p in sel if p["jitter_cv"] == 0 and not p["straggler"]]
        if hi:
            g = [p["gain"] for p in hi]
            met = sum(x >= 1.05 for x in g)
            out.append(f"- {ev}, CV >= 0.3 or stragglers: gain {min(g):.3f}-{max(g):.3f} (mean "
                       f"{sum(g) / len(g):.3f}); {met} of {len(g)} points reach the 5% target.")
        if zero:
            worst = min(p["gain"] for p in zero)
            out.append(f"- {ev}, CV 0: the robust plan's mean is at most {max(0.0, 1 / worst - 1):.1%} longer "
                       f"than the nominal plan's (gain {worst:.3f} at worst).")
        errs = [p["sim_vs_emulated_err"] for p in sel if "sim_vs_emulated_err" in p]
        if errs:
            hosted = [p["hosted_vs_emulated_err"] for p in sel]
            host = [p[f"{k}_host_us"] for p in sel for k in ("nominal", "robust")]
            out.append(f"- the simulator predicts the emulated launches within {max(errs):.1%} from the costs "
                       f"alone, and within {max(hosted):.1%} told the runtime's host time per action "
                       f"({min(host):.0f}-{max(host):.0f} us, measured inside each launch's actions); largest "
                       "error over both plans and every point.")
    same = sum(p["same_plan"] for p in points)
    out.append(f"- {same} of {len(points)} points keep the nominal plan's table and partition; where the "
               "robust plan differs, the gain comes from its hint and from variants with more forwards "
               "in flight or a split backward.")
    return out


def report_md(points: list[dict], ex: RobustExperiment) -> str:
    head = (f"# experiment=robust\n\nNominal plan (`tuner.objective=nominal`) against robust plan "
            f"(`tuner.objective=mean`, {ex.samples} samples), both dispatched `{ex.dispatch}`, pp = {ex.pp}, "
            f"{ex.microbatches} micro-batches; simulated on {ex.heldout} held-out draws (seed {ex.heldout_seed}+), "
            f"emulated on {ex.emulated_iterations} measured iterations per launch. "
            "Gain = nominal mean / robust mean.\n")
    return "\n".join([head, table_md(points), "", "## What the figures say", "", *findings(points), ""])


def gain_plot(points: list[dict]) -> Artifact:
    """Gain against CV, one line per (workload, evaluation); the straggler cases as crosses."""
    def write(path) -> None:
        plt = pyplot()
        fig, ax = plt.subplots(figsize=(5.5, 3.6))
        for k, key in enumerate(sorted({(p["workload"], p["evaluated"]) for p in points})):
            sel = sorted((p for p in points if (p["workload"], p["evaluated"]) == key and not p["straggler"]),
                         key=lambda p: p["jitter_cv"])
            ax.plot([p["jitter_cv"] for p in sel], [p["gain"] for p in sel], marker="o", color=f"C{k}",
                    label=f"{key[0]} ({key[1]})")
            for p in points:
                if (p["workload"], p["evaluated"]) == key and p["straggler"]:
                    ax.plot([p["jitter_cv"]], [p["gain"]], marker="x", color=f"C{k}", ms=8)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.axhline(1.05, color="grey", lw=0.8, ls=":")
        ax.set_xlabel("compute jitter CV (x: with stragglers)")
        ax.set_ylabel("nominal mean / robust mean")
        ax.legend(fontsize=7)
        save(fig, path, dpi=120)
    return Artifact("gain_vs_cv.png", write)
