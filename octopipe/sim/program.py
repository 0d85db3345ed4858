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
from itertools import chain
from operator import itemgetter
from typing import NamedTuple

import numpy as np

from octopipe.errors import ScheduleError
from octopipe.schedule.action import Action, ActionKind
from octopipe.schedule.table import ScheduleTable
from octopipe.schedule.text_grid import format_grid

KIND_CODE = {ActionKind.F: 0, ActionKind.I: 1, ActionKind.W: 2, ActionKind.B: 3}
# every kind's code, 4+ = comm (str-valued members hash at C speed)
_CODE = KIND_CODE | {k: 4 + j for j, k in enumerate((ActionKind.SEND_F, ActionKind.RECV_F,
                                                     ActionKind.SEND_B, ActionKind.RECV_B))}
_STAGE, _KIND, _MB = itemgetter(0), itemgetter(1), itemgetter(2)
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


def _i64(x) -> np.ndarray:
    return np.asarray(x, dtype=np.int64)


class Cells(NamedTuple):
    """Every non-idle cell of a table in row order, as flat int64 arrays."""

    dev: np.ndarray
    col: np.ndarray
    stage: np.ndarray
    code: np.ndarray       # KIND_CODE, 4+ for SEND_F, RECV_F, SEND_B, RECV_B
    mb: np.ndarray


def _cells(table: ScheduleTable) -> Cells:
    """Device, column, stage, kind code and micro-batch of every non-idle cell, in row order.

    The only per-cell Python work of the compile, all of it in C loops that allocate no
    collectable objects (so the cyclic GC stays idle): the rows are chained, fields read by
    itemgetter, kinds mapped to codes by a dict; the rest of the compile is numpy.
    """
    lens = [len(r) for r in table.rows]
    cells = list(chain.from_iterable(table.rows))
    n = len(cells)
    dev = np.repeat(np.arange(len(lens), dtype=np.int64), lens)
    col = np.arange(n, dtype=np.int64) - np.repeat(np.cumsum(lens) - lens, lens)
    if None in cells:       # idle cells of a time-aligned table
        keep = np.fromiter((a is not None for a in cells), dtype=bool, count=n)
        cells = [a for a in cells if a is not None]
        n = len(cells)
        dev, col = dev[keep], col[keep]
    return Cells(dev, col, np.fromiter(map(_STAGE, cells), dtype=np.int64, count=n),
                 np.fromiter(map(_CODE.__getitem__, map(_KIND, cells)), dtype=np.int64, count=n),
                 np.fromiter(map(_MB, cells), dtype=np.int64, count=n))


def _first_repeat(keys: np.ndarray) -> np.ndarray:
    """Mask of the entries whose key already appeared earlier in `keys`."""
    _, first = np.unique(keys, return_index=True)
    seen = np.ones(len(keys), dtype=bool)
    seen[first] = False
    return seen


def _check_cells(table: ScheduleTable, dev, col, stage, code, mb, n_keys, key) -> None:
    """Range, placement and duplicate checks of every cell; the first bad cell in row order
    raises, with the sentence of the first check it fails."""
    n_s, n_m = table.n_stages, table.n_microbatches
    bad_range = (stage < 0) | (stage >= n_s) | (mb < 0) | (mb >= n_m)
    s_ok, m_ok = np.where(bad_range, 0, stage), np.where(bad_range, 0, mb)
    places = _i64(table.all_placements())
    replica = _i64(table.mb_replica) if table.mb_replica else np.zeros(n_m, dtype=np.int64)
    home = places[replica[m_ok], s_ok]
    bad = bad_range | (home != dev)
    compute = (code < 4) & ~bad
    counts = np.bincount(key[compute], minlength=n_keys)
    if counts.max(initial=0) > 1:
        repeat = np.zeros(len(key), dtype=bool)
        idx = np.flatnonzero(compute)
        repeat[idx] = _first_repeat(key[idx])
        bad |= repeat
    if not bad.any():
        return
    i = int(np.argmax(bad))
    d, c = int(dev[i]), int(col[i])
    a = table.rows[d][c]
    if bad_range[i]:
        raise _fail(table, (d, c), f"{a} names stage {a.stage} or micro-batch "
                    f"{a.microbatch} outside 0..{n_s - 1} / 0..{n_m - 1}")
    if home[i] != d:
        raise _fail(table, (d, c), f"{a} is on device {d} but stage {a.stage} of "
                    f"micro-batch {a.microbatch} is placed on device {int(home[i])}")
    raise _fail(table, (d, c), f"{a} appears twice")


def _check_complete(table: ScheduleTable, has: np.ndarray, key_to_c: np.ndarray,
                    where: tuple[np.ndarray, np.ndarray]) -> None:
    """F once; B, or I and W, once per (stage, micro-batch): `has[s, kind, m]`."""
    f, i, w, b = has[:, 0], has[:, 1], has[:, 2], has[:, 3]
    bad = ~f | (b & (i | w)) | (i != w) | ~(b | i)
    if not bad.any():
        return
    s, m = (int(x) for x in np.unravel_index(int(np.argmax(bad)), bad.shape))
    if not f[s, m]:
        raise _fail(table, None, f"{Action(s, ActionKind.F, m)} is missing: every stage runs "
                    "F once per micro-batch")
    if b[s, m] and (i[s, m] or w[s, m]):
        c = int(key_to_c[s, 3, m])
        raise _fail(table, (int(where[0][c]), int(where[1][c])), f"backward of stage {s} "
                    f"micro-batch {m} appears both as B and as I/W; use one form")
    if i[s, m] != w[s, m]:
        raise _fail(table, None, f"stage {s} micro-batch {m} has only one of I and W; a split "
                    "backward needs both")
    raise _fail(table, None, f"backward of stage {s} micro-batch {m} is missing")


def _csr(owner: np.ndarray, value: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """CSR of `value` grouped by `owner` in [0, n), keeping the given order within a group."""
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(owner, minlength=n), out=ptr[1:])
    return ptr, value[np.argsort(owner, kind="stable")]


def compile_table(table: ScheduleTable) -> Program:
    """Check the table's cells and compile it; raises ScheduleError with a marked grid.

    Cost is linear in the cells: one pass of Python over the rows (`_cells`), then numpy.
    """
    n_s, n_m, n_d = table.n_stages, table.n_microbatches, table.n_devices
    if n_m < 1 or n_s < 1:
        raise ScheduleError(f"table {table.name!r} needs at least one stage and one micro-batch "
                            f"(has {n_s} stages, {n_m} micro-batches)")
    cells = _cells(table)
    dev, col, stage, code, mb = cells
    n_keys = n_s * 4 * n_m
    key = (stage * 4 + np.minimum(code, 3)) * n_m + mb      # (stage, kind, mb) of compute cells
    _check_cells(table, dev, col, stage, code, mb, n_keys, key)
    is_c = code < 4
    c_dev, c_col, c_stage, c_kind, c_mb = dev[is_c], col[is_c], stage[is_c], code[is_c], mb[is_c]
    n_c = len(c_dev)
    key_to_c = np.full(n_keys, -1, dtype=np.int64)
    key_to_c[key[is_c]] = np.arange(n_c)
    key_to_c = key_to_c.reshape(n_s, 4, n_m)
    _check_complete(table, key_to_c >= 0, key_to_c, (c_dev, c_col))
    split = key_to_c[:, 1, :] >= 0

    # data predecessors: slot 0 the same stage's F (I, B) or I (W), or the previous stage's F
    # (F); slot 1 the next stage's I or B (I, B). Only F's slot 0 and slot 1 can cross devices.
    back = (c_kind == 1) | (c_kind == 3)
    s_prev = np.maximum(c_stage - 1, 0)
    s_next = np.minimum(c_stage + 1, n_s - 1)
    pred0 = np.where(c_kind == 0, np.where(c_stage > 0, key_to_c[s_prev, 0, c_mb], -1),
                     key_to_c[c_stage, np.where(c_kind == 2, 1, 0), c_mb])
    nxt_kind = np.where(split[s_next, c_mb], 1, 3)
    pred1 = np.where(back & (c_stage + 1 < n_s), key_to_c[s_next, nxt_kind, c_mb], -1)
    preds = np.stack([pred0, pred1], axis=1)
    dirs = np.stack([np.where(c_kind == 0, FWD, -1), np.full(n_c, BWD)], axis=1)
    has = preds >= 0
    cross = has & (c_dev[np.maximum(preds, 0)] != c_dev[:, None])
    local = has & ~cross
    # transfers in (consumer, slot) order
    flat = np.flatnonzero(cross.ravel())
    t_cons = flat // 2
    t_prod = preds.ravel()[flat]
    t_dir = dirs.ravel()[flat]
    t_src, t_dst = c_dev[t_prod], c_dev[t_cons]
    n_t = len(flat)
    c_in = np.full(n_c, -1, dtype=np.int64)
    c_out = np.full(n_c, -1, dtype=np.int64)
    c_in[t_cons] = np.arange(n_t)
    c_out[t_prod] = np.arange(n_t)
    t_key = np.full((2, n_s, n_m), -1, dtype=np.int64)    # (dir, sending stage, mb) -> t
    t_key[t_dir, c_stage[t_prod], c_mb[t_prod]] = np.arange(n_t)
    # link directions numbered in order of first use
    pair = t_src * n_d + t_dst
    uniq, first, inverse = np.unique(pair, return_index=True, return_inverse=True)
    by_first = np.argsort(first, kind="stable")
    rank = np.empty(len(uniq), dtype=np.int64)
    rank[by_first] = np.arange(len(uniq))
    t_link = rank[inverse.reshape(-1)]
    links = tuple(divmod(x, n_d) for x in uniq[by_first].tolist())
    # same-device predecessors and successors (CSR)
    local_pred = preds[local]
    local_succ = np.nonzero(local)[0]
    lp_ptr, lp_idx = _csr(local_succ, local_pred, n_c)
    ls_ptr, ls_idx = _csr(local_pred, local_succ, n_c)

    implicit = bool(is_c.all())
    if implicit:
        # RECV right before the compute that consumes it, SEND right after the one producing it
        keep = np.stack([c_in >= 0, np.ones(n_c, dtype=bool), c_out >= 0], axis=1).ravel()
        r_type = np.tile(_i64((CELL_RECV, CELL_COMPUTE, CELL_SEND)), n_c)[keep]
        r_id = np.stack([c_in, np.arange(n_c), c_out], axis=1).ravel()[keep]
        r_col = np.repeat(c_col, 3)[keep]
        r_dev = np.repeat(c_dev, 3)[keep]
    else:
        r_type, r_id, r_col, r_dev = _lowered_rows(table, cells, t_key, t_prod, t_cons)
    n_r = len(r_type)
    bounds = np.zeros(n_d + 1, dtype=np.int64)
    np.cumsum(np.bincount(r_dev, minlength=n_d), out=bounds[1:])
    row_start = bounds[r_dev]
    pos = np.arange(n_r)
    comp = r_type == CELL_COMPUTE
    # a compute cell ends its own group; a comm cell's group runs to the row's next compute cell
    nxt = np.minimum.accumulate(np.where(comp, pos, bounds[r_dev + 1])[::-1])[::-1]
    r_gend = np.where(comp, pos + 1, nxt) - row_start
    spans = list(zip(bounds[:-1].tolist(), bounds[1:].tolist()))
    c_first = np.zeros(n_d + 1, dtype=np.int64)
    np.cumsum(np.bincount(c_dev, minlength=n_d), out=c_first[1:])
    rowpos = np.arange(n_c) - c_first[c_dev]
    return Program(
        table=table, c_dev=c_dev, c_stage=c_stage, c_kind=c_kind, c_mb=c_mb,
        c_in_transfer=c_in, c_out_transfer=c_out, lp_ptr=lp_ptr, lp_idx=lp_idx, ls_ptr=ls_ptr,
        ls_idx=ls_idx, t_src=t_src, t_dst=t_dst, t_dir=_i64(t_dir), t_producer=t_prod,
        t_consumer=t_cons, t_link=t_link, links=links,
        row_type=tuple(r_type[a:b] for a, b in spans), row_id=tuple(r_id[a:b] for a, b in spans),
        row_col=tuple(r_col[a:b] for a, b in spans), row_group_end=tuple(r_gend[a:b] for a, b in spans),
        implicit_comm=implicit, c_rowpos=rowpos)


# per comm code (4 SEND_F, 5 RECV_F, 6 SEND_B, 7 RECV_B): direction, sending stage - own stage
_COMM_DIR = _i64((FWD, FWD, BWD, BWD))
_COMM_SHIFT = _i64((0, -1, 0, 1))


def _lowered_rows(table: ScheduleTable, cells: Cells, t_key: np.ndarray, t_prod: np.ndarray,
                  t_cons: np.ndarray) -> tuple[np.ndarray, ...]:
    """Row cells of a lowered table: its own SEND/RECV cells matched to the transfers
    (`t_key[dir, sending stage, mb]` -> transfer; producer and consumer compute node of each)."""
    dev, col, stage, code, mb = cells
    is_c = code < 4
    n_s, n_t = table.n_stages, len(t_prod)
    comm = np.flatnonzero(~is_c)
    cc = code[comm] - 4
    sender = stage[comm] + _COMM_SHIFT[cc]
    ok = (sender >= 0) & (sender < n_s)
    t = np.where(ok, t_key[_COMM_DIR[cc], np.clip(sender, 0, n_s - 1), mb[comm]], -1)
    is_send = (cc == 0) | (cc == 2)
    bad = t < 0
    slot = np.where(bad, 0, 2 * t + is_send)
    if np.bincount(slot[~bad], minlength=2 * n_t).max(initial=0) > 1:
        idx = np.flatnonzero(~bad)
        repeat = np.zeros(len(comm), dtype=bool)
        repeat[idx] = _first_repeat(slot[idx])
        bad |= repeat
    if bad.any():
        j = int(np.argmax(bad))
        d, c = int(dev[comm[j]]), int(col[comm[j]])
        a = table.rows[d][c]
        if t[j] < 0:
            raise _fail(table, (d, c), f"{a} matches no transfer: its partner stage is "
                        "missing or on the same device (co-located stages exchange nothing)")
        raise _fail(table, (d, c), f"{a} appears twice")
    sends = np.zeros(n_t, dtype=bool)
    recvs = np.zeros(n_t, dtype=bool)
    sends[t[is_send]] = True
    recvs[t[~is_send]] = True
    lacking = ~(sends & recvs)
    if lacking.any():
        k = int(np.argmax(lacking))
        p = int(t_prod[k])
        missing = "SEND" if not sends[k] else "RECV"
        c_dev, c_col = dev[is_c], col[is_c]
        a = Action(int(stage[is_c][p]), KIND_OF_CODE[int(code[is_c][p])], int(mb[is_c][p]))
        raise _fail(table, (int(c_dev[p]), int(c_col[p])), f"the lowered table lacks the "
                    f"{missing} of the transfer {c_dev[p]}->{c_dev[t_cons[k]]} that {a} feeds; "
                    "lower the compute-only table with octopipe.schedule.lower.lower()")
    r_type = np.full(len(code), CELL_COMPUTE, dtype=np.int64)
    r_type[comm] = np.where(is_send, CELL_SEND, CELL_RECV)
    r_id = np.empty(len(code), dtype=np.int64)
    r_id[is_c] = np.arange(int(is_c.sum()))
    r_id[comm] = t
    return r_type, r_id, col, dev
