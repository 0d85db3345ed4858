"""`cluster`: a cluster preset (conf/cluster/*.yaml), turned into a Cluster by
octopipe.cluster_presets."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from octopipe.config.fields import setting


@dataclass(frozen=True)
class ClusterConfig:
    """Nodes of GPUs and the links between them."""

    name: str = setting("cluster", "the preset's name")
    gpus_per_node: int = setting(8, "GPUs in each node", ge=1)
    nodes: int | tuple[str, ...] = setting(
        1, "a node count (all of kind `device`) or a list of device kinds, one per node", ge=1)
    device: str = setting("H100-SXM", "device kind of every node when `nodes` is a count "
                                      "(octopipe.cluster_presets.DEVICE_KINDS)")
    layout: Literal["packed", "spread"] = setting(
        "packed", "packed: fill a node before the next | spread: the pipeline's ranks in "
                  "contiguous blocks over all nodes")
    intra_link: str | dict[str, Any] | None = setting(
        None, "link inside a node: a name (nvlink3, nvlink4, nvlink5, ib_ndr, ib_hdr) or "
              "{name, bandwidth (bytes/s), latency (s)}; null: the slowest node's NVLink")
    inter_link: str | dict[str, Any] = setting("ib_ndr", "link across nodes (as intra_link)")
