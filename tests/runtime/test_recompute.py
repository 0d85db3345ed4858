"""Recomputation in real compute: the same losses and gradients as keeping the forward, for B and
for I then W, with less saved-activation memory."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from octopipe.model.user_module import UserBlocks, check_blocks
from octopipe.runtime.compute import RealCompute
from octopipe.train.data import TokenBatches, load_corpus

ROOT = Path(__file__).resolve().parent.parent.parent
M = 4


def gpt() -> UserBlocks:
    """examples/tiny_gpt.py at width 64, depth 4: 6 blocks, cut into 2 stages of 3."""
    return check_blocks(UserBlocks(f"{ROOT}/examples/tiny_gpt.py:build", 32, 2, 256,
                                   (("width", 64), ("depth", 4), ("heads", 2))))


def run(blocks, recompute: frozenset[int], split: bool, metering: bool = True) -> RealCompute:
    """F of all M micro-batches on both stages (several in flight), then their backwards (B, or
    I then W); everything kept is freed at the end."""
    c = RealCompute(blocks, ((0, 3), (3, 6)), ((0, 0), (0, 1)), M, 0, torch.device("cpu"))
    c.batches = TokenBatches(load_corpus(""), 32, 2, seed=0)
    c.recompute = recompute
    c.metering = metering
    c.start_iteration(0)
    for mb in range(M):
        c.forward(1, mb, c.forward(0, mb, None))
    for mb in range(M):
        if split:       # each micro-batch's W right after its I, as zero-bubble's recomputation
            c.backward_input(0, mb, c.backward_input(1, mb, None))
            c.backward_weight(1, mb)
            c.backward_weight(0, mb)
        else:
            c.backward(0, mb, c.backward(1, mb, None))
    assert not c.saved and c.meter.live == 0
    return c


@pytest.mark.parametrize("split", [False, True], ids=["B", "I+W"])
def test_recompute_gives_the_same_losses_and_gradients_with_less_memory(split):
    blocks = gpt()
    kept, again = run(blocks, frozenset(), split), run(blocks, frozenset({0, 1}), split)
    assert again.losses == kept.losses
    for name, g in kept.named_grads().items():
        assert g.abs().sum() > 0, name
        assert torch.allclose(again.named_grads()[name], g, rtol=1e-6, atol=1e-9), name
    assert 0 < again.saved_peak_bytes <= 0.6 * kept.saved_peak_bytes, (again.saved_peak_bytes,
                                                                        kept.saved_peak_bytes)
    one = run(blocks, frozenset({1}), split)
    assert again.saved_peak_bytes < one.saved_peak_bytes < kept.saved_peak_bytes
    print(f"saved peak: none {kept.saved_peak_bytes} B, full {again.saved_peak_bytes} B "
          f"({again.saved_peak_bytes / kept.saved_peak_bytes:.3f})")


class _Dropped(torch.nn.Module):
    """Block j of `DropoutBlocks`: an embedding of the ids (j = 0) or a linear layer, then dropout;
    the last block returns the mean square as the loss."""

    def __init__(self, j: int, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed + j)
        self.j = j
        self.inner = torch.nn.Embedding(16, 8) if j == 0 else torch.nn.Linear(8, 8)

    def forward(self, x, batch: dict) -> torch.Tensor:
        h = torch.nn.functional.dropout(self.inner(batch["ids"] if self.j == 0 else x), 0.5)
        return h.pow(2).mean() if self.j == 3 else h


class DropoutBlocks:
    """Four blocks with dropout: a rerun forward must draw the masks its first forward drew."""

    n_blocks = 4

    def build(self, index: int, seed: int = 0) -> torch.nn.Module:
        return _Dropped(index, seed)

    def carry_shape(self, index: int) -> tuple[int, ...]:
        return (2, 5, 8)

    def batch(self, iteration: int, mb: int) -> dict:
        return {"ids": torch.randint(0, 16, (2, 5), generator=torch.Generator().manual_seed(mb))}


@pytest.mark.parametrize("split", [False, True], ids=["B", "I+W"])
def test_a_rerun_forward_draws_the_same_dropout_masks(split):
    def grads(recompute: frozenset[int]):
        torch.manual_seed(1)
        c = RealCompute(DropoutBlocks(), ((0, 2), (2, 4)), ((0, 0), (0, 1)), M, 0, torch.device("cpu"))
        c.batches, c.recompute = DropoutBlocks(), recompute
        c.start_iteration(0)
        for mb in range(M):
            c.forward(1, mb, c.forward(0, mb, None))
        for mb in range(M):
            if split:
                c.backward_input(0, mb, c.backward_input(1, mb, None))
                c.backward_weight(1, mb)
                c.backward_weight(0, mb)
            else:
                c.backward(0, mb, c.backward(1, mb, None))
        return c.losses, c.named_grads(), torch.rand(1)

    kept, again = grads(frozenset()), grads(frozenset({0, 1}))
    assert again[0] == kept[0] and torch.equal(again[2], kept[2])     # and the RNG goes on as without
    for name, g in kept[1].items():
        assert torch.allclose(again[1][name], g, rtol=1e-6, atol=1e-9), name
