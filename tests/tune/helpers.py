"""Small clusters and cost tables for the tuner's tests."""
from octopipe.cluster import Cluster, DeviceKind, Link


def free_cluster(n: int, memory_bytes: float = 1e18, latency: float = 0.0,
                 bandwidth: float = 1e30) -> Cluster:
    """`n` identical devices in one node; links free unless told otherwise."""
    dk = DeviceKind("dev", 1e15, memory_bytes, 3e12)
    link = Link("link", bandwidth, latency)
    return Cluster("test", (dk,), (0,) * n, (0,) * n, link, link)
