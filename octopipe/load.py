"""The shared loaders every mode uses: config → ModelSpec, Cluster, CostTable."""
from __future__ import annotations

from typing import Any

from octopipe.cluster import Cluster
from octopipe.cost.table import CostTable
from octopipe.errors import ConfigError
from octopipe.model.build import build_model
from octopipe.model.spec import ModelSpec

COST_SOURCES = ("analytic", "file", "profiled")


def _get(cfg: Any, key: str, default: Any = None) -> Any:
    return cfg.get(key, default) if hasattr(cfg, "get") else getattr(cfg, key, default)


def load_model(cfg: Any) -> ModelSpec:
    """The model preset `cfg.model` (with overrides applied), validated."""
    model = _get(cfg, "model")
    if model is None:
        raise ConfigError("model: no model preset selected; pass model=<preset>")
    return build_model(model)


def tensor_parallel(cfg: Any) -> int:
    cost = _get(cfg, "cost")
    tp = _get(cost, "tp", 1) if cost is not None else 1
    if tp is None:
        return 1
    if isinstance(tp, bool) or not isinstance(tp, int):
        raise ConfigError(f"cost.tp={tp!r}: must be a positive integer")
    return tp


def load_cluster(cfg: Any) -> Cluster:
    """The cluster preset `cfg.cluster` as `cfg.pp` pipeline ranks of `cost.tp` GPUs each."""
    from octopipe.cluster_presets import cluster_from_config
    cluster = _get(cfg, "cluster")
    if cluster is None:
        raise ConfigError("cluster: no cluster preset selected; pass cluster=<preset>")
    pp = _get(cfg, "pp")
    if pp is not None and (isinstance(pp, bool) or not isinstance(pp, int)):
        raise ConfigError(f"pp={pp!r}: must be a positive integer")
    return cluster_from_config(cluster, pp=pp, tp=tensor_parallel(cfg))


def load_costs(cfg: Any, model: ModelSpec, cluster: Cluster) -> CostTable:
    """The CostTable `cfg.cost.source` names: analytic, file (a profile) or profiled (measured)."""
    cost = _get(cfg, "cost")
    source = str(_get(cost, "source", "analytic")) if cost is not None else "analytic"
    if source == "analytic":
        from octopipe.cost.analytic import analytic_costs
        return analytic_costs(cost if cost is not None else {}, model, cluster)
    if source == "file":
        from octopipe.cost.from_file import load_cost_file
        return load_cost_file(cost, model, cluster)
    if source == "profiled":
        from octopipe.cost.profiled import profiled_costs
        return profiled_costs(cost, model, cluster)
    raise ConfigError(f"cost.source={source!r}: valid: {', '.join(COST_SOURCES)}")


def load_inputs(cfg: Any) -> tuple[ModelSpec, Cluster, CostTable]:
    """Model, cluster and costs that agree layer for layer. A profile file (cost.source=file)
    may define its own layers; the model then follows the profile."""
    model = load_model(cfg)
    cluster = load_cluster(cfg)
    costs = load_costs(cfg, model, cluster)
    if costs.n_layers != model.n_layers and str(_get(_get(cfg, "cost"), "source", "")) == "file":
        from octopipe.cost.from_file import profile_model
        model = profile_model(_get(cfg, "cost"), model)
    if costs.n_layers != model.n_layers:
        raise ConfigError(f"cost: the cost table has {costs.n_layers} layers but model "
                          f"{model.name!r} has {model.n_layers}; choose a matching model or costs")
    return model, cluster, costs


def load_splitter(cfg: Any, model: ModelSpec, cluster: Cluster, costs: CostTable):
    """How the planner may split heavy layers (`octopipe.tune.split`) for these costs.

    Analytic costs price each piece from its shapes; measured costs (a profile file, or the
    profiler's per-layer times) are divided evenly across pieces, an assumption the plan records.
    """
    from octopipe.model.shard import SPLIT_DIM
    from octopipe.tune.split import model_splitter, row_splitter
    cost = _get(cfg, "cost")
    source = str(_get(cost, "source", "analytic")) if cost is not None else "analytic"
    if source == "analytic" and costs.n_layers == model.n_layers:
        return model_splitter(model, lambda m: load_costs(cfg, m, cluster))
    if costs.n_layers != model.n_layers and source == "file":
        from octopipe.cost.from_file import profile_model
        model = profile_model(cost, model)
    if costs.n_layers != model.n_layers:
        return None
    return row_splitter(costs, [x.kind in SPLIT_DIM for x in model.layers])
