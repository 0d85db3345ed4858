"""Deprecated: the raw-config loaders of mode=execute and the runtime benchmarks, until those
are converted to `octopipe.modes.inputs.Inputs` (the runtime's restructuring). Each converts
through the typed schema (`octopipe.config.load`) and delegates to the typed builders."""
from __future__ import annotations

from typing import Any

from octopipe.cluster import Cluster
from octopipe.cluster_presets import cluster_from_config
from octopipe.config.convert import to_plain
from octopipe.config.loader import load
from octopipe.cost.sources import cost_table
from octopipe.cost.table import CostTable
from octopipe.model.build import build_model
from octopipe.model.spec import ModelSpec


def _typed(cfg: Any):
    raw = dict(to_plain(cfg))
    return load({"cluster": {}, **raw})


def load_model(cfg: Any) -> ModelSpec:
    return build_model(_typed(cfg).model)


def load_cluster(cfg: Any) -> Cluster:
    c = _typed(cfg)
    return cluster_from_config(c.cluster, pp=c.pp, tp=c.cost.tp)


def load_costs(cfg: Any, model: ModelSpec, cluster: Cluster) -> CostTable:
    return cost_table(_typed(cfg).cost, model, cluster)


def load_splitter(cfg: Any, model: ModelSpec, cluster: Cluster, costs: CostTable):
    from octopipe.modes.inputs import splitter_for  # the shim sits below the modes it serves
    return splitter_for(_typed(cfg).cost, model, cluster, costs)
