"""torch CSV dialect: lossless round trips, torch's own loader reads our files, clear errors."""
from __future__ import annotations

from unittest import mock

import pytest
from hand_tables import one_f_one_b
from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime
from torch.distributed.pipelining.stage import PipelineStage

from octopipe.errors import ConfigError, ScheduleError
from octopipe.schedule.action import Action, B, F
from octopipe.schedule.csv_io import read_csv, read_csv_text, to_csv_text, write_csv
from octopipe.schedule.library import SCHEDULES, build_schedule
from octopipe.schedule.lower import lower, validate_lowered
from octopipe.schedule.table import ScheduleTable, v_placement


def aligned_gpipe(p: int, m: int) -> ScheduleTable:
    """GPipe on unit slots, with idle cells (time-aligned) including trailing ones."""
    length = 2 * (m + p - 1)
    rows = []
    for d in range(p):
        row: list[Action | None] = [None] * length
        for i in range(m):
            row[d + i] = Action(d, F, i)
            row[m + p - 1 + (p - 1 - d) + i] = Action(d, B, i)
        rows.append(row)
    return ScheduleTable.from_rows(rows, range(p), m, "gpipe")


def v_table(p: int, m: int) -> ScheduleTable:
    place = v_placement(p, 2)
    rows: list[list[Action]] = [[] for _ in range(p)]
    for s in range(len(place)):
        rows[place[s]] += [Action(s, F, i) for i in range(m)]
    for s in reversed(range(len(place))):
        rows[place[s]] += [Action(s, B, i) for i in range(m)]
    return ScheduleTable.from_rows(rows, place, m, "v")


def chimera_2() -> ScheduleTable:
    t = ScheduleTable.from_strings([["0F0", "1F1", "1B1", "0B0"], ["0F1", "1F0", "1B0", "0B1"]], (0, 1), 2)
    return ScheduleTable(t.rows, (0, 1), 2, "chimera", replicas=((1, 0),), mb_replica=(0, 1))


TABLES = [one_f_one_b(4, 6), aligned_gpipe(3, 4), v_table(3, 4), chimera_2()]


def torch_runtime(p: int, n_stages: int, m: int) -> _PipelineScheduleRuntime:
    """A runtime over mock stages, as torch's `_schedule_visualizer` builds one: no process group."""
    stage = mock.create_autospec(PipelineStage, instance=True)
    stage.group_rank, stage.group_size, stage.submod, stage.num_stages = 0, p, None, n_stages
    return _PipelineScheduleRuntime([stage] * (n_stages // p), m)


@pytest.mark.parametrize("table", TABLES, ids=lambda t: t.name)
def test_compute_only_round_trip_is_lossless(table, tmp_path):
    path = write_csv(table, tmp_path / "s.csv")
    assert read_csv(path, name=table.name) == table


@pytest.mark.parametrize("table", TABLES, ids=lambda t: t.name)
def test_compute_comms_round_trip_is_lossless(table, tmp_path):
    path = write_csv(table, tmp_path / "s.csv", "compute_comms")
    back = read_csv(path, name=table.name)
    assert back == lower(table)
    assert "" not in path.read_text().replace("\n", ",").split(",")[:-1]
    assert back.compute_only() == table.compact()


@pytest.mark.parametrize("table", TABLES[:3], ids=lambda t: t.name)
def test_torch_runtime_loads_our_compute_only_csv(table, tmp_path):
    path = write_csv(table, tmp_path / "s.csv")
    rt = torch_runtime(table.n_devices, table.n_stages, table.n_microbatches)
    rt._load_csv(str(path), "compute_only")
    assert rt.stage_index_to_group_rank == dict(enumerate(table.placement))
    for d in range(table.n_devices):
        assert [str(a) for a in rt.pipeline_order[d] if a is not None] == [str(a) for a in table.actions(d)]
    # torch's own lowering (with its FSDP/grad-sync extras dropped) passes our lowered checker
    torch_lowered = "\n".join(",".join(str(a) for a in rt.pipeline_order_with_comms[d]) for d in range(table.n_devices))
    validate_lowered(read_csv_text(torch_lowered, format="compute_comms"))


@pytest.mark.parametrize("table", TABLES[:3], ids=lambda t: t.name)
def test_torch_runtime_loads_our_compute_comms_csv(table, tmp_path):
    path = write_csv(table, tmp_path / "s.csv", "compute_comms")
    rt = torch_runtime(table.n_devices, table.n_stages, table.n_microbatches)
    rt._load_csv(str(path), "compute_comms")
    assert [[str(a) for a in rt.pipeline_order_with_comms[d]] for d in range(table.n_devices)] == \
        lower(table).as_strings()


def test_placement_and_microbatches_are_inferred_or_given():
    text = to_csv_text(v_table(2, 3))
    t = read_csv_text(text)
    assert t.placement == (0, 1, 1, 0) and t.n_microbatches == 3
    given = read_csv_text(text, placement=(0, 1, 1, 0), n_microbatches=3)
    assert given.rows == t.rows
    with pytest.raises(ScheduleError, match="3F0 is on device 0 but stage 3 of micro-batch 0 is placed on device 1"):
        read_csv_text(text, placement=(0, 1, 0, 1))


def test_replicas_are_inferred_from_rows():
    t = read_csv_text(to_csv_text(chimera_2()))
    assert t.placement == (0, 1) and t.replicas == ((1, 0),) and t.mb_replica == (0, 1)


def test_torch_extras_are_dropped_or_refused():
    text = "0F0,0UNSHARD,0B0,0REDUCE_GRAD\n"
    assert [str(a) for a in read_csv_text(text).rows[0]] == ["0F0", "0B0"]
    with pytest.raises(ScheduleError, match=r"row 0 \(rank 0\), column 1, cell '0UNSHARD'"):
        read_csv_text(text, strict=True)
    overlap = "0F0,0F1,(0F1;0B0)OVERLAP_F_B,0B1\n"
    with pytest.raises(ScheduleError, match="0F1 appears twice"):
        read_csv_text(overlap)
    assert [str(a) for a in read_csv_text("0F0,(0F1;0B0)OVERLAP_F_B,0B1\n").rows[0]] == ["0F0", "0F1", "0B0", "0B1"]


@pytest.mark.parametrize("text,match", [
    ("0F0,1F0\n0B0,1B0\n", r"stage 0 of micro-batch 0 appears on rank 0 and on rank 1 \(row 1, column 0\)"),
    ("0F0,0X0\n", r"row 0 \(rank 0\), column 1, cell '0X0': cannot parse action '0X0'"),
    ("0F0,0F0x\n", r"column 1, cell '0F0x': cannot parse"),
    ("0F0,0BW0\n", r"column 1, cell '0BW0': legacy token '0BW0'.*write it as B"),
    ("0F0,,0B0\n", None),
    ("", "empty"),
])
def test_malformed_csv_names_row_column_cell(text, match):
    if match is None:
        assert read_csv_text(text).rows[0] == (Action(0, F, 0), None, Action(0, B, 0))
        with pytest.raises(ScheduleError, match=r"row 0 \(rank 0\), column 1, cell '': a compute_comms CSV has no "
                                                r"empty"):
            read_csv_text(text, format="compute_comms")
        return
    with pytest.raises(ScheduleError, match=match):
        read_csv_text(text)


def test_format_mismatch_and_bad_format_are_refused(tmp_path):
    lowered = to_csv_text(one_f_one_b(2, 1), "compute_comms")
    with pytest.raises(ScheduleError, match="a compute_only CSV holds no SEND/RECV"):
        read_csv_text(lowered, format="compute_only")
    with pytest.raises(ScheduleError, match="CSV format 'comms' is unknown"):
        to_csv_text(one_f_one_b(2, 1), "comms")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="does not exist"):
        read_csv(tmp_path / "nope.csv")


def test_invalid_table_in_csv_fails_with_marked_grid():
    with pytest.raises(ScheduleError, match="1B0 comes before 1F0") as e:
        read_csv_text("0F0,0B0\n1B0,1F0\n")
    assert ">1B0<" in str(e.value)
    assert read_csv_text("0F0\n1B0,1F0\n", check=False).rows[1][0] == Action(1, B, 0)


# ------------------------------------------------------------- every named schedule

NAMED_SHAPES = [(2, 4), (4, 8), (3, 6)]


def _named(name: str):
    for p, m in NAMED_SHAPES:
        try:
            yield build_schedule(name, p, m)
        except ScheduleError:
            continue


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_every_named_schedule_round_trips(name):
    for t in _named(name):
        for fmt in ("compute_only", "compute_comms"):
            back = read_csv_text(to_csv_text(t, fmt), name=t.name)
            assert back == (t if fmt == "compute_only" else lower(t))


@pytest.mark.parametrize("name", sorted(set(SCHEDULES) - {"chimera"}))
def test_torch_runtime_loads_every_named_schedule(name, tmp_path):
    for t in _named(name):
        for fmt in ("compute_only", "compute_comms"):
            path = write_csv(t, tmp_path / f"{name}.csv", fmt)
            rt = torch_runtime(t.n_devices, t.n_stages, t.n_microbatches)
            rt._load_csv(str(path), fmt)
            if fmt == "compute_only":
                assert rt.stage_index_to_group_rank == dict(enumerate(t.placement))


def test_torch_refuses_chimera_replicas(tmp_path):
    """torch maps each stage to one rank; Chimera's second pipeline breaks that, so torch's
    loader refuses the CSV (our reader infers the replicas from the same file)."""
    t = build_schedule("chimera", 4, 8)
    path = write_csv(t, tmp_path / "chimera.csv")
    with pytest.raises(AssertionError, match="is assigned to both rank"):
        torch_runtime(4, 4, 8)._load_csv(str(path))
    assert read_csv(path, name=t.name) == t


@pytest.mark.parametrize("name,p,m,chunks", [("Interleaved1F1B", 4, 8, 2), ("InterleavedZeroBubble", 3, 6, 2),
                                              ("ZBVZeroBubble", 4, 8, 2), ("DualPipeV", 4, 8, 2),
                                              ("LoopedBFS", 3, 6, 2)])
def test_csv_dumped_by_torch_reads_back(name, p, m, chunks, tmp_path):
    """torch's `_dump_csv` in both formats (with its UNSHARD/RESHARD/REDUCE_GRAD cells and
    DualPipeV's OVERLAP_F_B groups) reads into the compute order torch scheduled; its lowered
    form passes our `validate_lowered` (read_csv checks it)."""
    from torch.distributed.pipelining.schedules import get_schedule_class

    stage = mock.create_autospec(PipelineStage, instance=True)
    stage.group_rank, stage.group_size, stage.submod, stage.num_stages = 0, p, None, p * chunks
    sched = get_schedule_class(name)([stage] * chunks, m)
    expected = [[str(x) for a in sched.pipeline_order[d] if a is not None for x in (a.sub_actions or (a,))
                 if x.microbatch_index is not None] for d in range(p)]
    for fmt in ("compute_only", "compute_comms"):
        sched._dump_csv(str(tmp_path / "t.csv"), fmt)
        t = read_csv(tmp_path / "t.csv")
        assert t.is_lowered == (fmt == "compute_comms")
        assert [[str(a) for a in t.actions(d) if a.kind.is_compute] for d in range(p)] == expected
