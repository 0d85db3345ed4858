"""Progress of a Hydra multirun (`experiment=suite`, `suite_large`): one line per job with its
overrides, the jobs done of all, the time spent and an estimate of the time left.

A Hydra callback (`hydra.callbacks.progress._target_` in the experiment preset). Each job draws
its own live tuner bar, so the sweep reports between jobs with a line instead of a second bar.
"""
from __future__ import annotations

import math
import time
from collections.abc import Iterable
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf
from rich.console import Console


def sweep_size(params: dict[str, str], task_overrides: Iterable[str]) -> int:
    """Jobs of a basic-sweeper multirun: the product of the value counts of every swept key
    (`hydra.sweeper.params`, with command-line overrides replacing a key's values)."""
    choices = {str(k): f"{k}={v}" for k, v in params.items()}
    for arg in task_overrides:
        key = str(arg).split("=", 1)[0].lstrip("+~")
        choices[key] = str(arg)
    parsed = OverridesParser.create().parse_overrides(list(choices.values()))
    counts = [len(list(o.sweep_string_iterator())) if o.is_sweep_override() else 1 for o in parsed]
    return math.prod(counts)


def clock(seconds: float) -> str:
    """'1:02:03' or '2:03'."""
    s = int(round(max(0.0, seconds)))
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class SweepProgress(Callback):
    """Prints `[sweep] job k/N (overrides) · elapsed · ~left` as each job starts."""

    def __init__(self, console: Any = None) -> None:
        self.console = console if console is not None else Console()
        self.total = 0
        self.started = 0
        self.t0 = 0.0

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        swept = OmegaConf.select(config, "hydra.sweeper.params")
        params = OmegaConf.to_container(swept, resolve=False) if swept is not None else {}
        self.total = sweep_size(params, config.hydra.overrides.task)
        self.started, self.t0 = 0, time.perf_counter()
        self.console.print(f"[bold]sweep[/]: {self.total} jobs", soft_wrap=True)

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        if not self.total:
            return
        elapsed = time.perf_counter() - self.t0
        left = f" · ~{clock(elapsed / self.started * (self.total - self.started))} left" \
            if self.started else ""
        self.started += 1
        label = " ".join(config.hydra.overrides.task) or "defaults"
        self.console.print(f"[bold]sweep[/] job {self.started}/{self.total} ({label}) · "
                           f"{clock(elapsed)} elapsed{left}", soft_wrap=True)


__all__ = ["SweepProgress", "clock", "sweep_size"]
