"""`cost`: where the CostTable comes from. `source` chooses the section's dataclass:
analytic (roofline model), file (a measured profile), profiled (timed on this machine)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from octopipe.config.fields import setting


@dataclass(frozen=True)
class AnalyticCost:
    """Analytic roofline cost model (octopipe/cost/analytic.py)."""

    source: Literal["analytic"] = setting("analytic", "analytic | file | profiled")
    efficiency: float = setting(0.5, "fraction of peak FLOP/s and memory bandwidth reached by "
                                     "kernels", gt=0, le=1)
    tp: int = setting(1, "tensor-parallel degree inside each pipeline device (with sequence "
                         "parallelism)", ge=1)
    recompute: Literal["none", "selective", "full"] = setting("none", "activation recomputation")
    flash_attention: bool = setting(True, "false: attention stores its s x s scores "
                                          "(Korthikanti's 5·a·s²·b term)")
    dropout: bool = setting(False, "true: dropout masks as in Korthikanti et al. 2022 "
                                   "(34·s·b·h per GPT block)")
    bytes_per_param: float = setting(18.0, "parameter + gradient + optimizer bytes per parameter "
                                           "(mixed-precision Adam: 18; ZeRO: 16)", gt=0)
    sequence_parallel: bool = setting(False, "TP collectives as all-gather + reduce-scatter "
                                             "(sequence parallelism) instead of all-reduces")
    tp_collectives: bool = setting(True, "time the TP collectives (octopipe/cost/collectives.py) "
                                         "on the TP group's link; false: TP only divides work")
    tp_overlap: bool = setting(False, "TP collectives overlap their pass's compute (the pass "
                                      "takes the longer of the two) instead of adding to it")
    tp_link: Literal["intra", "inter"] = setting(
        "intra", "link of the TP group: intra (inside a node) | inter (TP across nodes)")
    collective_algorithm: Literal["ring", "tree"] = setting("ring", "all-reduce algorithm")
    dp: int = setting(1, "data-parallel degree (replicas of the pipeline); with zero > 0 it "
                         "divides optimizer state (and gradients)", ge=1)
    zero: int = setting(0, "ZeRO stage: 0 none, 1 optimizer state / dp, 2 and gradients / dp",
                        ge=0, le=2)
    grad_bytes: float = setting(4.0, "bytes per gradient (fp32 accumulation), part of "
                                     "bytes_per_param; what DP synchronizes", gt=0)


@dataclass(frozen=True)
class ProfiledCost(AnalyticCost):
    """F, I, W timed on this machine (octopipe/cost/profiled.py); memory columns analytic."""

    source: Literal["profiled"] = setting("profiled", "analytic | file | profiled")
    device: Literal["auto", "cpu", "cuda"] = setting("auto", "auto (cuda if present, else cpu)")
    repeats: int = setting(9, "timed runs per layer", ge=1)
    statistic: Literal["median", "q25", "min"] = setting(
        "median", "statistic of the timed runs (the median tracks a shared, busy CPU)")
    warmup: int = setting(2, "untimed runs before them", ge=0)
    threads: int = setting(1, "torch intra-op threads while measuring (the runtime runs one per "
                              "rank)", ge=1)
    cache_dir: str = setting("runs/cache/profiled", "cache of measured layers; \"\" measures "
                                                    "every time")


@dataclass(frozen=True)
class FileCost:
    """A measured per-layer profile (octopipe/cost/from_file.py documents the formats)."""

    source: Literal["file"] = setting("file", "analytic | file | profiled")
    path: str | None = setting(None, "a profile .csv or .json")
    preset: str | None = setting(None, "or a shipped profile (octopipe/cost/profiles/*.json)")
    averaging: Literal["raw", "type"] = setting(
        "raw", "raw: each layer's measured time | type: mean per layer type (the OctoPipe authors' "
               "rule)")
    split: float = setting(0.5, "split backward: I = split x B, W = (1 - split) x B when only "
                                "the full backward B is measured", ge=0, le=1)
    tick_ms: float | None = setting(None, "round F and B up to this tick in ms; null: exact", gt=0)
    round_split: bool = setting(False, "round the split backward's I and W up to the tick each "
                                      "(instead of B)")

    @property
    def tp(self) -> int:
        """A profile is measured per device: no tensor parallelism on top."""
        return 1


CostConfig = AnalyticCost | FileCost | ProfiledCost
COST_SOURCES: dict[str, type] = {"analytic": AnalyticCost, "file": FileCost,
                                 "profiled": ProfiledCost}
