"""Parameter counts against an independent oracle: the runtime's torch modules for each layer."""
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from octopipe.model.build import build_model
from octopipe.model.layer import LayerKind
from octopipe.model.params import layer_params

torch = pytest.importorskip("torch")
from octopipe.layers.build import build_layer  # noqa: E402  (after importorskip)

CONF = Path(__file__).resolve().parents[2] / "conf" / "model"
# The runtime's vision front end is a CPU stand-in (learned positions, RMSNorm in the ViT), not
# the published encoders the counts follow, so those kinds are not compared.
VISION = (LayerKind.PATCH_EMBED, LayerKind.VIT_BLOCK, LayerKind.PROJECTOR)


@pytest.mark.parametrize("name", ["tiny_hybrid", "tiny_moe", "tiny_vlm"])
def test_counts_equal_torch_module_parameters(name):
    m = build_model(OmegaConf.load(CONF / f"{name}.yaml"))
    compared = 0
    for i, x in enumerate(m.layers):
        if x.kind in VISION:
            continue
        module = build_layer(m, i)
        assert layer_params(x) == sum(p.numel() for p in module.parameters()), x.label
        compared += 1
    assert compared >= 6


def test_gemm_flops_equal_torch_flop_counter():
    """The analytic weight-GEMM FLOPs equal what torch's FlopCounterMode counts for the
    runtime's modules (matrix products as `aten.mm`; MoE experts in total)."""
    from torch.utils.flop_counter import FlopCounterMode

    from octopipe.cost.analytic import AnalyticCostModel
    from octopipe.layers.batch import microbatch
    from octopipe.layers.build import carry_shape

    cm = AnalyticCostModel()
    checked = set()
    for name in ("tiny_hybrid", "tiny_moe"):
        m = build_model(OmegaConf.load(CONF / f"{name}.yaml"))
        batch = microbatch(m, 0, 0, 0)
        for i, x in enumerate(m.layers):
            if x.kind not in (LayerKind.MLP, LayerKind.ATTENTION, LayerKind.MAMBA2,
                              LayerKind.LINEAR_ATTENTION, LayerKind.MOE, LayerKind.HEAD):
                continue
            counter = FlopCounterMode(display=False)
            with counter, torch.no_grad():
                build_layer(m, i)(torch.randn(carry_shape(m, i - 1)), batch)
            ops = {str(k): v for k, v in counter.get_flop_counts().get("Global", {}).items()}
            got = counter.get_total_flops() if x.kind is LayerKind.MOE else ops.get("aten.mm", 0)
            assert got == cm.work(x, m).gemm_flops, x.label
            checked.add(x.kind)
    assert len(checked) == 6
