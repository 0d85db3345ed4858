"""Where a layout's ranks sit: Megatron's order (tp fastest, then dp, then pp) over the GPUs of
a cluster, node by node. Pipeline rank r holds the block of tp·dp consecutive GPUs from
r·tp·dp; its device kind is the slowest in that block (a replica runs at its slowest GPU's
pace), and pipeline transfers cross nodes when consecutive blocks do. A DP group (the replicas
of one tp rank of one stage) runs on NVLink inside a node and on the inter-node link otherwise;
a TP group larger than a node (layout.tp_across_nodes) runs on the inter-node link.
"""
from __future__ import annotations

from dataclasses import dataclass

from octopipe.cluster import Cluster, Link
from octopipe.cluster_presets import cluster_from_config
from octopipe.config.cluster import ClusterConfig
from octopipe.config.convert import convert
from octopipe.cost.collectives import group_link
from octopipe.errors import ConfigError
from octopipe.layout.space import Layout


@dataclass(frozen=True)
class Grid:
    """The GPUs of a cluster (one rank per GPU) and the node size."""

    gpus: Cluster
    gpus_per_node: int

    @classmethod
    def of(cls, cfg: ClusterConfig, n_gpus: int | None = None) -> Grid:
        """The first `n_gpus` GPUs (all when None) of a cluster preset."""
        c = convert(ClusterConfig, cfg, "cluster.")
        full = cluster_from_config(c, pp=None, tp=1)
        n = full.n_devices if n_gpus is None else n_gpus
        if not 1 <= n <= full.n_devices:
            raise ConfigError(f"layout.gpus={n_gpus}: cluster {c.name!r} has {full.n_devices} GPUs; "
                              f"choose 1 to {full.n_devices} or a larger cluster")
        return cls(Cluster(full.name, full.kinds, full.device_kind[:n],
                           tuple(r // c.gpus_per_node for r in range(n)), full.intra_link,
                           full.inter_link), c.gpus_per_node)

    @property
    def n_gpus(self) -> int:
        return self.gpus.n_devices

    def block(self, layout: Layout, rank: int) -> range:
        """GPUs of pipeline rank `rank`."""
        size = layout.tp * layout.dp
        return range(rank * size, (rank + 1) * size)

    def pipeline(self, layout: Layout) -> Cluster:
        """The layout's pipeline as a Cluster of pp ranks (figures per GPU of a rank)."""
        g = self.gpus
        kinds, node = [], []
        for r in range(layout.pp):
            blk = self.block(layout, r)
            kinds.append(min((g.device_kind[i] for i in blk), key=lambda k: g.kinds[k].peak_flops))
            node.append(g.node[blk[0]])
        used = sorted(set(kinds))
        return Cluster(f"{g.name}:{layout.label()}", tuple(g.kinds[k] for k in used),
                       tuple(used.index(k) for k in kinds), tuple(node), g.intra_link, g.inter_link)

    def dp_link(self, layout: Layout, rank: int) -> Link | None:
        """The link of pipeline rank `rank`'s DP groups (None when dp = 1)."""
        start = self.block(layout, rank).start
        return group_link(self.gpus, [start + k * layout.tp for k in range(layout.dp)])
