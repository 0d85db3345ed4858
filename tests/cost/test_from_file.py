"""cost=file: profile formats, errors, type-averaging, and the OctoPipe authors' profiles as presets."""
from __future__ import annotations

import json

import numpy as np
import pytest

from octopipe.cluster import Cluster, DeviceKind, Link
from octopipe.config.cost import FileCost
from octopipe.cost.from_file import (
    ProfileOptions,
    load_cost_file,
    model_for_file_cost,
    model_from_profile,
    profile_cost_table,
    profile_times,
    type_average,
    type_means,
)
from octopipe.cost.profile_format import (
    Profile,
    load_preset,
    parse_csv,
    parse_json,
    profile_presets,
    read_profile,
    write_profile,
)
from octopipe.errors import ConfigError
from octopipe.model.layer import LayerKind

# A hand-made hybrid: embedding folded into the first Mamba layer, head into the last MLP.
LABELS = ("M+E", "-", "M", "*", "M", "-+H")
F = np.array([5.0, 2.0, 3.0, 1.5, 3.4, 9.0])
B = np.array([10.0, 4.0, 6.0, 3.0, 6.2, 12.0])


def small() -> Profile:
    return Profile(name="tiny", f_ms=F.copy(), b_ms=B.copy(), labels=LABELS, seq_len=8,
                   hidden=16, act_bytes=np.arange(6.0), static_bytes=np.full(6, 7.0))


def test_type_average_by_hand():
    # mean(M) = (3.0 + 3.4) / 2 = 3.2, mean(-) = 2.0, mean(*) = 1.5;
    # E = 5.0 - 3.2 = 1.8 and H = 9.0 - 2.0 = 7.0 are inferred by subtraction.
    means = type_means(F, LABELS)
    assert means == pytest.approx({"M": 3.2, "-": 2.0, "*": 1.5, "E": 1.8, "H": 7.0})
    assert type_average(F, LABELS) == pytest.approx([5.0, 2.0, 3.2, 1.5, 3.2, 9.0])


def test_type_average_shares_inferred_parts_across_composites():
    # Two composites of the same kind: the inferred part is the mean of both samples.
    labels = ("A", "A", "A+X", "A+X")
    t = np.array([1.0, 3.0, 4.0, 6.0])  # mean(A) = 2; X samples 2 and 4 -> mean(X) = 3
    assert type_average(t, labels) == pytest.approx([2.0, 2.0, 5.0, 5.0])


def test_type_average_keeps_uninferable_composite_measured():
    labels = ("A", "X+Y", "A")
    assert type_average(np.array([1.0, 7.0, 3.0]), labels) == pytest.approx([2.0, 7.0, 2.0])


def test_raw_keeps_measurements_and_split_follows_option():
    t = profile_times(small(), ProfileOptions("raw", split=0.25))
    assert t["f"] == pytest.approx(F)
    assert t["i"] == pytest.approx(0.25 * B)
    assert t["w"] == pytest.approx(0.75 * B)
    assert t["i"] + t["w"] == pytest.approx(B)


def test_tick_rounds_up_before_split():
    t = profile_times(small(), ProfileOptions("raw", split=0.5, tick_ms=4.0))
    assert t["f"] == pytest.approx([8.0, 4.0, 4.0, 4.0, 4.0, 12.0])
    assert t["b"] == pytest.approx([12.0, 4.0, 8.0, 4.0, 8.0, 12.0])
    assert t["i"] == pytest.approx(t["b"] / 2)


def test_measured_i_and_w_are_used_as_given():
    prof = Profile(name="iw", f_ms=F, i_ms=B * 0.6, w_ms=B * 0.4, labels=LABELS)
    table = profile_cost_table(prof, ProfileOptions("raw", split=0.5))
    assert table.i[:, 0] == pytest.approx(B * 0.6 / 1e3)
    assert table.w[:, 0] == pytest.approx(B * 0.4 / 1e3)


@pytest.mark.parametrize("suffix", [".csv", ".json"])
def test_round_trip(tmp_path, suffix):
    prof = small()
    path = tmp_path / f"p{suffix}"
    write_profile(prof, path)
    back = read_profile(path)
    assert back.labels == LABELS and back.name == "tiny"
    assert (back.seq_len, back.hidden, back.micro_batch_size) == (8, 16, 1)
    for k in ("f_ms", "b_ms", "act_bytes", "static_bytes"):
        np.testing.assert_array_equal(getattr(back, k), getattr(prof, k))
    assert back.i_ms is None and back.out_bytes is None


def test_csv_documented_example():
    text = ("# name: demo\n# hidden: 4\n# seq_len: 2\n# label_kinds: M=moe;D=mlp\n"
            "layer,label,f_ms,i_ms,w_ms,out_bytes\n"
            "0,D+E,1.0,0.5,0.5,10\n1,M,2.0,1.0,2.0,10\n2,M+H,3.0,1.0,1.0,0\n")
    prof = parse_csv(text)
    assert prof.name == "demo" and prof.b_ms is None
    table = profile_cost_table(prof, ProfileOptions("raw"))
    assert table.b[:, 0] == pytest.approx([1e-3, 3e-3, 2e-3])
    assert table.out_bytes == pytest.approx([10, 10, 0])
    model = model_from_profile(prof)
    assert [lay.kind for lay in model.layers] == [LayerKind.MLP, LayerKind.MOE, LayerKind.MOE]


def test_json_records_and_columns_agree():
    recs = {"name": "x", "layers": [{"label": lab, "f_ms": f, "b_ms": b}
                                    for lab, f, b in zip(LABELS, F, B)]}
    cols = {"name": "x", "arch": list(LABELS), "f_ms": list(F), "b_ms": list(B)}
    a, b = parse_json(recs), parse_json(cols)
    assert a.labels == b.labels
    np.testing.assert_array_equal(a.f_ms, b.f_ms)
    np.testing.assert_array_equal(a.b_ms, b.b_ms)


@pytest.mark.parametrize("text, needle", [
    ("label,f_ms,b_ms\nM,1,2\n-,1\n", "data row 1"),                       # ragged row
    ("label,f_ms,b_ms\nM,1,-2\n", "layer 0 field b_ms"),                    # negative
    ("label,f_ms,b_ms\nM,1,2\n,1,2\n", "layer 1 has no label"),             # unlabelled row
    ("label,f_ms,b_ms\nM,1,nan\n", "not finite"),
    ("label,f_ms,b_ms\nM,abc,2\n", "not a number"),
    ("label,f_ms\nM,1\n", "no backward times"),
    ("label,f_ms,i_ms\nM,1,1\n", "both i_ms and w_ms"),
    ("label,f_ms,b_ms,x\nM,1,2,3\n", "unknown column 'x'"),
    ("layer,f_ms,b_ms\n0,1,2\n2,1,2\n", "data row 1 has layer '2'"),
    ("label,f_ms,b_ms\nM++E,1,2\n", "empty part"),
    ("label,f_ms,b_ms,i_ms,w_ms\nM,1,2,1,2\n", "differs from i_ms + w_ms"),
])
def test_csv_errors_name_the_row_or_field(text, needle):
    with pytest.raises(ConfigError, match=None) as e:
        parse_csv(text)
    assert needle in str(e.value)


def test_json_errors():
    with pytest.raises(ConfigError, match="column b_ms has 2 entries but f_ms has 3"):
        parse_json({"f_ms": [1, 2, 3], "b_ms": [1, 2]})
    with pytest.raises(ConfigError, match=r"layers\[1\] lacks field 'b_ms'"):
        parse_json({"layers": [{"f_ms": 1, "b_ms": 2}, {"f_ms": 1}]})
    with pytest.raises(ConfigError, match="layer 1 field f_ms: -1 is negative"):
        parse_json({"f_ms": [1, -1], "b_ms": [1, 1]})


def test_type_averaging_needs_labels():
    prof = parse_csv("f_ms,b_ms\n1,2\n3,4\n")
    assert profile_times(prof, ProfileOptions("raw"))["f"] == pytest.approx([1, 3])
    with pytest.raises(ConfigError, match="needs layer labels.*cost.averaging=raw"):
        profile_times(prof, ProfileOptions("type"))


def test_options_are_checked():
    with pytest.raises(ConfigError, match="cost.averaging"):
        ProfileOptions("median")
    with pytest.raises(ConfigError, match="cost.split"):
        ProfileOptions("raw", split=1.5)


def test_cfg_path_and_preset(tmp_path):
    with pytest.raises(ConfigError, match="cost.path=PATH"):
        load_cost_file({"source": "file"}, None, None)
    with pytest.raises(ConfigError, match="no such file"):
        load_cost_file({"path": str(tmp_path / "nope.csv")}, None, None)
    with pytest.raises(ConfigError, match="not a profile preset; valid: .*nemotron_nano_v2_9b"):
        load_cost_file({"preset": "llama"}, None, None)


def test_presets_carry_attribution_and_labels():
    assert set(profile_presets()) >= {"gpt_oss_20b", "nemotron_nano_v2_9b", "deepseek_16b", "gpt_13b"}
    layers = {"gpt_oss_20b": 24, "nemotron_nano_v2_9b": 56, "deepseek_16b": 28, "gpt_13b": 40}
    for name, n in layers.items():
        prof = load_preset(name)
        assert prof.n_layers == n and len(prof.labels) == n
        assert "OctoPipe authors" in prof.source and "PipelineSimulator" in prof.source
        model = model_from_profile(prof)
        assert model.n_layers == n and model.seq_len in (2048, 4096)


def test_presets_match_the_shared_bench_file():
    from pathlib import Path
    bench = Path("/work/shared/bench/octopipe-profiles.json")
    if not bench.is_file():
        pytest.skip("shared bench file not present")
    src = json.loads(bench.read_text())["models"]["deepseek-16B"]
    prof = load_preset("deepseek_16b")
    np.testing.assert_array_equal(prof.f_ms, src["f_ms"])
    np.testing.assert_array_equal(prof.b_ms, src["b_ms"])
    assert list(prof.labels) == src["arch"]


def _cluster(kinds=("H800",)) -> Cluster:
    dk = tuple(DeviceKind(k, 1e15, 80e9, 3e12) for k in kinds)
    link = Link("nvlink", 450e9, 3e-6)
    return Cluster("node", dk, tuple(j % len(dk) for j in range(4)), (0,) * 4, link, link)


def test_nemotron_lower_bound_matches_published_figure():
    # Published: Nemotron-Nano-v2-9B, 4 devices, 8 micro-batches, type-averaged times counted
    # in the authors' simulator's 0.1 ms ticks: total work / 4 = 857.2 ms.
    cfg = {"preset": "nemotron_nano_v2_9b", "averaging": "type", "split": 0.5, "tick_ms": 0.1}
    table = load_cost_file(cfg, None, _cluster())
    work_ms = (table.f.sum() + table.b.sum()) * 1e3
    assert work_ms * 8 / 4 == pytest.approx(857.2, abs=1e-6)
    # Unrounded, type-averaging preserves the total (composites absorb the subtraction).
    exact = load_cost_file({**cfg, "tick_ms": None}, None, _cluster())
    raw = load_cost_file({**cfg, "averaging": "raw", "tick_ms": None}, None, _cluster())
    assert exact.f.sum() + exact.b.sum() == pytest.approx(raw.f.sum() + raw.b.sum())
    assert (exact.f.sum() + exact.b.sum()) * 1e3 * 2 == pytest.approx(839.156, abs=1e-3)


def test_profile_defines_layers_and_messages():
    cfg = FileCost(preset="gpt_13b", path=None, averaging="type", split=0.5, tick_ms=None)
    table = load_cost_file(cfg, None, _cluster(("A", "B")))
    assert table.n_layers == 40 and table.kinds == ("A", "B")
    assert table.f[:, 0] == pytest.approx(table.f[:, 1])
    # bf16 hidden state of one 4096-token sample at hidden 5120.
    assert table.out_bytes == pytest.approx(np.full(40, 2 * 4096 * 5120))
    # Every plain transformer block gets the same, averaged time.
    assert np.ptp(table.f[1:-1, 0]) == 0


def test_round_split_rounds_each_half_like_the_published_zero_bubble_baseline():
    prof = Profile(name="r", f_ms=np.array([1.0]), b_ms=np.array([1.03]))
    whole = profile_times(prof, ProfileOptions("raw", 0.5, tick_ms=0.1))
    halves = profile_times(prof, ProfileOptions("raw", 0.5, tick_ms=0.1, round_split=True))
    assert whole["b"] == pytest.approx([1.1]) and whole["i"] == pytest.approx([0.55])
    assert halves["i"] == pytest.approx([0.6]) and halves["w"] == pytest.approx([0.6])


def test_model_for_file_cost_follows_the_profile_when_layer_counts_differ():
    cfg = {"preset": "deepseek_16b"}
    own = model_for_file_cost(cfg, None)
    assert own.n_layers == 28 and own.name == "deepseek-16B"
    assert own.layers[0].name == "D+E" and own.layers[0].kind == LayerKind.MLP
    assert own.layers[5].kind == LayerKind.MOE and own.layers[-1].name == "M+H"
    assert model_for_file_cost(cfg, own) is own
    other = model_from_profile(load_preset("gpt_13b"))
    assert model_for_file_cost(cfg, other).n_layers == 28


def test_describe_states_the_assumed_split():
    from octopipe.cost.from_file import describe
    text = describe(small(), ProfileOptions("type", 0.3, 0.1))
    assert "I = 0.3·B, W = 0.7·B" in text and "type-averaged" in text and "0.1 ms" in text
    iw = Profile(name="iw", f_ms=F, i_ms=B / 2, w_ms=B / 2)
    assert "measured I and W" in describe(iw, ProfileOptions())


def test_w_act_bytes_column_reaches_the_simulators_memory_model(tmp_path):
    """F stores act_bytes, I frees all but w_act_bytes, W frees those (zero-bubble's model)."""
    from octopipe.plan import Partition, Plan
    from octopipe.schedule.table import ScheduleTable
    from octopipe.sim.simulator import simulate

    text = ("label,f_ms,i_ms,w_ms,act_bytes,w_act_bytes\n"
            "-,1.0,1.0,1.0,100,40\n-,1.0,1.0,1.0,100,40\n")
    prof = parse_csv(text)
    np.testing.assert_array_equal(prof.w_act_bytes, [40, 40])
    back = tmp_path / "p.csv"
    write_profile(prof, back)
    np.testing.assert_array_equal(read_profile(back).w_act_bytes, [40, 40])
    table = profile_cost_table(prof, ProfileOptions("raw"))
    assert table.w_act_bytes == pytest.approx([40, 40])
    free = Link("free", float("inf"), 0.0)
    cl = Cluster("c", (DeviceKind("dev", 1e15, 1e18, 3e12),), (0,), (0,), free, free)
    rows = [["0F0", "0F1", "0I0", "0I1", "0W0", "0W1"]]
    sim = simulate(Plan(Partition((2,)), ScheduleTable.from_strings(rows, (0,), 2)), table, cl)
    _times, held = sim.memory_trace(0)
    assert held.max() == pytest.approx(400)              # two micro-batches of two layers
    assert sorted(set(np.round(held, 6)))[:3] == pytest.approx([0, 80, 160])   # only W inputs left


@pytest.mark.parametrize("text,match", [
    ("label,f_ms,b_ms,w_act_bytes\n-,1,2,5\n", "needs an act_bytes column"),
    ("label,f_ms,b_ms,act_bytes,w_act_bytes\n-,1,2,5,6\n", "exceeds act_bytes")])
def test_bad_w_act_bytes_are_one_line_errors(text, match):
    with pytest.raises(ConfigError, match=match):
        parse_csv(text)
