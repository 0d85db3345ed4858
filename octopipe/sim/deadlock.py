"""Deadlocks of fixed-order execution: what blocks under each communication semantics.

Each device walks its row of cells (compute, SEND, RECV; compute-only tables get a RECV right
before each compute that consumes data from another device and a SEND right after each compute
that feeds one). A cell is *passed* under these rules:

- compute c: once every same-device data predecessor has ended and, when c consumes transfer t
  from another device, the RECV of t has been passed and t has arrived. The device runs c, then
  looks at the next cell when c ends.
- eager (buffered, asynchronous; torch's `_PipelineScheduleRuntime`): SEND(t) and RECV(t) post
  t and are passed at once (isend / irecv); only the consuming compute waits for the data.
- rendezvous (blocking, MPI Ssend/Recv style): SEND(t) blocks its device until RECV(t) has been
  posted (the receiver's walk reached it); RECV(t) blocks its device until t has arrived.
- batched (NCCL groups, Megatron's p2p_communication): a maximal run of consecutive SEND/RECV
  cells in a row is one group; reaching it posts every cell of the group, and the device is
  blocked until every transfer of the group (sent or received) has arrived.

A transfer is issued once its producer has ended and its SEND is posted, and under rendezvous
and batched also its RECV; it then holds its link direction (first come, first served) for
`latency + bytes / bandwidth` and arrives. A *deadlock* is a state where some device has not
passed its whole row and no compute or transfer is in progress. Every condition above only ever
turns from false to true and links always drain, so whether a table deadlocks does not depend on
durations: `find_deadlock` decides it with unit durations.

In a deadlock each stuck device waits at its current cell for exactly one other device (or
itself, when the cell needs a cell later in its own row); following these waits from any stuck
device ends in a cycle, which is what `Deadlock.cycle` reports.

`ready_first` uses eager messages and can only stall through its in-flight or memory limit:
every device with work left holds back a ready F and has nothing else ready.
"""
from __future__ import annotations

from dataclasses import dataclass

from octopipe.errors import DeadlockError
from octopipe.schedule.action import Action, ActionKind
from octopipe.schedule.text_grid import format_grid
from octopipe.sim.engine import BATCHED, EAGER, StuckState
from octopipe.sim.program import CELL_COMPUTE, CELL_SEND, FWD, Program


@dataclass(frozen=True)
class Wait:
    """Device `device` is stuck at `cell` (table column `column`) waiting for `on_device`."""

    device: int
    column: int
    cell: str
    waits_for: str
    on_device: int


@dataclass(frozen=True)
class Deadlock:
    """The stuck devices and the cycle of waits among them (see the module docstring)."""

    semantics: str
    policy: str
    cycle: tuple[Wait, ...]
    blocked: tuple[Wait, ...]

    @property
    def devices(self) -> tuple[int, ...]:
        return tuple(w.device for w in self.cycle)

    def describe(self, program: Program) -> str:
        if self.policy == "ready_first":
            lines = [f"deadlock under ready_first: every device with work left holds back a forward at "
                     f"its limit ({', '.join(f'device {w.device}: {w.cell}' for w in self.cycle)}); raise "
                     "sim.max_inflight or the memory limit"]
            lines += [f"  device {w.device} (column {w.column}) {w.cell}: {w.waits_for}" for w in self.cycle]
            lines.append(format_grid(program.table, [(w.device, w.column) for w in self.cycle] or None))
            return "\n".join(lines)
        lines = [f"deadlock under {self.policy} + {self.semantics}: "
                 + " -> ".join(f"device {w.device} at {w.cell}" for w in self.cycle)
                 + f" -> device {self.cycle[0].device}" if self.cycle else "deadlock"]
        for w in self.cycle:
            lines.append(f"  device {w.device} (column {w.column}) {w.cell}: {w.waits_for}")
        lines.append(format_grid(program.table, [(w.device, w.column) for w in self.cycle] or None))
        return "\n".join(lines)

    def error(self, program: Program) -> DeadlockError:
        return DeadlockError(self.describe(program))


def send_action(prog: Program, t: int) -> Action:
    p = int(prog.t_producer[t])
    kind = ActionKind.SEND_F if prog.t_dir[t] == FWD else ActionKind.SEND_B
    return Action(int(prog.c_stage[p]), kind, int(prog.c_mb[p]))


def recv_action(prog: Program, t: int) -> Action:
    c = int(prog.t_consumer[t])
    kind = ActionKind.RECV_F if prog.t_dir[t] == FWD else ActionKind.RECV_B
    return Action(int(prog.c_stage[c]), kind, int(prog.c_mb[c]))


def _wait_of(prog: Program, st: StuckState, d: int, semantics: str) -> Wait:
    p = st.pos[d]
    ty, x = int(prog.row_type[d][p]), int(prog.row_id[d][p])
    col = int(prog.row_col[d][p])
    if ty == CELL_COMPUTE:
        a = prog.action(x)
        for k in range(prog.lp_ptr[x], prog.lp_ptr[x + 1]):
            y = int(prog.lp_idx[k])
            if not st.c_done[y]:
                return Wait(d, col, str(a), f"needs {prog.action(y)}, which comes later in this "
                            "device's row", d)
        t = int(prog.c_in_transfer[x])
        if not st.recv_posted[t]:
            return Wait(d, col, str(a), f"needs {recv_action(prog, t)}, which comes later in this "
                        "device's row", d)
        src = int(prog.t_src[t])
        prod = prog.action(int(prog.t_producer[t]))
        if not st.prod_done[t]:
            return Wait(d, col, str(a), f"waits for the output of {prod} on device {src}", src)
        return Wait(d, col, str(a), f"waits for device {src} to post {send_action(prog, t)}", src)
    cells = [(int(prog.row_type[d][q]), int(prog.row_id[d][q]))
             for q in range(p, int(prog.row_group_end[d][p]))] if semantics == BATCHED else [(ty, x)]
    for cty, t in cells:
        if st.arrived[t]:
            continue
        src, dst = int(prog.t_src[t]), int(prog.t_dst[t])
        prod = prog.action(int(prog.t_producer[t]))
        if cty == CELL_SEND:
            label = str(send_action(prog, t))
            if not st.prod_done[t]:
                return Wait(d, col, label, f"sends the output of {prod}, which comes later in this "
                            "device's row", d)
            if semantics != EAGER and not st.recv_posted[t]:
                return Wait(d, col, label, f"blocks until device {dst} posts {recv_action(prog, t)}", dst)
            continue
        label = str(recv_action(prog, t))
        if not st.prod_done[t]:
            return Wait(d, col, label, f"waits for {prod} on device {src}", src)
        if not st.send_posted[t]:
            return Wait(d, col, label, f"waits for device {src} to post {send_action(prog, t)}", src)
    return Wait(d, col, "?", "waits on a transfer that never completes", d)


def analyze(prog: Program, st: StuckState, semantics: str, policy: str) -> Deadlock:
    """Turn the engine's stuck state into the waits of each stuck device and their cycle."""
    if policy == "ready_first":
        blocked = []
        for c in st.memory_blocked:
            d = int(prog.c_dev[c])
            cols = prog.row_col[d][(prog.row_type[d] == CELL_COMPUTE) & (prog.row_id[d] == c)]
            blocked.append(Wait(d, int(cols[0]) if len(cols) else 0, str(prog.action(c)),
                                "is ready but held back by the in-flight/memory limit, and no backward "
                                "that would free room can become ready", d))
        return Deadlock(semantics, policy, tuple(blocked), tuple(blocked))
    stuck = [d for d in range(prog.n_devices) if st.pos[d] < len(prog.row_type[d])]
    waits = {d: _wait_of(prog, st, d, semantics) for d in stuck}
    d = stuck[0]
    seen: list[int] = []
    while d not in seen and d in waits:
        seen.append(d)
        d = waits[d].on_device
    cycle = tuple(waits[x] for x in seen[seen.index(d):]) if d in seen else tuple(waits[x] for x in seen)
    return Deadlock(semantics, policy, cycle, tuple(waits[x] for x in stuck))
