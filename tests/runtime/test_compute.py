"""Real compute's cheap paths: metering switched off changes nothing but the meter, and the
finiteness flag of a forward output agrees with `isfinite(h).all()`; an emulated action's sleep
never ends early."""
from __future__ import annotations

import time

import pytest
import torch

from octopipe.runtime.compute import AWAKE_S, EmulatedCompute, finite_flag

from .test_recompute import gpt, run


def test_without_metering_the_losses_and_gradients_are_the_same_bits_and_nothing_is_counted():
    on, off = run(gpt(), frozenset(), True), run(gpt(), frozenset(), True, metering=False)
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


@pytest.mark.parametrize("seconds", [0.0, 1e-4, AWAKE_S, 3e-3])
def test_an_emulated_action_never_ends_before_its_time(seconds):
    """The sleep's awake tail ends at the deadline, never before it (no upper bound: a busy
    machine may run late)."""
    for _ in range(5):
        t0 = time.perf_counter()
        EmulatedCompute._sleep(seconds)
        assert time.perf_counter() - t0 >= seconds
