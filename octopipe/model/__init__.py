"""Model description: layer kinds and shapes, presets, parameter counts."""
from octopipe.model.build import build_model
from octopipe.model.layer import LayerKind, LayerSpec
from octopipe.model.params import layer_params, model_params
from octopipe.model.pattern import parse_pattern
from octopipe.model.spec import ModelSpec
from octopipe.model.validate import validate_layer, validate_model

__all__ = ["LayerKind", "LayerSpec", "ModelSpec", "build_model", "layer_params", "model_params",
           "parse_pattern", "validate_layer", "validate_model"]
