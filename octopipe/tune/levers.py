"""Which levers the tuner may pull (`tuner.levers`), and the values the others keep.

A lever left out stays at S-1F1B's value (the paper-style default configuration): partition:
uniform stages; placement: one stage per device, in order; schedule: the 1F1B policy (full
backward, one micro-batch in flight per stage left) and no row moves; split_layers: whole
layers. `Levers.project` maps any candidate onto the levers: the frozen parts come from the
reference, and a candidate whose stage count the frozen parts cannot hold is dropped.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from octopipe.config.tuner import LEVERS
from octopipe.plan import Partition
from octopipe.tune.candidate import Candidate

POLICY_FIELDS = ("split_backward", "inflight", "kind_rank", "f_tiebreak", "b_tiebreak", "w_pressure",
                 "warmup")


def reference(n_layers: int, n_devices: int) -> Candidate:
    """S-1F1B as a candidate: uniform stages, one per device, the 1F1B policy."""
    return Candidate(Partition.uniform(n_layers, n_devices), tuple(range(n_devices)), False, 1.0,
                     origin="S-1F1B")


@dataclass(frozen=True)
class Levers:
    """The levers on, and the reference candidate the others are frozen at."""

    on: frozenset[str]
    ref: Candidate

    @classmethod
    def of(cls, names: Iterable[str], ref: Candidate) -> Levers:
        return cls(frozenset(names), ref)

    @property
    def all(self) -> bool:
        return self.on >= set(LEVERS)

    def has(self, lever: str) -> bool:
        return lever in self.on

    def project(self, c: Candidate) -> Candidate | None:
        """`c` with the levers that are off set to the reference's (None if it cannot be)."""
        if self.all:
            return c
        kw: dict = {}
        if not self.has("partition"):
            kw["partition"] = self.ref.partition
        if not self.has("placement"):
            kw["placement"] = self.ref.placement
        if len(kw.get("partition", c.partition)) != len(kw.get("placement", c.placement)):
            return None
        if not self.has("schedule"):
            kw.update({f: getattr(self.ref, f) for f in POLICY_FIELDS})
        return replace(c, **kw) if kw else c

    def conforms(self, c: Candidate) -> bool:
        """Whether `c` already keeps every lever that is off at the reference's value."""
        return self.project(c) == c

    def label(self) -> str:
        return "+".join(x for x in LEVERS if x in self.on)
