"""find_deadlock against an independent, untimed fixpoint of the documented semantics.

Random lowered tables (torch-style lowering of small named schedules, then one to three
communication cells moved to random places in their rows) are judged by both; the verdicts
and the stuck devices must agree for eager, rendezvous and batched.
"""
from __future__ import annotations

import random

import pytest

from octopipe.schedule.action import Action, ActionKind
from octopipe.schedule.generators import gpipe, interleaved, one_f_one_b, zbh1
from octopipe.schedule.lower import lower, matching
from octopipe.schedule.table import ScheduleTable
from octopipe.schedule.validate import data_predecessors
from octopipe.sim import Simulator, find_deadlock
from tests.sim.conftest import one_f_one_b_table

SENDS = (ActionKind.SEND_F, ActionKind.SEND_B)


def stuck_devices(table: ScheduleTable, sem: str) -> set[int]:
    """Devices that never finish their row, by repeated passes until nothing changes."""
    n_s = table.n_stages
    split = {(a.stage, a.microbatch) for _, a in table if a.kind is ActionKind.I}
    rows = [table.actions(d) for d in range(table.n_devices)]
    pos = [0] * len(rows)
    done: set[Action] = set()
    posted: set[Action] = set()

    def send_of(p: Action) -> Action:
        return Action(p.stage, ActionKind.SEND_F if p.kind is ActionKind.F else ActionKind.SEND_B, p.microbatch)

    def producer(send: Action) -> Action:
        if send.kind is ActionKind.SEND_F:
            return Action(send.stage, ActionKind.F, send.microbatch)
        kind = ActionKind.I if (send.stage, send.microbatch) in split else ActionKind.B
        return Action(send.stage, kind, send.microbatch)

    def arrived(send: Action) -> bool:
        return (producer(send) in done and send in posted
                and (sem == "eager" or matching(send) in posted))

    def compute_ready(a: Action, d: int) -> bool:
        for p in data_predecessors(a, n_s, split):
            if table.device_of(p.stage, p.microbatch) == d:
                if p not in done:
                    return False
            elif not (matching(send_of(p)) in posted and arrived(send_of(p))):
                return False
        return True

    progress = True
    while progress:
        progress = False
        n_posted = len(posted)
        for d, row in enumerate(rows):
            while pos[d] < len(row):
                a = row[pos[d]]
                if a.kind.is_compute:
                    if not compute_ready(a, d):
                        break
                    done.add(a)
                    pos[d] += 1
                elif sem == "batched":
                    end = pos[d]
                    while end < len(row) and row[end].kind.is_comm:
                        end += 1
                    group = row[pos[d]:end]
                    posted.update(group)
                    if not all(arrived(c if c.kind in SENDS else matching(c)) for c in group):
                        break
                    pos[d] = end
                else:
                    posted.add(a)
                    if sem == "rendezvous":
                        ok = matching(a) in posted if a.kind in SENDS else arrived(matching(a))
                        if not ok:
                            break
                    pos[d] += 1
                progress = True
        progress = progress or len(posted) > n_posted
    return {d for d, row in enumerate(rows) if pos[d] < len(row)}


def _perturb(table: ScheduleTable, rng: random.Random) -> ScheduleTable:
    rows = [list(table.actions(d)) for d in range(table.n_devices)]
    for _ in range(rng.randint(1, 3)):
        d = rng.randrange(len(rows))
        comm = [k for k, a in enumerate(rows[d]) if a.kind.is_comm]
        if not comm:
            continue
        a = rows[d].pop(rng.choice(comm))
        rows[d].insert(rng.randrange(len(rows[d]) + 1), a)
    return table.with_rows(rows)


def test_random_lowered_tables_agree_with_the_oracle():
    rng = random.Random(11)
    bases = [lower(g(p, m)) for g, p, m in ((gpipe, 2, 3), (one_f_one_b, 3, 4), (interleaved, 2, 4),
                                            (zbh1, 3, 3), (one_f_one_b, 2, 2))]
    verdicts = {"eager": [0, 0], "rendezvous": [0, 0], "batched": [0, 0]}
    for k in range(150):
        t = _perturb(bases[k % len(bases)], rng)
        for sem in verdicts:
            expect = stuck_devices(t, sem)
            dl = find_deadlock(t, sem)
            got = set() if dl is None else {w.device for w in dl.blocked}
            assert got == expect, (sem, t.as_strings())
            if dl is not None:
                assert set(dl.devices) <= expect
            verdicts[sem][dl is None] += 1
    for sem, (dead, alive) in verdicts.items():
        assert dead > 5 and alive > 5, (sem, dead, alive)


@pytest.mark.parametrize("sem", ["eager", "rendezvous", "batched"])
def test_unperturbed_torch_lowering_runs_and_eager_matches_implicit_comm(sem):
    t = one_f_one_b_table(3, 5)
    assert stuck_devices(lower(t), sem) == set()
    assert find_deadlock(lower(t), sem) is None
    if sem == "eager":
        a = Simulator(t).uniform(1.0, 2.0, transfer=0.4).run()
        b = Simulator(lower(t)).uniform(1.0, 2.0, transfer=0.4).run()
        assert b.makespan == pytest.approx(a.makespan)
