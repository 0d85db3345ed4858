"""Each stack's rules, checked on plans that keep or break them."""
from __future__ import annotations

import pytest

from octopipe.errors import ConfigError
from octopipe.interop.targets import TARGETS, layout_of, placement_of, target_named, violations
from octopipe.interop.units import preset_units
from octopipe.plan import Partition, Plan
from octopipe.schedule.library import build_schedule
from octopipe.schedule.table import ScheduleTable
from tests.interop.helpers import small_model

UNITS = preset_units(small_model("(*-)x6"))      # 14 layers: E, 6 decoder layers of 2, L


def _plan(schedule: str, sizes, chunks: int | None = None, pieces=None) -> Plan:
    table = build_schedule(schedule, 2, 4, chunks)
    return Plan(Partition(tuple(sizes)), table, pieces=pieces or {})


def test_megatron_runs_its_1f1b_and_interleaved_on_whole_decoder_layers():
    megatron = TARGETS["megatron"]
    assert violations(_plan("1f1b", (5, 9)), megatron, UNITS) == []
    assert violations(_plan("interleaved", (3, 4, 4, 3), 2), megatron, UNITS) == []
    assert "cuts inside a decoder layer" in violations(_plan("1f1b", (4, 10)), megatron, UNITS)[0]
    assert "not megatron's" in violations(_plan("zbh1", (5, 9)), megatron, UNITS)[0]
    assert "is not loop" in violations(_plan("zbv", (3, 4, 4, 3)), megatron, UNITS)[0]


def test_torchtitan_takes_any_table_on_loop_or_v_placements():
    titan = TARGETS["torchtitan"]
    for plan in (_plan("zbh1", (5, 9)), _plan("zbv", (3, 4, 4, 3)), _plan("interleaved", (3, 4, 4, 3), 2)):
        assert violations(plan, titan, UNITS) == []
    zbv = build_schedule("zbv", 2, 4)
    odd = Plan(Partition((3, 4, 4, 3)), ScheduleTable(zbv.rows[::-1], (1, 0, 0, 1), 4, "odd"))
    assert "placement" in violations(odd, titan, UNITS)[0]


def test_deepspeed_is_one_stage_per_rank_in_order():
    ds = TARGETS["deepspeed"]
    assert violations(_plan("1f1b", (5, 9)), ds, UNITS) == []
    assert violations(_plan("interleaved", (3, 4, 4, 3), 2), ds, UNITS)


def test_torch_cuts_between_any_layers_but_not_into_pieces():
    torch_t = TARGETS["torch"]
    assert violations(_plan("zbh1", (4, 10)), torch_t, UNITS) == []
    assert "pieces" in violations(_plan("1f1b", (5, 9), pieces={3: 2}), torch_t, None)[0]


def test_placements_and_their_names():
    assert placement_of("v", 3, 2) == (0, 1, 2, 2, 1, 0)
    assert placement_of("loop", 3, 2) == (0, 1, 2, 0, 1, 2)
    assert layout_of((0, 1, 2, 2, 1, 0), 3) == ("v", 2)
    assert layout_of((0, 1, 2), 3) == ("one", 1)
    assert layout_of((1, 0, 2), 3) is None


def test_unknown_target_is_one_line():
    with pytest.raises(ConfigError, match="target='titan' is unknown"):
        target_named("titan")


def test_lifting_a_rule():
    m = TARGETS["megatron"]
    assert m.rules() == ("granularity", "placement", "schedule")
    assert m.relax("schedule").fixed == () and m.relax("granularity").granularity == "layers"
    assert TARGETS["torch"].relax("granularity").free
