"""Real compute's cheap paths: metering switched off changes nothing but the meter, and the
finiteness flag of a forward output agrees with `isfinite(h).all()`."""
from __future__ import annotations

import pytest
import torch

from octopipe.runtime.compute import RealCompute, finite_flag
from octopipe.train.data import TokenBatches, load_corpus

from .test_recompute import M, gpt


def one_iteration(metering: bool) -> RealCompute:
    c = RealCompute(gpt(), ((0, 3), (3, 6)), ((0, 0), (0, 1)), M, 0, torch.device("cpu"))
    c.batches = TokenBatches(load_corpus(""), 32, 2, seed=0)
    c.metering = metering
    c.start_iteration(0)
    for mb in range(M):
        c.forward(1, mb, c.forward(0, mb, None))
    for mb in range(M):
        c.backward_input(0, mb, c.backward_input(1, mb, None))
        c.backward_weight(1, mb)
        c.backward_weight(0, mb)
    return c


def test_without_metering_the_losses_and_gradients_are_the_same_bits_and_nothing_is_counted():
    on, off = one_iteration(True), one_iteration(False)
    assert on.saved_peak_bytes > 0 and off.saved_peak_bytes == 0 and off.meter.live == 0
    assert off.losses == on.losses
    grads = on.named_grads()
    assert grads.keys() == off.named_grads().keys()
    for name, g in off.named_grads().items():
        assert torch.equal(g, grads[name]), name


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_the_finite_flag_is_isfinite_all(dtype):
    big = torch.finfo(dtype).max
    g = torch.Generator().manual_seed(0)
    cases = [torch.randn(4, 64, 32, generator=g).to(dtype), torch.full((4096,), big, dtype=dtype),
             torch.full((4096,), -big, dtype=dtype), torch.zeros(0, dtype=dtype)]
    for bad in (float("inf"), float("-inf"), float("nan")):
        h = torch.randn(4, 64, 32, generator=g).to(dtype)
        h[1, 7, 3] = bad
        cases.append(h)
    both = torch.randn(8, generator=g).to(dtype)
    both[0], both[1] = float("inf"), float("-inf")
    cases.append(both)
    for h in cases:
        assert bool(finite_flag(h)) == bool(torch.isfinite(h).all())
    assert [bool(finite_flag(h)) for h in cases] == [True] * 4 + [False] * 4
