"""OctoPipe's bubble-aware tuner.

    from octopipe.tune import tune
    res = tune(costs, cluster, n_devices=8, n_microbatches=16,
               tuner_cfg={"time_budget_s": 30}, solver_cfg=None, semantics="eager", seed=0)
    res.plan             # Plan: partition, placement and the frozen schedule table
    res.sim_result       # SimResult of the plan (communication-aware, strict row order)
    res.baselines        # named schedules (uniform / DP-balanced partitions), simulated
    res.history          # improvements of the search: time, iteration, makespan, move
    res.summary()        # summary.json figures: speedup_vs_best_baseline, efficiency, ...

The flow (`octopipe.tune.tuner`): baselines → ILP start (`solvers`) → iterated local search on
partition, placement and schedule policy ranked by a compiled list-scheduling estimator
(`listsched`, `search`, `moves`, steered by `attribution`) → full simulation of the finalists →
row moves into the remaining bubbles (`polish`) → memory and SMT deadlock checks (`evaluate`).
Modules: candidate (search space), balance (partition/placement helpers), baselines, freeze
(policy → table), report_md (plan report), report (suite aggregation CLI).
"""
from octopipe.tune.attribution import Attribution, attribute, attribute_sim
from octopipe.tune.candidate import Candidate, Problem
from octopipe.tune.tuner import TuneResult, TunerConfig, tune

__all__ = ["tune", "TuneResult", "TunerConfig", "Candidate", "Problem", "Attribution",
           "attribute", "attribute_sim"]
