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

import numpy as np

from octopipe.config.tuner import LEVERS
from octopipe.plan import Partition, Plan
from octopipe.schedule.library import build_schedule
from octopipe.schedule.table import ScheduleTable
from octopipe.tune.candidate import Candidate, Problem

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
    schedule: str = "1f1b"      # the named schedule a plan's table follows when the schedule is no lever

    @classmethod
    def of(cls, names: Iterable[str], ref: Candidate, schedule: str = "1f1b") -> Levers:
        return cls(frozenset(names), ref, schedule)

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

    def admits(self, problem: Problem, c: Candidate) -> bool:
        """Whether `c` fits memory as S-1F1B runs it when the schedule lever is off: stage s of D
        keeps min(D - s, M) micro-batches' activations (the 1F1B order the plan will have, not
        the list scheduler's, which may hold forwards back under memory pressure)."""
        if self.has("schedule") or c.n_stages != problem.n_devices:
            return True
        arr = problem.arrays(c)
        D, M = problem.n_devices, problem.n_microbatches
        held = np.zeros(D)
        for s in range(c.n_stages):
            held[arr.dev[s]] += min(D - s, M) * arr.act[s]
        return bool((held <= arr.cap * (1 + 1e-9)).all())

    def frozen_table(self, plan: Plan) -> Plan:
        """`plan` with S-1F1B's own table when the schedule lever is off: the library's 1F1B order
        on the plan's stages and devices (the list scheduler, held to the 1F1B policy, may
        still reorder under memory pressure). Another `schedule` (a stack that runs only its own,
        e.g. interleaved 1F1B) gives that schedule's table where the plan has its placement.
        Unchanged when the schedule is a lever or the plan is not one stage per device."""
        t = plan.table
        if self.has("schedule"):
            return plan
        if self.schedule != "1f1b":
            base = build_schedule(self.schedule, t.n_devices, t.n_microbatches, t.n_stages // t.n_devices)
            if tuple(base.placement) != tuple(t.placement):
                return plan
            return replace(plan, table=ScheduleTable(base.rows, t.placement, t.n_microbatches, t.name))
        if t.n_stages != t.n_devices or sorted(t.placement) != list(range(t.n_devices)):
            return plan
        base = build_schedule("1f1b", t.n_devices, t.n_microbatches)
        rows = [()] * t.n_devices
        for stage, device in enumerate(t.placement):
            rows[device] = base.rows[stage]
        return replace(plan, table=ScheduleTable(tuple(rows), t.placement, t.n_microbatches, t.name))

    def label(self) -> str:
        return "+".join(x for x in LEVERS if x in self.on)
