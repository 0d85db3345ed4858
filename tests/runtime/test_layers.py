"""Layer modules: shapes, determinism, and the chunked scans against naive recurrences."""
from __future__ import annotations

import torch

from octopipe.layers import build_layer, carry_shape
from octopipe.layers.attention import lightning
from octopipe.layers.batch import microbatch
from octopipe.layers.ssm import ssd_scan
from octopipe.runtime.stage import StageModule
from tests.runtime import tiny


def test_every_kind_runs_forward_backward_with_the_predicted_shapes():
    for model in (tiny.hybrid(), tiny.vlm()):
        batch = microbatch(model, 0, 0, 0)
        x = None
        for j in range(model.n_layers):
            x = build_layer(model, j)(x, batch)
            assert tuple(x.shape) == carry_shape(model, j), model.layers[j].kind
        x.backward()
        assert torch.isfinite(x)


def test_same_seed_same_weights_in_any_process_layout():
    model = tiny.hybrid()
    whole = dict(StageModule(model, 0, model.n_layers, seed=3).named_parameters())
    part = dict(StageModule(model, 4, 7, seed=3).named_parameters())
    assert part and all(torch.equal(p, whole[n]) for n, p in part.items())
    other = dict(StageModule(model, 4, 7, seed=4).named_parameters())
    assert not all(torch.equal(p, other[n]) for n, p in part.items())


def test_ssd_chunked_scan_equals_sequential_recurrence():
    torch.manual_seed(0)
    b, length, h, p, n = 2, 13, 3, 4, 5
    x, bb, cc = torch.randn(b, length, h, p), torch.randn(b, length, h, n), torch.randn(b, length, h, n)
    a = -torch.rand(b, length, h)
    state = torch.zeros(b, h, p, n)
    ys = []
    for t in range(length):
        state = state * torch.exp(a[:, t])[..., None, None] + x[:, t, ..., None] * bb[:, t, :, None, :]
        ys.append((state * cc[:, t, :, None, :]).sum(-1))
    torch.testing.assert_close(ssd_scan(x, a, bb, cc, chunk=4), torch.stack(ys, 1), rtol=1e-5, atol=1e-5)


def test_lightning_blocks_equal_the_masked_quadratic_form():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 3, 11, 4), torch.randn(2, 3, 11, 4), torch.randn(2, 3, 11, 5)
    log_decay = torch.log(torch.tensor([0.9, 0.5, 0.99]))
    t = torch.arange(11.0)
    diff = t[:, None] - t[None, :]
    mask = torch.exp(log_decay.view(3, 1, 1) * diff.clamp(min=0)) * (diff >= 0)
    want = ((q @ k.transpose(-1, -2)) * mask) @ v
    torch.testing.assert_close(lightning(q, k, v, log_decay, block=4), want, rtol=1e-5, atol=1e-5)
