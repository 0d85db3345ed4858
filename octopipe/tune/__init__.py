"""OctoPipe's bubble-aware tuner.

    from octopipe.tune import TuneOptions, tune
    res = tune(costs, cluster, n_devices=8, n_microbatches=16,
               options=TuneOptions(tuner={"max_evaluations": 8000}, semantics="eager", seed=0))
    res.plan             # Plan: partition, placement and the frozen schedule table
    res.sim_result       # SimResult of the plan (communication-aware, strict row order)
    res.baselines        # named schedules (uniform / DP-balanced partitions), simulated
    res.history          # improvements of the search: time, iteration, makespan, move
    res.summary()        # summary.json figures: speedup_vs_best_baseline, efficiency, ...

The flow (`octopipe.tune.tuner`, named stages over one `TuneState`, each with its own budget):
baselines → starting points (split layers) → iterated local search on partition, placement and
schedule policy ranked by a compiled list-scheduling estimator (`listsched`, `search`, `moves`,
steered by `attribution`), with the ILP starts from `solvers` solved beside it and joining its
pool at the end → finalists: full simulation and row
moves into the remaining bubbles (`polish`) → checks: memory and SMT deadlock (`evaluate`).
Modules: candidate (search space and problem), balance (placement helpers), bounds (lower,
layer and device bounds), baselines, freeze (policy → table), result (TuneResult), report_md
(plan report), report (suite aggregation CLI).
"""
from octopipe.tune.attribution import Attribution, attribute, attribute_sim
from octopipe.tune.candidate import Candidate, Problem
from octopipe.tune.tune_result import TuneResult
from octopipe.tune.tuner import TuneOptions, TunerConfig, tune

__all__ = [
           "Attribution",
           "Candidate",
           "Problem",
           "TuneOptions",
           "TuneResult",
           "TunerConfig",
           "attribute",
           "attribute_sim",
           "tune",
]
