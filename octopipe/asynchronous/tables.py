"""Asynchronous schedules as tables: the action order and, for each action, the weight version
it reads.

A stream of M micro-batches runs in PipeDream's 1F1B order with no flush inside it (the table
of `generators.pipedream` over the whole stream); the rule says when a stage updates its block
and which version a forward reads:

- ``pd``: PipeDream with weight stashing: every B updates its stage; an F reads the current
  version, its B the version stashed by that F;
- ``vsync``: PipeDream with vertical sync: micro-batch k reads, at every stage, the version
  stage 0 read (its tag), so later stages keep older versions stashed;
- ``2bw``: PipeDream-2BW (Narayanan et al. ICML'21): gradients accumulate over a window of W
  micro-batches and each stage updates once per window, at the window's last B; window b reads
  version max(0, b-1) (the one-stale update w_{t+1} = w_t - lr·grad(w_{t-1})), so two buffers.

A version is the number of updates a stage has applied. The unit-tick alignment (each F or B
one tick, every stage at most one action per tick, an action after its producers' ticks) gives
the time order of all stages' updates, which `staleness` counts delays in.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

from octopipe.errors import ConfigError, ScheduleError
from octopipe.schedule.action import Action, B, F, I, W
from octopipe.schedule.generators._common import align_lockstep
from octopipe.schedule.generators.pipedream import pipedream
from octopipe.schedule.table import ScheduleTable


class Rule(str, Enum):
    """When a stage updates and which version a forward reads."""

    PD = "pd"
    VSYNC = "vsync"
    TWO_BW = "2bw"


# schedule=<name> of the registry → the rule its table runs under
ASYNC_SCHEDULES: dict[str, Rule] = {"pipedream": Rule.PD, "pipedream_vsync": Rule.VSYNC,
                                    "pipedream_2bw": Rule.TWO_BW}


@dataclass(frozen=True)
class Event:
    """One compute action at its unit tick, with the version it reads and whether an update of
    its stage follows it (`update`: the index of that update in the stage's sequence, else -1)."""

    tick: int
    action: Action
    version: int
    update: int


@dataclass(frozen=True)
class AsyncSchedule:
    """A stream table under an update rule: every action's read version, in tick order."""

    table: ScheduleTable
    rule: Rule
    window: int
    events: tuple[Event, ...]

    @property
    def n_stages(self) -> int:
        return self.table.n_stages

    @property
    def n_microbatches(self) -> int:
        return self.table.n_microbatches

    @property
    def n_ticks(self) -> int:
        return max(len(r) for r in self.table.rows)

    def reads(self) -> dict[Action, int]:
        """Version every compute action reads (F: the one it uses, B/I/W: the stashed one)."""
        return {e.action: e.version for e in self.events}

    def versions_held(self) -> tuple[int, ...]:
        """Per stage, the most distinct versions alive at once: the current one and every
        version an in-flight micro-batch (F done, backward not done) still needs."""
        return tuple(_held(self.events, s) for s in range(self.n_stages))

    def stash_bytes(self, param_bytes: Sequence[float]) -> tuple[float, ...]:
        """Per stage, bytes of the stashed copies beyond the one the model holds anyway:
        (versions held - 1) × the stage's parameter bytes."""
        if len(param_bytes) != self.n_stages:
            raise ScheduleError(f"stash_bytes needs {self.n_stages} stage sizes, got {len(param_bytes)}")
        return tuple((h - 1) * float(b) for h, b in zip(self.versions_held(), param_bytes))

    def updates_per_stage(self) -> tuple[int, ...]:
        n = [0] * self.n_stages
        for e in self.events:
            if e.update >= 0:
                n[e.action.stage] += 1
        return tuple(n)


def refuse_flushing(name: str | None, mode: str) -> None:
    """Raise ConfigError when a mode that flushes every iteration is asked for an asynchronous
    schedule (it would run the stream as one synchronous window)."""
    if name in ASYNC_SCHEDULES:
        raise ConfigError(f"schedule={name}: {mode} flushes every iteration (one synchronous "
                          f"gradient step), so it cannot run {name}'s asynchronous updates; train it "
                          f"with mode=train schedule={name} (one stream, weight stashing, no flush), or "
                          f"study it with mode=simulate or experiment=pipedream")


def tick_rows(table: ScheduleTable) -> list[list[Action | None]]:
    """The table time-aligned at unit costs (idle cells where an action waits for a producer)."""
    if any(a is None for r in table.rows for a in r):
        return [list(r) for r in table.rows]
    return align_lockstep(table.rows, table.n_stages)


def check_stream(name: str, n_stages: int, n_microbatches: int, window: int = 1) -> None:
    """The shapes an asynchronous stream runs: S >= 1 stages, M >= S micro-batches (a steady
    state exists), and for 2BW a window W >= S that divides M."""
    if not isinstance(n_stages, int) or n_stages < 1:
        raise ScheduleError(f"{name}: pp (stages) must be a positive integer, got {n_stages!r}")
    if not isinstance(n_microbatches, int) or n_microbatches < n_stages:
        raise ScheduleError(f"{name}: microbatches must be at least pp={n_stages} (the stream "
                            f"reaches its steady state), got {n_microbatches!r}")
    if name == "pipedream_2bw" or window != 1:
        if not isinstance(window, int) or window < n_stages:
            raise ScheduleError(f"{name}: window must be at least pp={n_stages} (2BW keeps two "
                                f"buffers only when W >= S), got window={window!r}")
        if n_microbatches % window:
            raise ScheduleError(f"{name}: window={window} does not divide the stream of "
                                f"microbatches={n_microbatches}")


def async_schedule(rule: Rule | str, n_stages: int, n_microbatches: int,
                   window: int | None = None) -> AsyncSchedule:
    """The stream of `n_microbatches` on `n_stages` stages (one per device) under `rule`;
    `window` is 2BW's accumulation window (default: the stage count, its smallest)."""
    rule = Rule(rule)
    w = (n_stages if window is None else window) if rule is Rule.TWO_BW else 1
    name = {v: k for k, v in ASYNC_SCHEDULES.items()}[rule]
    check_stream(name, n_stages, n_microbatches, w)
    base = pipedream(n_stages, n_microbatches)
    rows = tick_rows(base)
    table = ScheduleTable(tuple(tuple(r) for r in rows), base.placement, n_microbatches, name)
    return AsyncSchedule(table, rule, w, tuple(_events(rows, rule, w, n_microbatches)))


def localsgd_rows(n_stages: int, n_microbatches: int, replicas: int,
                  local_steps: int) -> list[list[Action | None]]:
    """LocalSGD-1F1B at unit ticks (Ilin & Richtárik): micro-batch k belongs to replica
    k mod R; a round is R·H micro-batches (H local steps per replica); F(s, k) waits for
    B(s, k-R) (the replica's previous local step at that stage) and, in a new round, for stage
    0's last backward of the previous round (the averaging barrier); 1F1B picking otherwise
    (a ready B first until the steady state, then alternate)."""
    check_stream("localsgd", n_stages, n_microbatches)
    if replicas < 1 or local_steps < 1:
        raise ScheduleError(f"localsgd: replicas and local_steps must be >= 1, got {replicas}, {local_steps}")
    S, M, R = n_stages, n_microbatches, replicas
    rnd = R * local_steps
    f_done = [[-1] * M for _ in range(S)]
    b_done = [[-1] * M for _ in range(S)]
    steady, prefer_b = [False] * S, [False] * S
    nf, nb = [0] * S, [0] * S
    rows: list[list[Action | None]] = [[] for _ in range(S)]
    t = 0
    while b_done[0][M - 1] == -1:
        ops: list[Action | None] = [None] * S
        for s in range(S):
            rf = rb = None
            k = nf[s]
            if k < M:
                ok = k % rnd < R or -1 < b_done[s][k - R] < t
                ok = ok and (k < rnd or -1 < b_done[0][(k // rnd) * rnd - 1] < t)
                if ok and (s == 0 or -1 < f_done[s - 1][k] < t):
                    rf = k
            k = nb[s]
            if k < M and -1 < f_done[s][k] < t and (s == S - 1 or -1 < b_done[s + 1][k] < t):
                rb = k
            if rb is not None and (not steady[s] or prefer_b[s] or rf is None):
                ops[s], steady[s], prefer_b[s] = Action(s, B, rb), True, False
            elif rf is not None:
                ops[s] = Action(s, F, rf)
                prefer_b[s] = steady[s]
        for s, a in enumerate(ops):
            if a is not None:
                (f_done if a.kind is F else b_done)[s][a.microbatch] = t
                if a.kind is F:
                    nf[s] += 1
                else:
                    nb[s] += 1
            rows[s].append(a)
        t += 1
    return rows


def schedule_versions(table: ScheduleTable, rule: Rule | str = Rule.PD, window: int = 1) -> AsyncSchedule:
    """The read versions of any one-stage-per-device table of full (B) or split (I, W)
    backwards under `rule` (the update follows B, or W when the backward is split)."""
    rule = Rule(rule)
    rows = tick_rows(table)
    return AsyncSchedule(table.with_rows(rows), rule, window,
                         tuple(_events(rows, rule, window, table.n_microbatches)))


def _events(rows: Sequence[Sequence[Action | None]], rule: Rule, window: int,
            n_microbatches: int) -> list[Event]:
    """Walk the ticks, stages in order within a tick, tracking versions and stashes."""
    n_stages = len(rows)
    applied = [0] * n_stages           # updates applied per stage
    pending = [0] * n_stages           # B's accumulated toward the stage's next 2BW update
    tag: dict[int, int] = {}           # vsync: version stage 0 read for micro-batch k
    stash: dict[tuple[int, int], int] = {}
    split = {(a.stage, a.microbatch) for r in rows for a in r if a is not None and a.kind is I}
    out: list[Event] = []
    for t in range(max(len(r) for r in rows)):
        for s in range(n_stages):
            a = rows[s][t] if t < len(rows[s]) else None
            if a is None:
                continue
            key = (a.stage, a.microbatch)
            if a.kind is F:
                v = _forward_version(rule, a, applied[a.stage], tag, window)
                if v > applied[a.stage]:
                    raise ScheduleError(f"{a} reads version {v} of stage {a.stage} before it "
                                        f"exists ({applied[a.stage]} updates applied)")
                if a.stage == 0:
                    tag[a.microbatch] = v
                stash[key] = v
                out.append(Event(t, a, v, -1))
                continue
            v = stash[key]
            ends = a.kind is W or (a.kind is B and key not in split)
            upd = -1
            if ends:
                pending[a.stage] += 1
                if rule is not Rule.TWO_BW or pending[a.stage] == window:
                    upd = applied[a.stage]
                    applied[a.stage] += 1
                    pending[a.stage] = 0
            out.append(Event(t, a, v, upd))
    return out


def _forward_version(rule: Rule, a: Action, current: int, tag: Mapping[int, int], window: int) -> int:
    if rule is Rule.PD:
        return current
    if rule is Rule.VSYNC:
        return current if a.stage == 0 else tag[a.microbatch]
    return max(0, a.microbatch // window - 1)


def _held(events: Sequence[Event], stage: int) -> int:
    """Most distinct versions stage `stage` holds at once (walking its events in tick order)."""
    current, live, best = 0, {}, 1
    for e in events:
        if e.action.stage != stage:
            continue
        key = e.action.microbatch
        if e.action.kind is F:
            live[key] = e.version
        elif e.action.kind in (B, W):
            live.pop(key, None)
            current += e.update >= 0
        best = max(best, len({current, *live.values()}))
    return best


__all__ = ["ASYNC_SCHEDULES", "AsyncSchedule", "Event", "Rule", "async_schedule", "check_stream",
           "localsgd_rows", "refuse_flushing",
           "schedule_versions", "tick_rows"]
