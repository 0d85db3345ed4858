"""Device kinds, links and cluster presets (`conf/cluster/*.yaml`) → Cluster values.

Figures (models-and-hardware.md §4): dense BF16 tensor-core peak, HBM capacity in decimal GB as
datasheets state them (a slightly conservative planning capacity), HBM bandwidth. NVLink
bandwidth is the vendor's bidirectional total halved (one direction); latency 3 µs is the NCCL
intra-node send/recv figure on H100. InfiniBand NDR: 46 GB/s per direction per GPU NIC (the
achieved figure an NCCL maintainer quotes for 400 Gb/s), latency 8 µs (within the 5-10 µs
planning range; UNCONFIRMED for NDR specifically).

A preset lists its nodes by device kind:

    name: hetero_a100_h100
    gpus_per_node: 8
    nodes: [H100-SXM, A100-80GB]     # or `nodes: 4` with `device: H100-SXM`
    layout: spread                   # packed | spread

A pipeline rank is a group of `tp` GPUs of one node (tensor parallelism inside the rank); the
per-rank figures stay per GPU, and the cost model divides work and bytes by `tp`. `packed` fills
a node before the next; `spread` places the pipeline's ranks on the nodes in contiguous blocks
(tensor/data parallelism fill the rest of each node, the usual Megatron layout), so pipeline
boundaries cross nodes.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from octopipe.cluster import Cluster, DeviceKind, Link
from octopipe.config.cluster import ClusterConfig
from octopipe.config.convert import convert
from octopipe.errors import ConfigError

GB = 1e9
TFLOPS = 1e12

DEVICE_KINDS: dict[str, DeviceKind] = {
    "A100-80GB": DeviceKind("A100-80GB", 312 * TFLOPS, 80 * GB, 2039 * GB),
    "H100-SXM": DeviceKind("H100-SXM", 989.4 * TFLOPS, 80 * GB, 3350 * GB),
    "H200": DeviceKind("H200", 989 * TFLOPS, 141 * GB, 4800 * GB),
    "B200": DeviceKind("B200", 2250 * TFLOPS, 180 * GB, 8000 * GB),
}

NVLINK: dict[str, Link] = {
    "A100-80GB": Link("nvlink3", 300 * GB, 3e-6),
    "H100-SXM": Link("nvlink4", 450 * GB, 3e-6),
    "H200": Link("nvlink4", 450 * GB, 3e-6),
    "B200": Link("nvlink5", 900 * GB, 3e-6),
}

LINKS: dict[str, Link] = {
    "nvlink3": NVLINK["A100-80GB"],
    "nvlink4": NVLINK["H100-SXM"],
    "nvlink5": NVLINK["B200"],
    "ib_ndr": Link("ib_ndr", 46 * GB, 8e-6),
    "ib_hdr": Link("ib_hdr", 23 * GB, 8e-6),
}



def device_kind(name: str, field: str = "cluster.device") -> DeviceKind:
    if name not in DEVICE_KINDS:
        raise ConfigError(f"{field}={name!r}: unknown device kind; valid: {', '.join(DEVICE_KINDS)}")
    return DEVICE_KINDS[name]


def _link(value: Any, field: str) -> Link:
    if isinstance(value, str):
        if value not in LINKS:
            raise ConfigError(f"{field}={value!r}: unknown link; valid: {', '.join(LINKS)}, or a "
                              f"mapping with name, bandwidth (bytes/s) and latency (s)")
        return LINKS[value]
    if isinstance(value, Mapping):
        try:
            link = Link(str(value.get("name", field)), float(value["bandwidth"]), float(value["latency"]))
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError(f"{field}: needs bandwidth (bytes/s) and latency (s) numbers") from e
        if link.bandwidth <= 0 or link.latency < 0:
            raise ConfigError(f"{field}: bandwidth must be positive and latency not negative")
        return link
    raise ConfigError(f"{field}: give a link name ({', '.join(LINKS)}) or a mapping")


def cluster_from_config(cfg: ClusterConfig, pp: int | None = None, tp: int = 1) -> Cluster:
    """The cluster a preset describes, as `pp` pipeline ranks of `tp` GPUs (all ranks if None).
    A mapping is converted first, for callers that still hold a preset's raw mapping."""
    c = convert(ClusterConfig, cfg, "cluster.")
    name, gpn = c.name, c.gpus_per_node
    if isinstance(c.nodes, int):
        node_kinds = [c.device] * c.nodes
    elif c.nodes:
        node_kinds = list(c.nodes)
    else:
        raise ConfigError("cluster.nodes: give a node count (with cluster.device) or a list of "
                          "device kinds, one per node")
    kinds: list[DeviceKind] = []
    for i, k in enumerate(node_kinds):
        dk = device_kind(k, f"cluster.nodes[{i}]")
        if dk not in kinds:
            kinds.append(dk)
    if not isinstance(tp, int) or tp <= 0 or gpn % tp:
        raise ConfigError(f"cost.tp={tp}: the tensor-parallel degree must divide "
                          f"cluster.gpus_per_node={gpn}")
    per_node = gpn // tp
    capacity = per_node * len(node_kinds)
    n = capacity if pp is None else pp
    if not isinstance(n, int) or n < 1 or n > capacity:
        raise ConfigError(f"pp={n}: cluster {name!r} holds {capacity} pipeline ranks of tp={tp} "
                          f"GPU(s) ({len(node_kinds)} node(s) x {gpn} GPUs); choose pp between 1 "
                          f"and {capacity}, a smaller tp, or a larger cluster")
    if c.layout == "packed":
        node = [r // per_node for r in range(n)]
    else:
        node = [r * len(node_kinds) // n for r in range(n)]
    device = tuple(kinds.index(DEVICE_KINDS[node_kinds[j]]) for j in node)
    slowest = min((DEVICE_KINDS[k] for k in set(node_kinds)), key=lambda d: NVLINK[d.name].bandwidth)
    intra = _link(c.intra_link, "cluster.intra_link") if c.intra_link else NVLINK[slowest.name]
    inter = _link(c.inter_link, "cluster.inter_link")
    return Cluster(name, tuple(kinds), device, tuple(node), intra, inter)
