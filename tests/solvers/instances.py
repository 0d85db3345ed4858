"""Random partitioning instances for the solver tests (costs, clusters) built without presets."""
from __future__ import annotations

import numpy as np

from octopipe.cluster import Cluster, DeviceKind, Link
from octopipe.cost.table import CostTable

GB = 1e9


def random_costs(rng: np.random.Generator, n_layers: int, kinds: tuple[str, ...] = ("a100", "h100"),
                 act: float = 2e8, static: float = 3e8) -> CostTable:
    """Layers of uneven cost; each device kind is a random constant factor faster or slower."""
    base = rng.uniform(0.2, 2.0, n_layers) * 1e-3
    speed = np.concatenate([[1.0], rng.uniform(0.4, 1.0, len(kinds) - 1)])
    f = base[:, None] * speed[None, :]
    return CostTable(tuple(f"layer{j}" for j in range(n_layers)), kinds, f, 1.2 * f, 0.8 * f,
                     rng.uniform(0.5, 1.5, n_layers) * act, rng.uniform(0.2, 2.0, n_layers) * static,
                     rng.uniform(1e6, 6e7, n_layers), np.zeros(n_layers))


def make_cluster(n_devices: int, hetero: bool = True, nodes: int = 2,
                 memory: tuple[float, float] = (40 * GB, 80 * GB)) -> Cluster:
    kinds = (DeviceKind("a100", 312e12, memory[0], 2.0e12), DeviceKind("h100", 989e12, memory[1], 3.35e12))
    device_kind = tuple((d % 2) if hetero else 1 for d in range(n_devices))
    node = tuple(d * nodes // n_devices for d in range(n_devices))
    return Cluster("test", kinds, device_kind, node, Link("nvlink", 4e11, 3e-6),
                   Link("ib", 2.5e10, 1e-5))
