"""ScheduleTable: a row of actions per device, with an explicit stage → device placement."""
from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from octopipe.errors import ScheduleError
from octopipe.schedule.action import Action, ActionKind

Row = tuple["Action | None", ...]


@dataclass(frozen=True)
class ScheduleTable:
    """Per device, an ordered tuple of actions; `None` is an idle cell in a time-aligned table.

    `placement[s]` is the device that holds stage `s`; any map is allowed (several stages per
    device, non-adjacent, uneven counts).
    """

    rows: tuple[Row, ...]
    placement: tuple[int, ...]
    n_microbatches: int
    name: str = "custom"
    replicas: tuple[tuple[int, ...], ...] = ()
    mb_replica: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "rows", tuple(tuple(r) for r in self.rows))
        object.__setattr__(self, "placement", tuple(int(d) for d in self.placement))
        object.__setattr__(self, "replicas", tuple(tuple(int(d) for d in r) for r in self.replicas))
        object.__setattr__(self, "mb_replica", tuple(int(r) for r in self.mb_replica))
        for pl in (self.placement, *self.replicas):
            if any(d < 0 or d >= len(self.rows) for d in pl):
                raise ScheduleError(f"placement {pl} names a device outside 0..{len(self.rows) - 1}")
            if len(pl) != len(self.placement):
                raise ScheduleError(f"replica placement {pl} has {len(pl)} stages, expected "
                                    f"{len(self.placement)}")
        if self.mb_replica:
            if len(self.mb_replica) != self.n_microbatches:
                raise ScheduleError(f"mb_replica has {len(self.mb_replica)} entries for "
                                    f"{self.n_microbatches} micro-batches")
            if any(not 0 <= r <= len(self.replicas) for r in self.mb_replica):
                raise ScheduleError(f"mb_replica {self.mb_replica} names a replica outside "
                                    f"0..{len(self.replicas)}")

    def device_of(self, stage: int, microbatch: int) -> int:
        """The device that runs `stage` for `microbatch` (differs per replica, e.g. Chimera)."""
        if self.mb_replica and self.mb_replica[microbatch]:
            return self.replicas[self.mb_replica[microbatch] - 1][stage]
        return self.placement[stage]

    def all_placements(self) -> tuple[tuple[int, ...], ...]:
        return (self.placement, *self.replicas)

    @classmethod
    def from_rows(cls, rows: Mapping[int, Sequence[Action | None]] | Sequence[Sequence[Action | None]],
                  placement: Sequence[int], n_microbatches: int, name: str = "custom") -> ScheduleTable:
        if isinstance(rows, Mapping):
            rows = [rows[d] for d in range(len(rows))]
        return cls(tuple(tuple(r) for r in rows), tuple(placement), n_microbatches, name)

    @classmethod
    def from_strings(cls, rows: Sequence[Sequence[str]], placement: Sequence[int],
                     n_microbatches: int, name: str = "custom") -> ScheduleTable:
        """Build from strings such as `[["0F0", "", "0B0"], ...]`; empty strings are idle."""
        parsed = [[Action.parse(c) if c and c.strip() else None for c in r] for r in rows]
        return cls.from_rows(parsed, placement, n_microbatches, name)

    @property
    def n_devices(self) -> int:
        return len(self.rows)

    @property
    def n_stages(self) -> int:
        return len(self.placement)

    def stages_of(self, device: int) -> tuple[int, ...]:
        """Stages of the primary placement on `device` (see `replica_stages_of` for Chimera)."""
        return tuple(s for s, d in enumerate(self.placement) if d == device)

    def replica_stages_of(self, device: int) -> tuple[tuple[int, int], ...]:
        """(replica, stage) pairs held by `device` across all placements."""
        return tuple((r, s) for r, pl in enumerate(self.all_placements())
                     for s, d in enumerate(pl) if d == device)

    def compact(self) -> ScheduleTable:
        """The same table with idle cells dropped (torch's compute_comms form has none)."""
        rows = tuple(tuple(a for a in r if a is not None) for r in self.rows)
        return ScheduleTable(rows, self.placement, self.n_microbatches, self.name, self.replicas, self.mb_replica)

    def actions(self, device: int) -> tuple[Action, ...]:
        return tuple(a for a in self.rows[device] if a is not None)

    def __iter__(self) -> Iterator[tuple[int, Action]]:
        for d, row in enumerate(self.rows):
            for a in row:
                if a is not None:
                    yield d, a

    @property
    def is_lowered(self) -> bool:
        return any(a.kind.is_comm for _, a in self)

    @property
    def splits_backward(self) -> bool:
        return any(a.kind is ActionKind.I for _, a in self)

    def compute_only(self) -> ScheduleTable:
        """Drop SEND/RECV cells, keeping the compute order (the inverse of lowering)."""
        rows = tuple(tuple(a for a in r if a is None or a.kind.is_compute) for r in self.rows)
        return ScheduleTable(rows, self.placement, self.n_microbatches, self.name, self.replicas, self.mb_replica)

    def with_rows(self, rows: Sequence[Sequence[Action | None]]) -> ScheduleTable:
        return ScheduleTable(tuple(tuple(r) for r in rows), self.placement, self.n_microbatches, self.name,
                             self.replicas, self.mb_replica)

    def as_strings(self) -> list[list[str]]:
        return [["" if a is None else str(a) for a in r] for r in self.rows]


def loop_placement(n_devices: int, chunks: int) -> tuple[int, ...]:
    """Stage s on device s mod p (Megatron's interleaved / torch's "loop" style)."""
    return tuple(s % n_devices for s in range(n_devices * chunks))


def v_placement(n_devices: int, chunks: int = 2) -> tuple[int, ...]:
    """V (zig-zag) style: stages go down the devices then back up, `chunks` times."""
    out: list[int] = []
    for c in range(chunks):
        out.extend(range(n_devices) if c % 2 == 0 else reversed(range(n_devices)))
    return tuple(out)
