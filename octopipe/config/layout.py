"""`layout`: mode=layout's search over tensor, pipeline and data parallelism, micro-batching and
recomputation (octopipe/layout)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from octopipe.config.convert import check
from octopipe.config.fields import setting

Recompute = Literal["none", "selective", "full"]


@dataclass(frozen=True)
class LayoutConfig:
    """What to lay out (the model, cluster and cost come from their groups) and how hard to look."""

    global_batch: int = setting(256, "sequences per iteration (dp x micro-batch size x micro-batches)",
                                ge=1)
    gpus: int | None = setting(None, "GPUs to lay out; null: every GPU of the cluster", ge=1)
    tp: int | None = setting(None, "pin the tensor-parallel degree; null: search it", ge=1)
    pp: int | None = setting(None, "pin the pipeline-parallel degree; null: search it", ge=1)
    dp: int | None = setting(None, "pin the data-parallel degree; null: search it", ge=1)
    micro_batch_sizes: tuple[int, ...] = setting((1, 2, 4), "micro-batch sizes to try", ge=1, min_items=1)
    recompute: tuple[Recompute, ...] = setting(
        ("none", "selective", "full"), "recomputation levels a stage may use (chosen per stage "
                                       "under memory)", min_items=1)
    zero: int = setting(1, "ZeRO stage of the data-parallel optimizer (0, 1, 2)", ge=0, le=2)
    sequence_parallel: bool = setting(True, "Megatron sequence parallelism with TP")
    tp_overlap: bool = setting(False, "TP collectives overlap compute")
    dp_overlap: bool = setting(True, "each stage's gradient sync starts after its last backward "
                                     "(overlapping the cool-down) instead of after all compute")
    tp_across_nodes: bool = setting(False, "allow a TP group larger than a node (on the "
                                           "inter-node link)")
    top: int = setting(5, "layouts to report", ge=1)
    tuned: int = setting(6, "layouts the pipeline planner tunes, best-estimated first (a layout "
                            "whose lower bound cannot beat the best so far is skipped)", ge=1)
    exhaustive: bool = setting(False, "tune every feasible layout (the oracle) instead")
    tune_iters: int = setting(2, "local-search iterations of each tune() call (deterministic: "
                                 "no clock)", ge=1)
    tune_chunks: int = setting(2, "largest stages per device among each tune()'s starts", ge=1)
    tune_microbatches: int = setting(
        16, "the planner searches at most this many micro-batches; its best policy (partition, "
            "placement, order rules) is then list-scheduled at the layout's count", ge=1)

    def __post_init__(self) -> None:
        check(self, "layout.")
