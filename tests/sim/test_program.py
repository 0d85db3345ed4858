"""The compiled program: cell checks (first bad cell in row order, marked) and its edges
against `data_predecessors`, the schedule package's own statement of the data dependencies."""
from __future__ import annotations

import pytest

from octopipe.errors import ScheduleError
from octopipe.schedule.action import Action, ActionKind
from octopipe.schedule.generators import chimera, interleaved, zbv
from octopipe.schedule.lower import lower
from octopipe.schedule.table import ScheduleTable
from octopipe.schedule.validate import data_predecessors
from octopipe.sim.program import CELL_COMPUTE, CELL_RECV, CELL_SEND, compile_table
from tests.sim.conftest import one_f_one_b_table

GOOD = [["0F0", "0F1", "0B0", "0B1"], ["1F0", "1B0", "1F1", "1B1"]]


def _table(rows: list[list[str]], m: int = 2) -> ScheduleTable:
    return ScheduleTable.from_strings(rows, (0, 1), m)


@pytest.mark.parametrize("rows,sentence,marked", [
    ([["0F0", "0F1", "0B0", "0B5"], GOOD[1]],
     "0B5 names stage 0 or micro-batch 5 outside 0..1 / 0..1", "dev   0 .*>0B5<"),
    ([["0F0", "0F1", "0B0", "0B1", "1F0"], GOOD[1]],
     "1F0 is on device 0 but stage 1 of micro-batch 0 is placed on device 1", "dev   0 .*>1F0<"),
    ([["0F0", "0F1", "0B0", "0F1", "0B1"], GOOD[1]], "0F1 appears twice", "dev   0 .*>0F1<"),
    ([["0F0", "0B0", "0B1"], GOOD[1]], "0F1 is missing: every stage runs F once", None),
    ([["0F0", "0F1", "0B0", "0B1", "0I1", "0W1"], GOOD[1]],
     "backward of stage 0 micro-batch 1 appears both as B and as I/W", "dev   0 .*>0B1<"),
    ([["0F0", "0F1", "0B0", "0I1"], GOOD[1]], "stage 0 micro-batch 1 has only one of I and W", None),
    ([["0F0", "0F1", "0B0"], GOOD[1]], "backward of stage 0 micro-batch 1 is missing", None),
    # two faults: the earlier cell in row order (device 0, column 1) is reported
    ([["0F0", "0F7", "0F1", "0B0", "0B1", "0B1"], GOOD[1]], "0F7 names stage 0 or micro-batch 7", None),
])
def test_bad_cells_name_the_first_fault(rows, sentence, marked):
    with pytest.raises(ScheduleError, match=sentence) as e:
        compile_table(_table(rows))
    if marked:
        assert any(__import__("re").match(marked, line) for line in str(e.value).splitlines())


LOWERED = [["0F0", "0SEND_F0", "0RECV_B0", "0B0"], ["1RECV_F0", "1F0", "1B0", "1SEND_B0"]]


@pytest.mark.parametrize("edit,sentence", [
    ((0, 1, "0RECV_F0"), "0RECV_F0 matches no transfer"),
    ((1, 0, "1SEND_B0"), "1SEND_B0 appears twice"),
    ((1, 3, "1RECV_F0"), "1RECV_F0 appears twice"),
])
def test_bad_comm_cells(edit, sentence):
    rows = [list(r) for r in LOWERED]
    d, c, text = edit
    rows[d][c] = text
    with pytest.raises(ScheduleError, match=sentence):
        compile_table(_table(rows, 1))


def test_a_lowered_table_missing_a_recv_names_the_transfer():
    rows = [list(LOWERED[0]), [c for c in LOWERED[1] if c != "1RECV_F0"]]
    with pytest.raises(ScheduleError, match="lacks the RECV of the transfer 0->1 that 0F0 feeds"):
        compile_table(_table(rows, 1))


def _split_set(table: ScheduleTable) -> set[tuple[int, int]]:
    return {(a.stage, a.microbatch) for _, a in table if a.kind is ActionKind.I}


@pytest.mark.parametrize("table", [one_f_one_b_table(4, 6), interleaved(4, 8, 2), lower(interleaved(4, 8, 2)),
                                   zbv(4, 8, 2), lower(zbv(4, 8, 2)), chimera(4, 4)],
                         ids=["1f1b", "interleaved", "interleaved-lowered", "zbv", "zbv-lowered", "chimera"])
def test_edges_and_rows_follow_the_data_dependencies(table):
    prog = compile_table(table)
    node = {prog.action(c): c for c in range(prog.n_compute)}
    split = _split_set(table)
    transfers = set(zip(prog.t_producer.tolist(), prog.t_consumer.tolist()))
    assert len(transfers) == prog.n_transfers
    for a, c in node.items():
        d = int(prog.c_dev[c])
        assert d == table.device_of(a.stage, a.microbatch)
        preds = [node[p] for p in data_predecessors(a, table.n_stages, split)]
        local = [p for p in preds if prog.c_dev[p] == d]
        assert prog.lp_idx[prog.lp_ptr[c]:prog.lp_ptr[c + 1]].tolist() == local
        for p in local:
            assert c in prog.ls_idx[prog.ls_ptr[p]:prog.ls_ptr[p + 1]].tolist()
        remote = [p for p in preds if prog.c_dev[p] != d]
        assert [(p, c) in transfers for p in remote] == [True] * len(remote)
        t = int(prog.c_in_transfer[c])
        assert (t >= 0) == bool(remote)
        if t >= 0:
            assert (prog.t_src[t], prog.t_dst[t]) == (prog.c_dev[prog.t_producer[t]], d)
            assert prog.links[prog.t_link[t]] == (prog.t_src[t], prog.t_dst[t])
    # every device row holds its compute cells in table order, each transfer's SEND on the
    # sender and RECV on the receiver, a compute cell ends its group
    for d in range(prog.n_devices):
        types, ids, gend = prog.row_type[d].tolist(), prog.row_id[d].tolist(), prog.row_group_end[d].tolist()
        computes = [i for ty, i in zip(types, ids) if ty == CELL_COMPUTE]
        assert [prog.action(c) for c in computes] == [a for a in table.actions(d) if a.kind.is_compute]
        assert prog.c_rowpos[computes].tolist() == list(range(len(computes)))
        for k, (ty, i) in enumerate(zip(types, ids)):
            if ty == CELL_SEND:
                assert prog.t_src[i] == d
            elif ty == CELL_RECV:
                assert prog.t_dst[i] == d
            nxt = next((j for j in range(k, len(types)) if types[j] == CELL_COMPUTE), len(types))
            assert gend[k] == (k + 1 if ty == CELL_COMPUTE else nxt)


def test_idle_cells_keep_their_columns():
    rows = [["0F0", "", "0B0"], ["", "1F0", "1B0"]]
    prog = compile_table(_table(rows, 1))
    assert prog.row_col[0].tolist() == [0, 0, 2, 2]       # 0F0, its SEND; 0B0's RECV, 0B0
    assert prog.row_col[1].tolist() == [1, 1, 2, 2]
    assert [str(prog.action(c)) for c in range(prog.n_compute)] == ["0F0", "0B0", "1F0", "1B0"]
    assert Action.parse("0F0") == prog.action(0)
