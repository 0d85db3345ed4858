"""The messages of a table: who produces and consumes each (stage, micro-batch, direction), the
canonical per-pair order the `ordered` transport posts them in, and the process groups of pairs
and of replicated stages."""
from __future__ import annotations

import torch
import torch.distributed as dist

from octopipe.runtime.rank_job import RankJob
from octopipe.runtime.stage import as_blocks
from octopipe.runtime.transport import BWD, FWD, Key
from octopipe.schedule.action import Action, ActionKind
from octopipe.schedule.table import ScheduleTable


def owner(table: ScheduleTable, stage: int, mb: int) -> int:
    return table.device_of(stage, mb)


def produced_message(table: ScheduleTable, a: Action) -> tuple[Key, int] | None:
    """The message action `a` sends on and the rank that holds its consumer (maybe its own)."""
    s, m = a.stage, a.microbatch
    if a.kind is ActionKind.F and s + 1 < table.n_stages:
        return Key(s + 1, m, FWD), owner(table, s + 1, m)
    if a.kind in (ActionKind.B, ActionKind.I) and s > 0:
        return Key(s - 1, m, BWD), owner(table, s - 1, m)
    return None


def pair_orders(table: ScheduleTable) -> dict[tuple[int, int], list[Key]]:
    """For each ordered pair of ranks (src, dst) that exchange messages in one iteration, the
    messages src sends to dst in the order src's row produces them: the canonical order in
    which both ends post them on the `ordered` transport."""
    compute = table.compact().compute_only()
    orders: dict[tuple[int, int], list[Key]] = {}
    for src in range(compute.n_devices):
        for a in compute.actions(src):
            msg = produced_message(compute, a)
            if msg is not None and msg[1] != src:
                orders.setdefault((src, msg[1]), []).append(msg[0])
    return orders


def pair_groups(orders: dict[tuple[int, int], list[Key]]) -> dict[tuple[int, int], object]:
    """A process group per ordered pair, created by every rank in the same sorted order (torch
    requires it), then used once by its two ranks in that same global order, so that NCCL's lazy
    communicator set-up (blocking on both ends) happens before any receive is left pending."""
    groups = {pair: dist.new_group(sorted(pair)) for pair in sorted(orders)}
    rank = dist.get_rank()
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" \
        else torch.device("cpu")
    for (src, dst), group in groups.items():
        if rank == src:
            dist.send(torch.zeros(1, device=device), dst=dst, group=group)
        elif rank == dst:
            dist.recv(torch.zeros(1, device=device), src=src, group=group)
    return groups


def replica_groups(table: ScheduleTable) -> dict[int, tuple[tuple[int, ...], object]]:
    """For each stage held by several ranks (Chimera replicas), those ranks and a process group
    over them; every rank creates every group, in stage order, as torch requires."""
    groups = {}
    for s in range(table.n_stages):
        ranks = tuple(sorted({pl[s] for pl in table.all_placements()}))
        if len(ranks) > 1:
            groups[s] = (ranks, dist.new_group(list(ranks)))
    return groups


def _message_shape(job: RankJob, key: Key) -> tuple[int, ...]:
    """Shape of the tensor travelling into `key.stage` (its input, or its output's gradient)."""
    boundary = key.stage - 1 if key.direction == FWD else key.stage
    if job.compute.kind == "emulated":
        return (max(int(job.compute.message_elems.get(boundary, 1)), 1),)
    return as_blocks(job.model).carry_shape(job.partition[boundary][1] - 1)


def expected_messages(job: RankJob, rank: int, row: tuple[Action, ...]) -> dict[Key, tuple[int, tuple[int, ...]]]:
    """The messages this rank consumes from other ranks in one iteration, with source and shape."""
    n_s = job.table.n_stages
    out = {}
    for a in row:
        s, m = a.stage, a.microbatch
        if a.kind is ActionKind.F and s > 0:
            src, key = owner(job.table, s - 1, m), Key(s, m, FWD)
        elif a.kind in (ActionKind.B, ActionKind.I) and s < n_s - 1:
            src, key = owner(job.table, s + 1, m), Key(s, m, BWD)
        else:
            continue
        if src != rank:
            out[key] = (src, _message_shape(job, key))
    return out
