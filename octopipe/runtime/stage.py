"""Pipeline stages built from a block list and a partition, and the single-process reference that
the runtime's gradients are checked against (on the micro-batches of `octopipe.layers.batch`).

A block list is anything with `build(index, seed) -> nn.Module` (a block in the form
`block(x, batch) -> Tensor`), `carry_shape(index)` and `n_blocks`: `SpecBlocks` wraps a
ModelSpec's layers, `octopipe.model.user_module.UserBlocks` a user's factory. A batch source has
`batch(iteration, mb) -> dict`: `SyntheticBatches` draws random tokens, `octopipe.train.data`
reads a corpus."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from octopipe.layers import build_layer, carry_shape
from octopipe.layers.batch import microbatch
from octopipe.model.spec import ModelSpec


@dataclass(frozen=True)
class SpecBlocks:
    """The layers of a ModelSpec (`octopipe.layers`) as a block list."""

    model: ModelSpec

    @property
    def n_blocks(self) -> int:
        return self.model.n_layers

    def build(self, index: int, seed: int = 0) -> nn.Module:
        return build_layer(self.model, index, seed)

    def carry_shape(self, index: int) -> tuple[int, ...]:
        return carry_shape(self.model, index)


@dataclass(frozen=True)
class SyntheticBatches:
    """Random tokens (and patches) drawn afresh per (seed, iteration, micro-batch)."""

    model: ModelSpec
    seed: int = 0

    def batch(self, iteration: int, mb: int) -> dict:
        return microbatch(self.model, self.seed, iteration, mb)


def as_blocks(model):
    """A ModelSpec as `SpecBlocks`; a block list as it is."""
    return SpecBlocks(model) if isinstance(model, ModelSpec) else model


class StageModule(nn.Module):
    """Blocks lo..hi-1 of the model (a ModelSpec or a block list); parameters are named
    `layers.<global index>.<...>` so that every rank's names match the reference model's."""

    def __init__(self, model, lo: int, hi: int, seed: int = 0) -> None:
        super().__init__()
        self.lo, self.hi = lo, hi
        blocks = as_blocks(model)
        built = blocks.build_stage(lo, hi, seed) if hasattr(blocks, "build_stage") else \
            [blocks.build(j, seed) for j in range(lo, hi)]
        self.layers = nn.ModuleDict({str(j): b for j, b in zip(range(lo, hi), built)})

    def forward(self, x: torch.Tensor | None, batch: dict) -> torch.Tensor:
        for layer in self.layers.values():
            x = layer(x, batch)
        return x


def stage_input_shape(model, lo: int) -> tuple[int, ...] | None:
    """Shape of the activation a stage starting at layer `lo` receives (None for the first)."""
    return None if lo == 0 else as_blocks(model).carry_shape(lo - 1)


@dataclass
class ReferenceResult:
    losses: list[float]                        # mean loss of each iteration
    grads: dict[str, torch.Tensor]             # gradients of the last iteration (before its step)


def reference_run(model: ModelSpec, n_microbatches: int, seed: int = 0, iterations: int = 1,
                  lr: float = 0.0, device: str | torch.device = "cpu", threads: int = 1) -> ReferenceResult:
    """Single-process training on the same micro-batches: the loss is the mean over
    micro-batches; with lr > 0, an SGD step follows each iteration. Gradients come back on the CPU.
    It computes with `threads` CPU threads (the ranks' default, `Job.threads`), so that
    its kernels reduce in the ranks' order whatever the host's core count."""
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return _reference_run(model, n_microbatches, seed, iterations, lr, torch.device(device))
    finally:
        torch.set_num_threads(old)


def _reference_run(model: ModelSpec, n_microbatches: int, seed: int, iterations: int, lr: float,
                   device: torch.device) -> ReferenceResult:
    full = StageModule(model, 0, model.n_layers, seed).to(device)
    opt = torch.optim.SGD(full.parameters(), lr=lr) if lr > 0 else None
    losses, grads = [], {}
    for it in range(iterations):
        full.zero_grad(set_to_none=True)
        total = 0.0
        for m in range(n_microbatches):
            batch = {k: v.to(device) for k, v in microbatch(model, seed, it, m).items()}
            loss = full(None, batch)
            (loss / n_microbatches).backward()
            total += loss.item()
        losses.append(total / n_microbatches)
        grads = {n: (p.grad.detach().cpu().clone() if p.grad is not None else torch.zeros_like(p, device="cpu"))
                 for n, p in full.named_parameters()}
        if opt is not None:
            opt.step()
    return ReferenceResult(losses, grads)


def max_rel_err(got: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> float:
    """Largest norm-wise relative error ||g - g_ref|| / ||g_ref|| over all parameters."""
    missing = set(ref) ^ set(got)
    if missing:
        raise KeyError(f"gradient names differ from the reference: {sorted(missing)[:5]}")
    worst = 0.0
    for name, r in ref.items():
        diff = float((got[name] - r).norm())
        scale = float(r.norm())
        worst = max(worst, diff / scale if scale > 0 else diff)
    return worst
