"""The saved-activation meter: exact bytes of what autograd saves, a storage once, freed after backward."""
from __future__ import annotations

import torch

from octopipe.runtime.memory import SavedMeter, memory_comparison, optimizer_bytes, storage_pointers


def _pair():
    return torch.randn(4, 8, requires_grad=True), torch.randn(4, 8, requires_grad=True)


def test_a_product_saves_both_factors_until_its_backward():
    x, w = _pair()
    meter = SavedMeter()
    with meter.hooks():
        y = (x * w).sum()
    assert meter.live == 2 * 4 * 8 * 4 and meter.peak == meter.live
    y.backward()
    assert meter.live == 0 and meter.peak == 256


def test_a_storage_saved_twice_is_counted_once():
    x, w = _pair()
    meter = SavedMeter()
    with meter.hooks():
        y = (x * x).sum() + (x * w).sum() + x[1:].sin().sum()     # x, its view and w
    assert meter.live == 256
    del y
    assert meter.live == 0 and meter.peak == 256


def test_excluded_storages_and_held_tensors():
    x, w = _pair()
    meter = SavedMeter(storage_pointers([w]))
    with meter.hooks():
        y = (x * w.t().t()).sum()       # w's view: the parameter's storage is not counted
    assert meter.live == 128
    held = meter.hold(torch.zeros(10))
    assert meter.live == 168 and meter.peak == 168
    del held, y
    assert meter.live == 0
    meter.reset_peak()
    assert meter.peak == 0


def test_optimizer_bytes_sums_adamw_state():
    lin = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(lin.parameters())
    assert optimizer_bytes(opt) == 0
    lin(torch.randn(2, 4)).sum().backward()
    opt.step()
    steps = sum(s["step"].numel() * s["step"].element_size() for s in opt.state.values())
    assert optimizer_bytes(opt) == 2 * 4 * (12 + 3) + steps


def test_a_layers_weight_saved_by_autograd_is_not_an_activation():
    """nn.Linear saves its input and its weight (through a transposed view) for the backward, relu
    its output: excluding the parameters leaves the input and the output."""
    lin = torch.nn.Linear(8, 3)
    x = torch.randn(4, 8, requires_grad=True)
    counted = []
    for exclude in (storage_pointers(lin.parameters()), set()):
        meter = SavedMeter(exclude)
        with meter.hooks():
            y = lin(x).relu().sum()
        counted.append(meter.live)
        del y
    assert counted == [4 * 8 * 4 + 4 * 3 * 4, 4 * 8 * 4 + 4 * 3 * 4 + 3 * 8 * 4]


def test_memory_comparison_is_the_largest_relative_difference_per_rank():
    got = memory_comparison([110, 50], [100.0, 50.0])
    assert got == {"memory_measured_bytes": [110, 50], "memory_simulated_bytes": [100.0, 50.0],
                   "memory_max_rel_err": 0.1}
    assert memory_comparison([1], [0.0])["memory_max_rel_err"] is None
