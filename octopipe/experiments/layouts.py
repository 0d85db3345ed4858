"""experiment=layouts: mode=layout's chosen layout against the widely used hand layout of each
case (simulated the same way: the same costs, TP collectives, DP gradient sync and simulator;
the named schedule on even stages) and, on the small cases, against exhaustive search (every
feasible layout tuned: the oracle).

summary.json: `cases`, one {model, cluster, chosen, hand, exhaustive} per case (`exhaustive`
null where not run), with `speedup_vs_hand` and `chosen_vs_exhaustive` (iteration-time ratios).
"""
from __future__ import annotations

import time
from dataclasses import replace

from rich.table import Table

from octopipe.config.experiment import LayoutCase, LayoutsExperiment
from octopipe.config.presets import preset
from octopipe.errors import ConfigError, InfeasibleError
from octopipe.layout import Grid, Layout, LayoutEvaluator, search
from octopipe.layout.evaluate import LEVELS, Evaluation
from octopipe.model.build import build_model
from octopipe.modes.artifacts import text_artifact
from octopipe.modes.inputs import Inputs
from octopipe.modes.mode_result import Result
from octopipe.progress import track_cases


def hand_evaluation(case: LayoutCase, ev: LayoutEvaluator) -> tuple[Evaluation | None, str]:
    """The hand layout at its recomputation, or (noted) the next level that fits memory."""
    h = case.hand
    per_replica = case.global_batch // h.dp
    if case.global_batch % h.dp or per_replica % h.micro_batch_size:
        raise ConfigError(f"experiment.cases: hand layout dp={h.dp} x micro-batch "
                          f"{h.micro_batch_size} does not divide global batch {case.global_batch}")
    layout = Layout(h.tp, h.pp, h.dp, h.micro_batch_size, per_replica // h.micro_batch_size)
    for level in LEVELS[LEVELS.index(h.recompute):]:
        got = ev.fixed(layout, h.schedule, h.chunks, level)
        if got is not None:
            note = "" if level == h.recompute else f"recompute {h.recompute} does not fit; {level}"
            return got, note
    return None, "does not fit memory at any recomputation level"


def run_case(case: LayoutCase, inputs: Inputs) -> dict:
    """One case: the search, the hand layout, and (small cases) the exhaustive oracle."""
    cfg = inputs.config
    model = build_model(preset("model", case.model))
    grid = Grid.of(preset("cluster", case.cluster), case.gpus)
    lc = replace(cfg.layout, global_batch=case.global_batch, gpus=case.gpus)
    t0 = time.perf_counter()
    try:
        found = search(model, grid, cfg.cost, lc, cfg.seed)
    except InfeasibleError as e:
        return {"model": model.name, "cluster": grid.gpus.name, "gpus": grid.n_gpus,
                "global_batch": case.global_batch, "status": "infeasible", "reason": str(e),
                "chosen": None, "hand": None, "exhaustive": None, "speedup_vs_hand": None,
                "chosen_vs_exhaustive": None}
    search_s = time.perf_counter() - t0
    ev = LayoutEvaluator(model, grid, cfg.cost, lc, cfg.seed)
    hand, hand_note = hand_evaluation(case, ev)
    oracle = None
    if case.exhaustive:
        oracle = search(model, grid, cfg.cost, replace(lc, exhaustive=True), cfg.seed)
    best = found.best
    out = {"model": model.name, "cluster": grid.gpus.name, "gpus": grid.n_gpus,
           "global_batch": case.global_batch, "status": "ok", "chosen": best.row(),
           "search_s": search_s,
           "candidates_evaluated": found.candidates_evaluated,
           "hand": hand.row() if hand is not None else None,
           "hand_layout": {"schedule": case.hand.schedule, "chunks": case.hand.chunks,
                           "source": case.hand.source, "note": hand_note},
           "speedup_vs_hand": hand.iteration_s / best.iteration_s if hand is not None else None,
           "exhaustive": oracle.best.row() if oracle is not None else None,
           "exhaustive_candidates": oracle.candidates_evaluated if oracle is not None else None,
           "chosen_vs_exhaustive": (best.iteration_s / oracle.best.iteration_s
                                    if oracle is not None else None)}
    return out


def _short(row: dict | None) -> str:
    if row is None:
        return "—"
    rc = row["recompute"] if isinstance(row["recompute"], str) else "mixed"
    return (f"tp{row['tp']} pp{row['pp']} dp{row['dp']} mbs{row['micro_batch_size']} "
            f"m{row['microbatches']} {rc}: {row['iteration_s']:.2f} s")


def report_table(cases: list[dict]) -> Table:
    table = Table(title="chosen layout vs hand layout vs exhaustive search (simulated iteration)")
    for col in ("model", "GPUs", "chosen", "hand", "× hand", "exhaustive", "chosen/exh."):
        table.add_column(col, no_wrap=True)
    for c in cases:
        sp = c["speedup_vs_hand"]
        ex = c["chosen_vs_exhaustive"]
        if c["status"] != "ok":
            table.add_row(c["model"], f"{c['gpus']} {c['cluster']}", "[yellow]fits no layout[/]",
                          "—", "—", "—", "—")
            continue
        table.add_row(c["model"], f"{c['gpus']} {c['cluster']}", _short(c["chosen"]),
                      _short(c["hand"]), f"{sp:.2f}×" if sp else "—", _short(c["exhaustive"]),
                      f"{ex:.3f}" if ex else "—")
    return table


def markdown(cases: list[dict]) -> str:
    lines = ["| model | GPUs | chosen | hand | speedup vs hand | exhaustive | chosen / exhaustive |",
             "|---|---|---|---|---|---|---|"]
    for c in cases:
        sp, ex = c["speedup_vs_hand"], c["chosen_vs_exhaustive"]
        if c["status"] != "ok":
            lines.append(f"| {c['model']} | {c['gpus']} ({c['cluster']}) | fits no layout: "
                         f"{c['reason']} | | | | |")
            continue
        lines.append(f"| {c['model']} | {c['gpus']} ({c['cluster']}) | {_short(c['chosen'])} | "
                     f"{_short(c['hand'])} | {f'{sp:.2f}x' if sp else '-'} | "
                     f"{_short(c['exhaustive'])} | {f'{ex:.3f}' if ex else '-'} |")
    return "\n".join(lines) + "\n"


def run(inputs: Inputs) -> Result:
    exp = inputs.config.experiment
    if not isinstance(exp, LayoutsExperiment):
        raise ConfigError("experiment=layouts: the experiment section is not a layouts experiment")
    cases = [run_case(c, inputs) for c in track_cases(
        exp.cases, "layouts", lambda c: f"{c.model} on {c.cluster}")]
    return Result({"status": "ok", "cases": cases}, (report_table(cases),),
                  (text_artifact("layouts.md", markdown(cases)),))
