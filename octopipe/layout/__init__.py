"""mode=layout: the search over tensor, pipeline and data parallelism, micro-batching and
recomputation, with OctoPipe's pipeline planner inside (`octopipe.layout.search.search`)."""
from octopipe.layout.evaluate import Evaluation, LayoutEvaluator
from octopipe.layout.rank_grid import Grid
from octopipe.layout.search import LayoutSearch, search
from octopipe.layout.space import Layout, enumerate_layouts, valid_tp

__all__ = ["Evaluation", "Grid", "Layout", "LayoutEvaluator", "LayoutSearch", "enumerate_layouts",
           "search", "valid_tp"]
