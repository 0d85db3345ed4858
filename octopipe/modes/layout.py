"""`mode=layout`: given the cluster's GPUs, the model, `layout.global_batch` sequences and the
model's sequence length, the tensor-, pipeline- and data-parallel degrees, micro-batch size and
count and per-stage recomputation with the shortest simulated iteration (`octopipe.layout`),
the top `layout.top` layouts beside it, and the best layout's plan written as mode=plan writes
one (plan.json, schedule.csv)."""
from __future__ import annotations

from dataclasses import replace

from rich.table import Table

from octopipe.config.cost import AnalyticCost
from octopipe.errors import ConfigError
from octopipe.layout import Grid, search
from octopipe.layout.evaluate import Evaluation
from octopipe.modes.artifacts import json_artifact, plan_artifacts
from octopipe.modes.inputs import Inputs
from octopipe.modes.mode_result import Result
from octopipe.progress import weighted_progress

GIB = 2.0 ** 30


def layout_table(title: str, rows: list[Evaluation]) -> Table:
    """The ranked layouts as a terminal table."""
    table = Table(title=title)
    for col in ("#", "tp", "pp", "dp", "mbs", "m", "recompute", "iter s", "tokens/s", "MFU",
                "GiB/GPU", "bubble", "TP exp s", "DP exp s", "how"):
        table.add_column(col, justify="left" if col in ("recompute", "how") else "right",
                         no_wrap=True)
    for k, e in enumerate(rows, 1):
        L, rc = e.layout, e.recompute_value()
        table.add_row(str(k), str(L.tp), str(L.pp), str(L.dp), str(L.micro_batch_size),
                      str(L.microbatches), rc if isinstance(rc, str) else "/".join(x[0] for x in rc),
                      f"{e.iteration_s:.2f}", f"{e.tokens_per_s:,.0f}", f"{e.mfu:.1%}",
                      f"{e.peak_memory_bytes / GIB:.1f}", f"{e.bubble_ratio:.1%}",
                      f"{e.tp_exposed_s:.2f}", f"{e.dp_exposed_s:.2f}", e.how)
    return table


def run(inputs: Inputs) -> Result:
    cfg = inputs.config
    lc = cfg.layout
    if not isinstance(cfg.cost, AnalyticCost) or cfg.cost.source != "analytic":
        raise ConfigError(f"mode=layout prices every tp, micro-batch size and recomputation from "
                          f"the model's shapes: use cost=analytic (not cost={cfg.cost.source})")
    model = inputs.model
    grid = Grid.of(cfg.cluster, lc.gpus)
    with weighted_progress("layout", show=inputs.interactive) as update:
        found = search(model, grid, cfg.cost, lc, cfg.seed, update)
    best = found.best
    top = found.top(lc.top)
    head = (f"[bold]OctoPipe layout[/]: {model.name} on {grid.n_gpus} GPUs ({grid.gpus.name}), "
            f"global batch {lc.global_batch} x {model.seq_len} tokens; {found.layouts} layouts, "
            f"{found.candidates_evaluated} simulated ({found.tuned} tuned, {found.pruned} cut by "
            f"the lower bound, {found.infeasible} out of memory)")
    L = best.layout
    line = (f"best: tp {L.tp} x pp {L.pp} x dp {L.dp}, micro-batch {L.micro_batch_size} x "
            f"{L.microbatches}, recompute {best.recompute_value()}: {best.iteration_s:.2f} s per "
            f"iteration, {best.tokens_per_s:,.0f} tokens/s, MFU {best.mfu:.1%}, "
            f"{best.peak_memory_bytes / GIB:.1f} GiB per GPU ({best.schedule})")
    summary = {"status": "ok", "model": model.name, "cluster": grid.gpus.name,
               "gpus": grid.n_gpus, "global_batch": lc.global_batch, "seq_len": int(model.seq_len),
               "best": best.row(), "top": [e.row() for e in top],
               "candidates_evaluated": found.candidates_evaluated, "layouts": found.layouts,
               "tuned": found.tuned, "pruned_by_bound": found.pruned,
               "out_of_memory": found.infeasible}
    plan = replace(best.plan, meta={**best.plan.meta, "layout": best.row()})
    artifacts = (*plan_artifacts(plan),
                 json_artifact("layouts.json", {"ranked": [e.row() for e in found.ranked]}))
    return Result(summary, (head, layout_table(f"top {len(top)} layouts", top), line), artifacts)
