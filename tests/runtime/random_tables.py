"""Random valid schedule tables: a random topological order of every action, dealt to rows.

Any order consistent with the data dependencies, cut into per-device rows, is a valid table;
with random placements (several non-adjacent stages per device, V shapes) and a random choice
of full or split backward per (stage, micro-batch), these are the irregular tables the runtime
must run without deadlock.
"""
from __future__ import annotations

import random

from octopipe.schedule.action import Action, B, F, I, W
from octopipe.schedule.table import ScheduleTable


def random_table(n_devices: int, n_stages: int, n_microbatches: int, seed: int,
                 split_prob: float = 0.5, placement: tuple[int, ...] | None = None) -> ScheduleTable:
    rng = random.Random(seed)
    if placement is None:
        placement = list(range(n_devices)) + [rng.randrange(n_devices) for _ in range(n_stages - n_devices)]
        rng.shuffle(placement)
    split = {(s, m): rng.random() < split_prob for s in range(n_stages) for m in range(n_microbatches)}
    done: set[Action] = set()
    pending: set[Action] = set()
    for s in range(n_stages):
        for m in range(n_microbatches):
            pending.add(Action(s, F, m))
            pending.update((Action(s, I, m), Action(s, W, m)) if split[(s, m)] else (Action(s, B, m),))

    def ready(a: Action) -> bool:
        s, m = a.stage, a.microbatch
        if a.kind is F:
            return s == 0 or Action(s - 1, F, m) in done
        if a.kind is W:
            return Action(s, I, m) in done
        nxt = s + 1 < n_stages and Action(s + 1, I if split[(s + 1, m)] else B, m)
        return Action(s, F, m) in done and (not nxt or nxt in done)

    rows: list[list[Action]] = [[] for _ in range(n_devices)]
    while pending:
        a = rng.choice(sorted(a for a in pending if ready(a)))
        pending.remove(a)
        done.add(a)
        rows[placement[a.stage]].append(a)
    return ScheduleTable.from_rows(rows, placement, n_microbatches, name=f"random{seed}")
