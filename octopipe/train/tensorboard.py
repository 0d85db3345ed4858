"""TensorBoard scalars of a training run (`train.tensorboard=true`), under `<run dir>/tensorboard`
as torchtitan and Megatron write them: loss, learning rate, gradient norm, tokens/s, step time
and each rank's idle share, one point per step. Needs the `tensorboard` package."""
from __future__ import annotations

from pathlib import Path

from octopipe.errors import ConfigError


def check_available() -> None:
    """ConfigError (one line) when the tensorboard package is missing."""
    try:
        import tensorboard  # noqa: F401  (the optional package SummaryWriter needs)
    except ImportError:
        raise ConfigError("train.tensorboard=true needs the tensorboard package: pip install tensorboard, "
                          "or set train.tensorboard=false") from None


class ScalarLog:
    """A SummaryWriter fed with the progress records rank 0 writes."""

    def __init__(self, directory: Path) -> None:
        check_available()
        from torch.utils.tensorboard import SummaryWriter  # needs the optional tensorboard package
        self.writer = SummaryWriter(log_dir=str(directory))

    def step(self, r: dict) -> None:
        k = int(r["step"])
        for key in ("loss", "lr", "grad_norm", "tokens_per_s", "step_s"):
            self.writer.add_scalar(f"train/{key}", float(r[key]), k)
        for rank, share in enumerate(r.get("idle_share", [])):
            self.writer.add_scalar(f"idle_share/rank{rank}", float(share), k)

    def close(self) -> None:
        self.writer.close()
