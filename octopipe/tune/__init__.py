"""OctoPipe's bubble-aware tuner: `tune(costs, cluster, n_devices, n_microbatches, ...)`.

See `octopipe.tune.tuner` for the flow (baselines → ILP start → iterated local search on
partition, placement and schedule policy → full simulation → memory and SMT checks).
"""
from octopipe.tune.attribution import Attribution, attribute, attribute_sim
from octopipe.tune.candidate import Candidate, Problem
from octopipe.tune.tuner import TuneResult, TunerConfig, tune

__all__ = ["tune", "TuneResult", "TunerConfig", "Candidate", "Problem", "Attribution",
           "attribute", "attribute_sim"]
