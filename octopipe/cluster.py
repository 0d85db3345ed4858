"""Devices and links: which device kind holds each pipeline rank and which link joins two ranks."""
from __future__ import annotations

from dataclasses import dataclass

from octopipe.errors import ConfigError


@dataclass(frozen=True)
class DeviceKind:
    name: str
    peak_flops: float          # dense BF16 FLOP/s
    memory_bytes: float        # HBM capacity
    memory_bandwidth: float    # HBM bytes/s


@dataclass(frozen=True)
class Link:
    name: str
    bandwidth: float           # bytes/s, one direction
    latency: float             # seconds

    def transfer_time(self, nbytes: float) -> float:
        return self.latency + nbytes / self.bandwidth


@dataclass(frozen=True)
class Cluster:
    """`device_kind[r]` indexes `kinds` for rank r; `node[r]` is the node rank r sits in."""

    name: str
    kinds: tuple[DeviceKind, ...]
    device_kind: tuple[int, ...]
    node: tuple[int, ...]
    intra_link: Link
    inter_link: Link

    @property
    def n_devices(self) -> int:
        return len(self.device_kind)

    def kind_of(self, rank: int) -> DeviceKind:
        return self.kinds[self.device_kind[rank]]

    def link(self, a: int, b: int) -> Link | None:
        """The link between two ranks; None when they are the same device."""
        if a == b:
            return None
        return self.intra_link if self.node[a] == self.node[b] else self.inter_link

    def transfer_time(self, a: int, b: int, nbytes: float) -> float:
        link = self.link(a, b)
        return 0.0 if link is None else link.transfer_time(nbytes)

    def restrict(self, n: int) -> Cluster:
        """The first `n` ranks (a pipeline of n devices on this cluster)."""
        if not 1 <= n <= self.n_devices:
            raise ConfigError(f"pp={n}: cluster {self.name!r} has {self.n_devices} devices; "
                              f"choose pp between 1 and {self.n_devices} or a larger cluster")
        return Cluster(self.name, self.kinds, self.device_kind[:n], self.node[:n],
                       self.intra_link, self.inter_link)
