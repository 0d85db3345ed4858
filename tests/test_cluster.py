"""Device kinds, links and cluster presets: which device and which link each pipeline rank uses."""
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from octopipe.cluster_presets import DEVICE_KINDS, cluster_from_config
from octopipe.errors import ConfigError

CONF = Path(__file__).resolve().parents[1] / "conf" / "cluster"
PRESETS = sorted(p.stem for p in CONF.glob("*.yaml"))


def preset(name, pp=None, tp=1):
    return cluster_from_config(OmegaConf.load(CONF / f"{name}.yaml"), pp=pp, tp=tp)


def test_device_kind_datasheet_figures():
    # Dense BF16 peak, HBM capacity, HBM bandwidth (models-and-hardware.md §4).
    expect = {"A100-80GB": (312e12, 80e9, 2039e9), "H100-SXM": (989.4e12, 80e9, 3350e9),
              "H200": (989e12, 141e9, 4800e9), "B200": (2250e12, 180e9, 8000e9)}
    for name, (peak, mem, bw) in expect.items():
        d = DEVICE_KINDS[name]
        assert (d.peak_flops, d.memory_bytes, d.memory_bandwidth) == (peak, mem, bw)


def test_required_presets_exist_and_load():
    assert {"h100_1x8", "h100_4x8", "h100_16x8", "h200_4x8", "h200_16x8", "hetero_a100_h100"} <= set(PRESETS)
    sizes = {"h100_1x8": 8, "h100_4x8": 32, "h100_16x8": 128, "h200_4x8": 32, "h200_16x8": 128,
             "hetero_a100_h100": 16}
    for name, n in sizes.items():
        assert preset(name).n_devices == n


def test_single_node_uses_nvlink_everywhere():
    c = preset("h100_1x8")
    assert c.kind_of(7).name == "H100-SXM"
    assert c.link(0, 0) is None and c.transfer_time(3, 3, 1e9) == 0.0
    link = c.link(0, 7)
    assert link.bandwidth == 450e9 and link.latency == 3e-6
    # 67 MB (Llama-3-8B boundary at s=8192) over NVLink 4: about 0.15 ms.
    assert c.transfer_time(0, 1, 8192 * 4096 * 2) == pytest.approx(3e-6 + 67.108864e6 / 450e9)


def test_multi_node_pipeline_crosses_infiniband():
    c = preset("h100_4x8", pp=8)
    assert c.node == (0, 0, 1, 1, 2, 2, 3, 3)
    assert c.link(0, 1).name.startswith("nvlink") and c.link(1, 2).name == "ib_ndr"
    # Over IB NDR (46 GB/s achieved) the same 67 MB takes about 1.5 ms.
    assert c.transfer_time(1, 2, 8192 * 4096 * 2) == pytest.approx(1.46e-3, rel=0.02)


def test_tensor_parallel_groups_a_node_into_one_rank():
    c = preset("h200_4x8", pp=4, tp=8)
    assert c.n_devices == 4 and c.node == (0, 1, 2, 3) and c.kind_of(0).name == "H200"
    packed = preset("h100_1x8", pp=4, tp=2)
    assert packed.node == (0, 0, 0, 0)


def test_heterogeneous_cluster_has_two_kinds_and_the_slower_nvlink():
    c = preset("hetero_a100_h100", pp=8)
    assert [k.name for k in c.kinds] == ["H100-SXM", "A100-80GB"]
    assert [c.kind_of(r).name for r in range(8)] == ["H100-SXM"] * 4 + ["A100-80GB"] * 4
    assert c.link(0, 3).bandwidth == 300e9 and c.link(3, 4).name == "ib_ndr"
    full = preset("hetero_a100_h100")
    assert full.device_kind == (0,) * 8 + (1,) * 8


def test_custom_links():
    c = cluster_from_config({"name": "x", "nodes": 2, "gpus_per_node": 2, "device": "B200",
                             "intra_link": {"bandwidth": 1e9, "latency": 1e-3}, "inter_link": "ib_hdr"})
    assert c.transfer_time(0, 1, 1e9) == pytest.approx(1.001) and c.link(1, 2).name == "ib_hdr"


@pytest.mark.parametrize("cfg, kwargs, field", [
    ({"nodes": 1}, {"pp": 9}, "pp=9"),
    ({"nodes": 1}, {"pp": 0}, "pp=0"),
    ({"nodes": 1}, {"tp": 3}, "cost.tp=3"),
    ({"nodes": 1, "device": "V100"}, {}, "cluster.nodes[0]='V100'"),
    ({"nodes": 0}, {}, "cluster.nodes=0"),
    ({"nodes": 1, "layout": "ring"}, {}, "cluster.layout"),
    ({"nodes": 1, "inter_link": "carrier_pigeon"}, {}, "cluster.inter_link"),
    ({"nodes": 1, "gpus": 8}, {}, "cluster.gpus: unknown key"),
])
def test_bad_clusters_name_the_field(cfg, kwargs, field):
    with pytest.raises(ConfigError) as e:
        cluster_from_config(cfg, **kwargs)
    assert str(e.value).startswith(field) and "\n" not in str(e.value)
