"""Compile a schedule table once into flat integer arrays: the simulator's program.

A program holds structure only (no seconds, no bytes), so the tuner can re-run one table with
new durations cheaply. Ids are dense integers:

- compute nodes ``c in [0, n_compute)``: one per compute action, with device, stage, kind
  (0=F, 1=I, 2=W, 3=B) and micro-batch;
- transfers ``t in [0, n_transfers)``: one per data edge between two devices (F(s)→F(s+1)
  forward, I/B(s)→I/B(s-1) backward), with producer, consumer, source and destination device
  and the link direction (src, dst) it travels on;
- rows: per device, the cells the device executes in order: a compute node, the SEND of a
  transfer, or its RECV. Lowered tables give their own SEND/RECV cells (torch's convention, see
  `octopipe.schedule.lower`); compute-only tables get them implicitly: each RECV right before
  the compute that consumes it and each SEND right after the compute that produces it (under
  batched semantics a SEND and the next compute's RECV then form one group, Megatron's
  send_forward_recv_backward).

Data edges follow `octopipe.schedule.validate.data_predecessors`: F(s,m) after F(s-1,m); I or
B(s,m) after F(s,m) and after I/B(s+1,m); W(s,m) after I(s,m).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from octopipe.errors import ScheduleError
from octopipe.schedule.action import Action, ActionKind
from octopipe.schedule.grid import format_grid
from octopipe.schedule.table import ScheduleTable

KIND_CODE = {ActionKind.F: 0, ActionKind.I: 1, ActionKind.W: 2, ActionKind.B: 3}
# enum members hash in Python; compile loops look kinds up by identity instead (4+ = comm)
_CODE_BY_ID = {id(k): v for k, v in KIND_CODE.items()} | {
    id(k): 4 + j for j, k in enumerate((ActionKind.SEND_F, ActionKind.RECV_F, ActionKind.SEND_B, ActionKind.RECV_B))}
KIND_OF_CODE = (ActionKind.F, ActionKind.I, ActionKind.W, ActionKind.B)
CELL_COMPUTE, CELL_SEND, CELL_RECV = 0, 1, 2
FWD, BWD = 0, 1


@dataclass(frozen=True, eq=False)
class Program:
    """A table compiled to integer arrays (see the module docstring for the id spaces)."""

    table: ScheduleTable
    c_dev: np.ndarray
    c_stage: np.ndarray
    c_kind: np.ndarray
    c_mb: np.ndarray
    c_in_transfer: np.ndarray      # transfer feeding the node from another device, or -1
    c_out_transfer: np.ndarray     # transfer the node feeds to another device, or -1
    lp_ptr: np.ndarray             # CSR of same-device data predecessors
    lp_idx: np.ndarray
    ls_ptr: np.ndarray             # CSR of same-device data successors
    ls_idx: np.ndarray
    t_src: np.ndarray
    t_dst: np.ndarray
    t_dir: np.ndarray
    t_producer: np.ndarray
    t_consumer: np.ndarray
    t_link: np.ndarray             # dense id of the link direction (src, dst)
    links: tuple[tuple[int, int], ...]
    row_type: tuple[np.ndarray, ...]   # per device: CELL_COMPUTE / CELL_SEND / CELL_RECV
    row_id: tuple[np.ndarray, ...]     # per device: compute id or transfer id
    row_col: tuple[np.ndarray, ...]    # per device: column of the cell in table.rows (for grids)
    row_group_end: tuple[np.ndarray, ...]  # for a comm cell: index after its run of comm cells
    implicit_comm: bool
    c_rowpos: np.ndarray           # index of the node among its device's compute cells
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def n_devices(self) -> int:
        return self.table.n_devices

    @property
    def n_stages(self) -> int:
        return self.table.n_stages

    @property
    def n_microbatches(self) -> int:
        return self.table.n_microbatches

    @property
    def n_compute(self) -> int:
        return len(self.c_dev)

    @property
    def n_transfers(self) -> int:
        return len(self.t_src)

    def action(self, c: int) -> Action:
        return Action(int(self.c_stage[c]), KIND_OF_CODE[int(self.c_kind[c])], int(self.c_mb[c]))

    def transfer_label(self, t: int) -> str:
        p = int(self.t_producer[t])
        kind = "SEND_F" if self.t_dir[t] == FWD else "SEND_B"
        return f"{self.c_stage[p]}{kind}{self.c_mb[p]}:{self.t_src[t]}->{self.t_dst[t]}"

    def node_label(self, node: int) -> str:
        """Compute nodes are `0..n_compute-1`; transfer t is node `n_compute + t`."""
        if node < self.n_compute:
            return str(self.action(node))
        return self.transfer_label(node - self.n_compute)

    def lists(self) -> dict:
        """Plain Python lists of every array, cached: the engine's inner loop indexes these."""
        if "lists" not in self._cache:
            names = ("c_dev", "c_kind", "c_in_transfer", "c_out_transfer", "lp_ptr", "lp_idx",
                     "ls_ptr", "ls_idx", "t_src", "t_dst", "t_producer", "t_consumer", "t_link")
            out = {n: getattr(self, n).tolist() for n in names}
            out["row_type"] = [r.tolist() for r in self.row_type]
            out["row_id"] = [r.tolist() for r in self.row_id]
            out["row_group_end"] = [r.tolist() for r in self.row_group_end]
            self._cache["lists"] = out
        return self._cache["lists"]


def _fail(table: ScheduleTable, where: tuple[int, int] | None, sentence: str) -> ScheduleError:
    return ScheduleError(sentence + "\n" + format_grid(table, where))


def compile_table(table: ScheduleTable) -> Program:
    """Check the table's cells and compile it; raises ScheduleError with a marked grid."""
    n_s, n_m, n_d = table.n_stages, table.n_microbatches, table.n_devices
    if n_m < 1 or n_s < 1:
        raise ScheduleError(f"table {table.name!r} needs at least one stage and one micro-batch "
                            f"(has {n_s} stages, {n_m} micro-batches)")
    key_to_c: dict[tuple[int, int, int], int] = {}
    where: list[tuple[int, int]] = []
    c_dev, c_stage, c_kind, c_mb = [], [], [], []
    comm_cells: list[tuple[int, int, Action]] = []
    for d, row in enumerate(table.rows):
        for col, a in enumerate(row):
            if a is None:
                continue
            if not (0 <= a.stage < n_s and 0 <= a.microbatch < n_m):
                raise _fail(table, (d, col), f"{a} names stage {a.stage} or micro-batch "
                            f"{a.microbatch} outside 0..{n_s - 1} / 0..{n_m - 1}")
            home = table.device_of(a.stage, a.microbatch)
            if home != d:
                raise _fail(table, (d, col), f"{a} is on device {d} but stage {a.stage} of "
                            f"micro-batch {a.microbatch} is placed on device {home}")
            code = _CODE_BY_ID[id(a.kind)]
            if code > 3:
                comm_cells.append((d, col, a))
                continue
            key = (a.stage, code, a.microbatch)
            if key in key_to_c:
                raise _fail(table, (d, col), f"{a} appears twice")
            key_to_c[key] = len(c_dev)
            where.append((d, col))
            c_dev.append(d)
            c_stage.append(a.stage)
            c_kind.append(code)
            c_mb.append(a.microbatch)
    # completeness: F once; B, or I and W, once per (stage, micro-batch)
    split = np.zeros((n_s, n_m), dtype=bool)
    for s in range(n_s):
        for m in range(n_m):
            has = [(s, k, m) in key_to_c for k in range(4)]
            if not has[0]:
                raise _fail(table, None, f"{Action(s, ActionKind.F, m)} is missing: every stage runs "
                            "F once per micro-batch")
            if has[3] and (has[1] or has[2]):
                raise _fail(table, where[key_to_c[(s, 3, m)]], f"backward of stage {s} micro-batch "
                            f"{m} appears both as B and as I/W; use one form")
            if has[1] != has[2]:
                raise _fail(table, None, f"stage {s} micro-batch {m} has only one of I and W; a split "
                            "backward needs both")
            if not (has[3] or has[1]):
                raise _fail(table, None, f"backward of stage {s} micro-batch {m} is missing")
            split[s, m] = has[1]
    n_c = len(c_dev)
    c_in = np.full(n_c, -1, dtype=np.int64)
    c_out = np.full(n_c, -1, dtype=np.int64)
    lpreds: list[list[int]] = [[] for _ in range(n_c)]
    t_src, t_dst, t_dir, t_prod, t_cons = [], [], [], [], []
    t_key: dict[tuple[int, int, int], int] = {}   # (dir, sending stage, mb) -> t
    for c in range(n_c):
        s, k, m = c_stage[c], c_kind[c], c_mb[c]
        preds: list[tuple[int, int]] = []   # (pred id, direction of the edge)
        if k == 0:
            if s > 0:
                preds.append((key_to_c[(s - 1, 0, m)], FWD))
        elif k in (1, 3):
            preds.append((key_to_c[(s, 0, m)], -1))
            if s + 1 < n_s:
                preds.append((key_to_c[(s + 1, 1 if split[s + 1, m] else 3, m)], BWD))
        else:
            preds.append((key_to_c[(s, 1, m)], -1))
        for p, direction in preds:
            if c_dev[p] == c_dev[c]:
                lpreds[c].append(p)
            else:
                t = len(t_src)
                t_src.append(c_dev[p])
                t_dst.append(c_dev[c])
                t_dir.append(direction)
                t_prod.append(p)
                t_cons.append(c)
                c_in[c] = t
                c_out[p] = t
                t_key[(direction, c_stage[p], m)] = t
    link_ids: dict[tuple[int, int], int] = {}
    t_link = [link_ids.setdefault((a, b), len(link_ids)) for a, b in zip(t_src, t_dst)]
    n_t = len(t_src)

    rows_type: list[list[int]] = [[] for _ in range(n_d)]
    rows_id: list[list[int]] = [[] for _ in range(n_d)]
    rows_col: list[list[int]] = [[] for _ in range(n_d)]
    implicit = not comm_cells
    if implicit:
        for d, row in enumerate(table.rows):
            for col, a in enumerate(row):
                if a is None:
                    continue
                c = key_to_c[(a.stage, _CODE_BY_ID[id(a.kind)], a.microbatch)]
                if c_in[c] >= 0:
                    rows_type[d].append(CELL_RECV)
                    rows_id[d].append(int(c_in[c]))
                    rows_col[d].append(col)
                rows_type[d].append(CELL_COMPUTE)
                rows_id[d].append(c)
                rows_col[d].append(col)
                if c_out[c] >= 0:
                    rows_type[d].append(CELL_SEND)
                    rows_id[d].append(int(c_out[c]))
                    rows_col[d].append(col)
    else:
        sends = np.full(n_t, -1)
        recvs = np.full(n_t, -1)
        for d, row in enumerate(table.rows):
            for col, a in enumerate(row):
                if a is None:
                    continue
                s, m = a.stage, a.microbatch
                code = _CODE_BY_ID[id(a.kind)]
                if code < 4:
                    rows_type[d].append(CELL_COMPUTE)
                    rows_id[d].append(key_to_c[(s, code, m)])
                    rows_col[d].append(col)
                    continue
                key = {ActionKind.SEND_F: (FWD, s, m), ActionKind.RECV_F: (FWD, s - 1, m),
                       ActionKind.SEND_B: (BWD, s, m), ActionKind.RECV_B: (BWD, s + 1, m)}[a.kind]
                t = t_key.get(key)
                if t is None:
                    raise _fail(table, (d, col), f"{a} matches no transfer: its partner stage is "
                                "missing or on the same device (co-located stages exchange nothing)")
                is_send = a.kind in (ActionKind.SEND_F, ActionKind.SEND_B)
                seen = sends if is_send else recvs
                if seen[t] >= 0:
                    raise _fail(table, (d, col), f"{a} appears twice")
                seen[t] = 1
                rows_type[d].append(CELL_SEND if is_send else CELL_RECV)
                rows_id[d].append(t)
                rows_col[d].append(col)
        for t in range(n_t):
            if sends[t] < 0 or recvs[t] < 0:
                p = t_prod[t]
                missing = "SEND" if sends[t] < 0 else "RECV"
                raise _fail(table, where[p], f"the lowered table lacks the {missing} of the transfer "
                            f"{t_src[t]}->{t_dst[t]} that {Action(c_stage[p], KIND_OF_CODE[c_kind[p]], c_mb[p])} "
                            "feeds; lower the compute-only table with octopipe.schedule.lower.lower()")
    group_end = []
    for types in rows_type:
        ge = [0] * len(types)
        end = len(types)
        for i in range(len(types) - 1, -1, -1):
            if types[i] == CELL_COMPUTE:
                end = i
                ge[i] = i + 1
            else:
                ge[i] = end
        group_end.append(np.array(ge, dtype=np.int64))
    lp_ptr = np.zeros(n_c + 1, dtype=np.int64)
    lp_ptr[1:] = np.cumsum([len(p) for p in lpreds])
    lp_idx = np.array([p for ps in lpreds for p in ps], dtype=np.int64)
    lsuccs: list[list[int]] = [[] for _ in range(n_c)]
    for c, ps in enumerate(lpreds):
        for p in ps:
            lsuccs[p].append(c)
    ls_ptr = np.zeros(n_c + 1, dtype=np.int64)
    ls_ptr[1:] = np.cumsum([len(p) for p in lsuccs])
    ls_idx = np.array([p for ps in lsuccs for p in ps], dtype=np.int64)
    rowpos = np.zeros(n_c, dtype=np.int64)
    for d in range(n_d):
        ids = [i for ty, i in zip(rows_type[d], rows_id[d]) if ty == CELL_COMPUTE]
        rowpos[ids] = np.arange(len(ids))
    arr = lambda x: np.asarray(x, dtype=np.int64)  # noqa: E731
    return Program(
        table=table, c_dev=arr(c_dev), c_stage=arr(c_stage), c_kind=arr(c_kind), c_mb=arr(c_mb),
        c_in_transfer=c_in, c_out_transfer=c_out, lp_ptr=lp_ptr, lp_idx=lp_idx, ls_ptr=ls_ptr,
        ls_idx=ls_idx, t_src=arr(t_src), t_dst=arr(t_dst), t_dir=arr(t_dir), t_producer=arr(t_prod),
        t_consumer=arr(t_cons), t_link=arr(t_link), links=tuple(link_ids),
        row_type=tuple(arr(r) for r in rows_type), row_id=tuple(arr(r) for r in rows_id),
        row_col=tuple(arr(r) for r in rows_col), row_group_end=tuple(group_end),
        implicit_comm=implicit, c_rowpos=rowpos)
