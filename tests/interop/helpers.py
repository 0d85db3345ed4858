"""Small presets and fast tuner settings for the interop tests."""
from __future__ import annotations

from dataclasses import replace

from octopipe.cluster_presets import cluster_from_config
from octopipe.config.cluster import ClusterConfig
from octopipe.config.convert import convert
from octopipe.config.cost import AnalyticCost
from octopipe.config.model import ModelConfig
from octopipe.config.tuner import TunerConfig
from octopipe.cost.sources import cost_table
from octopipe.interop.target_plan import TargetCase
from octopipe.interop.units import preset_units
from octopipe.model.build import build_model
from octopipe.tune import TuneOptions

FAST = TunerConfig(max_evaluations=400, finalists=2, polish_sims=6, ilp=False)
ATTN = {"attention": {"heads": 4, "kv_heads": 2, "head_dim": 16}, "mlp": {"ffn": 256}}
SSM = {"mamba2": {"ssm_heads": 4, "ssm_head_dim": 16, "ssm_state": 16, "ssm_groups": 1},
       **ATTN}


def small_model(pattern: str = "(*-)x6", blocks: dict | None = None, **extra):
    """A small preset-style model (embedding, the pattern's layers, head)."""
    cfg = convert(ModelConfig, {"name": "small", "seq_len": 256, "vocab": 2048, "hidden": 64,
                                "pattern": pattern, "blocks": blocks or ATTN, **extra}, "model.")
    return build_model(cfg)


def case(model, pp: int, microbatches: int, tuner: TunerConfig = FAST, memory_gib: float | None = None):
    """A planning case on H100s (optionally with less memory per device)."""
    cluster = cluster_from_config(ClusterConfig(), pp=pp, tp=1)
    if memory_gib is not None:
        kinds = tuple(replace(k, memory_bytes=memory_gib * 2 ** 30) for k in cluster.kinds)
        cluster = replace(cluster, kinds=kinds)
    costs = cost_table(AnalyticCost(), model, cluster)
    return TargetCase(costs, preset_units(model), cluster, pp, microbatches,
                      TuneOptions(tuner, model=model.name))
