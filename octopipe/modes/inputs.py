"""What a mode works on, built once by the dispatcher: the typed config and, on first use, the
model, the cluster, the costs and the layer splitter (a mode that needs none builds none)."""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from octopipe.cluster import Cluster
from octopipe.cluster_presets import cluster_from_config
from octopipe.config.cost import CostConfig, FileCost
from octopipe.config.schema import Config
from octopipe.cost.from_file import model_for_file_cost
from octopipe.cost.sources import cost_table
from octopipe.cost.table import CostTable
from octopipe.errors import ConfigError
from octopipe.model.build import build_model
from octopipe.model.pieces import split_extent, splittable
from octopipe.model.spec import ModelSpec
from octopipe.tune.splitting import LayerSplitter, model_splitter, row_splitter


def _quiet(_: str) -> None:
    """The default progress hook: report nothing."""


def splitter_for(cost: CostConfig, model: ModelSpec, cluster: Cluster,
                costs: CostTable) -> LayerSplitter | None:
    """How the planner may split heavy layers (`octopipe.tune.splitting`) for these costs.

    Analytic costs price each piece from its shapes; measured costs (a profile file, or the
    profiler's per-layer times) are divided evenly across pieces, an assumption the plan records.
    None where the costs do not match the model layer for layer."""
    if cost.source == "analytic" and costs.n_layers == model.n_layers:
        return model_splitter(model, lambda m: cost_table(cost, m, cluster))
    if costs.n_layers != model.n_layers and isinstance(cost, FileCost):
        model = model_for_file_cost(cost, model)
    if costs.n_layers != model.n_layers:
        return None
    return row_splitter(costs, [splittable(x) for x in model.layers],
                       max_pieces=[split_extent(x) for x in model.layers])


@dataclass(frozen=True)
class Inputs:
    """A run's inputs. `interactive` and `progress` are the edge's: whether a live progress bar
    may be drawn, and a hook that shows one line about long work (the case being run);
    `run_dir` where the run's results go (mode=train keeps its checkpoints below it)."""

    config: Config
    interactive: bool = False
    progress: Callable[[str], None] = field(default=_quiet, compare=False)
    run_dir: Path | None = None        # the run directory the reporter writes into (None: not known)

    @cached_property
    def model(self) -> ModelSpec:
        """The model preset, validated."""
        return build_model(self.config.model)

    @cached_property
    def cluster(self) -> Cluster:
        """The cluster preset as `pp` pipeline ranks of `cost.tp` GPUs each."""
        return cluster_from_config(self.config.cluster, pp=self.config.pp, tp=self.config.cost.tp)

    @cached_property
    def costs(self) -> CostTable:
        """The CostTable `cost.source` names, for `model` on `cluster`."""
        return cost_table(self.config.cost, self.model, self.cluster)

    @cached_property
    def costed_model(self) -> ModelSpec:
        """The model the costs describe layer for layer: a profile file (cost=file) may define
        its own layers, and the model then follows the profile."""
        model, costs = self.model, self.costs
        if costs.n_layers != model.n_layers and isinstance(self.config.cost, FileCost):
            model = model_for_file_cost(self.config.cost, model)
        if costs.n_layers != model.n_layers:
            raise ConfigError(f"cost: the cost table has {costs.n_layers} layers but model "
                              f"{model.name!r} has {model.n_layers}; choose a matching model or costs")
        return model

    @cached_property
    def splitter(self) -> LayerSplitter | None:
        """How heavy layers may split into pieces for these costs (None: they may not)."""
        return splitter_for(self.config.cost, self.model, self.cluster, self.costs)

    def piece_costs(self, pieces: Mapping[int, int]) -> CostTable:
        """The costs of the split model whose layer j runs as `pieces[j]` pieces ({}: `costs`)."""
        if not pieces:
            return self.costs
        if self.splitter is None:
            raise ConfigError("schedule.file: the plan splits layers but these costs do not match "
                              "the model layer for layer; use the plan's model and cost source")
        return self.splitter.costs_for(pieces)
