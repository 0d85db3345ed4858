"""AdamW with decoupled weight decay, a warm-up + cosine learning rate and gradient clipping by
the global norm across ranks, one optimizer per (replica, stage).

One AdamW per stage copy, because AdamW updates each parameter from its own gradient and state
alone: stepping every stage after an iteration's flush (`step`) is exactly one AdamW over the
whole model, and `step_stage` is the per-backward update an asynchronous schedule (PipeDream)
makes on one stage. Matrices (ndim >= 2) decay; biases, norms and gains do not.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn


@dataclass(frozen=True)
class OptimSettings:
    """AdamW and its learning-rate schedule (TrainConfig's optimizer fields as one value)."""

    lr: float = 3e-3
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    warmup_steps: int = 10
    total_steps: int = 100
    min_lr_ratio: float = 0.1
    clip_norm: float = 1.0          # 0: no clipping


def lr_at(s: OptimSettings, step: int) -> float:
    """The learning rate of optimizer step `step` (0-based): linear warm-up over `warmup_steps`,
    then a cosine decay to `min_lr_ratio * lr` at `total_steps`."""
    if s.warmup_steps and step < s.warmup_steps:
        return s.lr * (step + 1) / s.warmup_steps
    span = max(1, s.total_steps - s.warmup_steps)
    progress = min(1.0, (step - s.warmup_steps) / span)
    low = s.lr * s.min_lr_ratio
    return low + (s.lr - low) * 0.5 * (1.0 + math.cos(math.pi * progress))


def _groups(module: nn.Module, weight_decay: float, owned: set[int] | None = None) -> list[dict]:
    mine = [p for p in module.parameters() if p.requires_grad and (owned is None or id(p) in owned)]
    decay = [p for p in mine if p.ndim >= 2]
    flat = [p for p in mine if p.ndim < 2]
    return [g for g in ({"params": decay, "weight_decay": weight_decay},
                        {"params": flat, "weight_decay": 0.0}) if g["params"]]


class StageOptimizers:
    """AdamW per stage copy of `stages` ((replica, stage) -> module). `counted` are the copies
    whose gradients enter the global norm (one copy per stage: Chimera's replicas hold the same
    summed gradients); `distributed` all-reduces the norm over the default process group.
    `owned`: ids of the parameters this rank updates (ZeRO-1: its share; None: all)."""

    def __init__(self, stages: dict[tuple[int, int], nn.Module], settings: OptimSettings,
                 distributed: bool = False, owned: set[int] | None = None) -> None:
        self.stages, self.settings, self.distributed = stages, settings, distributed
        self.counted = [c for c in sorted(stages) if c[0] == 0]
        # ids of parameters counted elsewhere: a shared parameter's other copies, another
        # replica's or TP rank's copy of the same values
        self.uncounted: set[int] = set()
        groups = {c: _groups(m, settings.weight_decay, owned) for c, m in stages.items()}
        self.opts = {c: torch.optim.AdamW(g, lr=settings.lr, betas=(settings.beta1, settings.beta2),
                                          eps=settings.eps, foreach=False)
                     for c, g in groups.items() if g}

    def _counted_params(self) -> list[nn.Parameter]:
        return [p for c in self.counted for p in self.stages[c].parameters()
                if p.grad is not None and id(p) not in self.uncounted]

    def _grads(self, copies) -> list[torch.Tensor]:
        return [p.grad for c in copies for p in self.stages[c].parameters() if p.grad is not None]

    def grad_norm(self) -> float:
        """The L2 norm of every stage's gradient, over all ranks (float64 sums)."""
        sq = torch.zeros((), dtype=torch.float64)
        for p in self._counted_params():
            sq += p.grad.detach().double().pow(2).sum().cpu()
        if self.distributed:
            dist.all_reduce(sq)
        return float(sq.sqrt())

    def stage_squares(self) -> dict[int, float]:
        """Stage -> the sum of squares of its gradient on this rank (the counted copies)."""
        out: dict[int, float] = {}
        for c in self.counted:
            sq = torch.zeros((), dtype=torch.float64)
            for p in self.stages[c].parameters():
                if p.grad is not None and id(p) not in self.uncounted:
                    sq += p.grad.detach().double().pow(2).sum().cpu()
            out[c[1]] = out.get(c[1], 0.0) + float(sq)
        return out

    def clip(self, squares: float | None = None) -> float:
        """Scale every gradient so that the global norm is at most `clip_norm`; the norm before.
        `squares`: the global sum of squares when the caller has reduced it already (the loop's
        health check sums `stage_squares` over ranks), which saves a second pass and reduction."""
        norm = self.grad_norm() if squares is None else math.sqrt(squares)
        limit = self.settings.clip_norm
        if limit > 0 and norm > limit:
            coef = limit / (norm + 1e-6)
            for g in self._grads(sorted(self.stages)):
                g.mul_(coef)
        return norm

    def clip_stage(self, stage: int) -> float:
        """Clip the gradients of `stage`'s copies by their own norm (an asynchronous update has
        no global norm: the other stages update at other times); the norm before."""
        grads = self._grads([c for c in sorted(self.stages) if c[1] == stage])
        norm = float(sum((g.detach().double().pow(2).sum() for g in grads), torch.zeros((), dtype=torch.float64))
                     .sqrt())
        limit = self.settings.clip_norm
        if limit > 0 and norm > limit:
            for g in grads:
                g.mul_(limit / (norm + 1e-6))
        return norm

    def step_stage(self, stage: int, step: int) -> None:
        """The AdamW update of every copy of `stage` this rank holds, at step `step`'s rate."""
        lr = lr_at(self.settings, step)
        for c, opt in self.opts.items():
            if c[1] == stage:
                for g in opt.param_groups:
                    g["lr"] = lr
                opt.step()

    def step(self, step: int, squares: float | None = None) -> float:
        """Clip by the global norm, then update every stage; the norm before clipping (`squares`
        as in `clip`)."""
        norm = self.clip(squares)
        for stage in sorted({c[1] for c in self.opts}):
            self.step_stage(stage, step)
        return norm

    # checkpoints: flat name -> tensor ---------------------------------------------------
    def _named(self, c: tuple[int, int]) -> list[tuple[str, nn.Parameter]]:
        by_id = {id(p): n for n, p in self.stages[c].named_parameters()}
        return [(by_id[id(p)], p) for g in self.opts[c].param_groups for p in g["params"]]

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """AdamW's state as `optim.<parameter>.<step|exp_avg|exp_avg_sq>` tensors (zeros
        before the first step, so a fresh optimizer has the shapes a checkpoint fills)."""
        out = {}
        for c in sorted(self.opts):
            state = self.opts[c].state
            for name, p in self._named(c):
                st = state.get(p, {})
                out[f"optim.{name}.step"] = st.get("step", torch.zeros((), dtype=torch.float32))
                out[f"optim.{name}.exp_avg"] = st.get("exp_avg", torch.zeros_like(p))
                out[f"optim.{name}.exp_avg_sq"] = st.get("exp_avg_sq", torch.zeros_like(p))
        return out

    def load_state_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        """Restore what `state_tensors` gave (as a checkpoint loaded it)."""
        for c in sorted(self.opts):
            for name, p in self._named(c):
                self.opts[c].state[p] = {k: tensors[f"optim.{name}.{k}"].clone().to(p.device if k != "step"
                                                                                       else "cpu")
                                         for k in ("step", "exp_avg", "exp_avg_sq")}
