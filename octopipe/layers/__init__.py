"""Real torch modules for every LayerKind, built from a LayerSpec.

Every layer has the same call form, `layer(x, batch) -> Tensor`: `x` is the tensor carried
from the previous layer (None before the first one) and `batch` the micro-batch's data (token
ids, targets, image patches), which every rank can rebuild locally, so a pipeline stage only
ever receives one activation tensor and sends one back as its gradient. A split layer's pieces
(`pieces.py`) follow the same form, handing on a wider carry tensor between them. `batch.py`
makes the synthetic micro-batches.

The runtime runs these modules and `cost=profiled` times them, so they sit below both.
"""
from octopipe.layers.build import build_layer, carry_shape

__all__ = ["build_layer", "carry_shape"]
