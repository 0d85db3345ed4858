"""Plan JSON: lossless round trips, the CSV beside it, and clear errors on bad documents."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from octopipe.cost.action_costs import action_costs
from octopipe.cost.table import CostTable
from octopipe.errors import ConfigError, ScheduleError
from octopipe.plan import Plan, uniform_partition
from octopipe.plan_io import FORMAT_VERSION, load_plan, load_schedule_file, plan_from_doc, plan_to_doc, save_plan
from octopipe.schedule.action import Action, B, F
from octopipe.schedule.csv_io import read_csv
from octopipe.schedule.lower import lower
from octopipe.schedule.table import ScheduleTable, v_placement


def v_table(p: int, m: int) -> ScheduleTable:
    place = v_placement(p, 2)
    rows: list[list[Action | None]] = [[] for _ in range(p)]
    for s in range(len(place)):
        rows[place[s]] += [Action(s, F, i) for i in range(m)]
    rows[0].append(None)  # an idle cell survives the round trip
    for s in reversed(range(len(place))):
        rows[place[s]] += [Action(s, B, i) for i in range(m)]
    return ScheduleTable.from_rows(rows, place, m, "v")


def chimera_2() -> ScheduleTable:
    t = ScheduleTable.from_strings([["0F0", "1F1", "1B1", "0B0"], ["0F1", "1F0", "1B0", "0B1"]], (0, 1), 2)
    return ScheduleTable(t.rows, (0, 1), 2, "chimera", replicas=((1, 0),), mb_replica=(0, 1))


def make_plan(table: ScheduleTable) -> Plan:
    costs = {str(a): 0.001 * (1 + a.stage) for _, a in table if a.kind.is_compute}
    return Plan(uniform_partition(4 * table.n_stages + 1, table.n_stages), table, "llama-tiny", "h100x8",
                {"seed": 3, "bubble_ratio": np.float64(0.25), "action_costs": costs})


@pytest.mark.parametrize("table", [v_table(3, 4), chimera_2(), lower(v_table(2, 3))], ids=["v", "chimera", "lowered"])
def test_round_trip_is_lossless(table, tmp_path):
    plan = make_plan(table)
    path = save_plan(plan, tmp_path / "plan.json")
    back = load_plan(path)
    assert back == plan
    assert back.table == table
    assert back.meta == {"seed": 3, "bubble_ratio": 0.25, "action_costs": plan.meta["action_costs"]}
    assert load_schedule_file(path) == table


def test_csv_is_written_beside_and_reads_back(tmp_path):
    plan = make_plan(v_table(3, 2))
    save_plan(plan, tmp_path / "out" / "plan.json", tmp_path / "out" / "schedule.csv")
    doc = json.loads((tmp_path / "out" / "plan.json").read_text())
    assert doc["csv"] == "schedule.csv" and doc["version"] == FORMAT_VERSION
    assert doc["schedule"]["rows"][0][:2] == ["0F0", "0F1"]
    assert read_csv(tmp_path / "out" / "schedule.csv", name="v") == plan.table
    assert load_schedule_file(tmp_path / "out" / "schedule.csv", name="v") == plan.table


def _doc(tmp_path, **changes):
    doc = plan_to_doc(make_plan(v_table(2, 2)))
    for k, v in changes.items():
        if v is None:
            del doc[k]
        else:
            doc[k] = v
    path = tmp_path / "p.json"
    path.write_text(json.dumps(doc))
    return path


@pytest.mark.parametrize("changes,match", [
    ({"version": 2}, "plan format version 2 is not supported; this OctoPipe reads version 1"),
    ({"format": "other"}, "format 'other' is not 'octopipe.plan'"),
    ({"placement": None}, "field 'placement' is missing"),
    ({"n_microbatches": "4"}, "field 'n_microbatches' must be a int, got str"),
    ({"n_devices": 3}, "n_devices is 3 but schedule.rows has 2 rows"),
    ({"partition": [[0, 3], [4, 5], [5, 7], [7, 9]]}, r"partition stage 1 = layers \[4, 5\) is not contiguous"),
    ({"schedule": {"name": "v", "rows": [["0F0", "0BW0"], []]}}, r"schedule.rows\[0\]\[1\] = '0BW0': legacy token"),
    ({"placement": [0, 1, 0, 1]}, "is on device 0 but stage"),
])
def test_bad_documents_say_what_is_wrong(tmp_path, changes, match):
    with pytest.raises(ScheduleError, match=match):
        load_plan(_doc(tmp_path, **changes))


def test_old_piece_provenance_keys_are_read_and_saved_under_the_new_names(tmp_path):
    """Plans written before the layer pieces were called pieces kept their provenance as
    meta.split_names / meta.split_costs: both are read, and saving writes piece_names/piece_costs."""
    doc = plan_to_doc(make_plan(v_table(2, 2)))
    doc["meta"].update({"pieces": {"1": 2}, "split_names": {"1": "head"}, "split_costs": "rows"})
    path = tmp_path / "old.json"
    path.write_text(json.dumps(doc))
    plan = load_plan(path, check=False)
    assert plan.pieces == {1: 2}
    assert plan.meta["piece_names"] == {"1": "head"} and plan.meta["piece_costs"] == "rows"
    assert "split_names" not in plan.meta and "split_costs" not in plan.meta
    saved = json.loads(save_plan(plan, tmp_path / "new.json").read_text())["meta"]
    assert saved["piece_names"] == {"1": "head"} and "split_names" not in saved


def test_unreadable_files(tmp_path):
    with pytest.raises(ConfigError, match="schedule.file=.*does not exist"):
        load_schedule_file(tmp_path / "none.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{ not json")
    with pytest.raises(ScheduleError, match=r"not valid JSON \(line 1, column 3"):
        load_plan(bad)


def test_meta_that_json_cannot_hold_is_refused(tmp_path):
    plan = Plan(uniform_partition(4, 4), v_table(2, 1), meta={"f": object()})
    with pytest.raises(ScheduleError, match="plan.meta.f holds a object"):
        save_plan(plan, tmp_path / "p.json")
    assert not (tmp_path / "p.json").exists() and not (tmp_path / "p.csv").exists()


def test_action_costs_from_a_cost_table_travel_with_the_plan(tmp_path):
    table = v_table(2, 2)  # 4 stages on 2 devices
    plan = Plan(((0, 1), (1, 3), (3, 4), (4, 6)), table)
    base = CostTable.uniform(6, f=1.0, i=2.0, w=0.5, kinds=("fast", "slow"))
    costs = dataclasses.replace(base, f=base.f * [1.0, 2.0])  # the slow kind doubles F
    seconds = action_costs(plan, costs, kind_of_device=(0, 1))
    assert seconds["0F0"] == 1.0 and seconds["1F1"] == 2 * 2.0  # stage 1: 2 layers on device 1
    assert seconds["3B0"] == 2 * 2.5  # stage 3: 2 layers, B = I + W
    with_costs = Plan(plan.partition, table, meta={"action_costs": seconds})
    assert load_plan(save_plan(with_costs, tmp_path / "p.json")).meta["action_costs"] == seconds
    with pytest.raises(ScheduleError, match="kind_of_device lists 1 devices; the table uses 2"):
        action_costs(plan, costs, (0,))


def test_the_schedule_policy_round_trips_typed_with_its_warmup(tmp_path):
    """`Plan.policy` is written to `meta.policy` and read back as the same typed value, warm-up
    offsets and an unlimited in-flight count included; a policy missing a field is one error."""
    import math

    from octopipe.plan import Plan, SchedulePolicy
    from octopipe.schedule.library import build_schedule

    table = build_schedule("1f1b", 2, 4)
    pol = SchedulePolicy(True, math.inf, (1, 0, 2), 0, 1, 0.9, (1, 0))
    plan = Plan(((0, 2), (2, 4)), table, policy=pol)
    save_plan(plan, tmp_path / "p.json")
    back = load_plan(tmp_path / "p.json")
    assert back.policy == pol
    doc = plan_to_doc(plan)
    assert doc["meta"]["policy"]["inflight"] is None and doc["meta"]["policy"]["warmup"] == [1, 0]
    del doc["meta"]["policy"]["kind_rank"]
    with pytest.raises(ScheduleError, match="kind_rank"):
        plan_from_doc(doc)


def test_a_plan_file_from_before_the_pieces_rename_still_loads(tmp_path):
    """Files that kept the split layers under `meta.shards` (and the provenance under shard_*)
    load as `Plan.pieces` and save under the new names."""
    table = v_table(2, 1)
    doc = plan_to_doc(Plan(uniform_partition(4, 4), table))
    doc["meta"].update({"shards": {"1": 2}, "shard_names": {"1": "mlp"}, "shard_costs": "model"})
    old = plan_from_doc(doc, check=False)
    assert dict(old.pieces) == {1: 2}
    assert old.meta["piece_names"] == {"1": "mlp"} and old.meta["piece_costs"] == "model"
    new = plan_to_doc(old)["meta"]
    assert new["pieces"] == {"1": 2} and "shards" not in new and "shard_names" not in new
