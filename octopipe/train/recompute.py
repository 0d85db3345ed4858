"""Which stages of a training run recompute their forward inside their backward (train.recompute)."""
from __future__ import annotations

from octopipe.errors import ConfigError


def check_recompute(mode: str, layout: str) -> None:
    """Refuse train.recompute=plan without a layout to take the levels from (before profiling)."""
    if mode == "plan" and not layout:
        raise ConfigError("train.recompute=plan takes the per-stage levels of a mode=layout run: give "
                          "train.layout=DIR")


def recompute_stages(mode: str, n_stages: int, planned: tuple[bool, ...] | None,
                     layout: str = "") -> tuple[int, ...]:
    """The stages that recompute: none, every one (`full`), or those a layout plans (`plan`:
    `planned[s]` says whether stage s recomputes; `layout` is the train.layout it came from)."""
    if mode == "none":
        return ()
    if mode == "full":
        return tuple(range(n_stages))
    if mode != "plan":
        raise ConfigError(f"train.recompute={mode!r}: choose none, full or plan")
    check_recompute(mode, layout)
    if planned is None:
        raise ConfigError(f"train.recompute=plan: train.layout={layout} gives no per-stage recomputation levels")
    if len(planned) != n_stages:
        raise ConfigError(f"train.recompute=plan: the layout plans {len(planned)} stages, the training plan has "
                          f"{n_stages}")
    return tuple(s for s, on in enumerate(planned) if on)
