"""Pinning ranks to cores: which cores this process may use, and the core of each rank."""
from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from octopipe.config.runtime import RuntimeConfig
from octopipe.errors import ConfigError


def core_ids() -> list[int]:
    """The ids of the cores this process may run on, ascending."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:      # not on Linux
        return list(range(os.cpu_count() or 1))


def available_cores() -> int:
    """Cores this process may run on."""
    return len(core_ids())


def can_pin() -> bool:
    """Whether this platform can pin a process to cores (Linux's os.sched_setaffinity)."""
    return sys.platform.startswith("linux") and hasattr(os, "sched_setaffinity")


def pin_map(n_ranks: int, cores: Sequence[int]) -> tuple[int, ...]:
    """The core of each rank when `n_ranks` ranks are pinned round-robin onto `cores`."""
    return tuple(cores[r % len(cores)] for r in range(n_ranks))


def rank_cores(config: RuntimeConfig, n: int) -> tuple[int, ...] | None:
    """Each of `n` ranks' core under `runtime.pin` (auto | true | false), or None when ranks are
    not pinned; emulated compute never pins (its ranks sleep)."""
    if config.pin == "true" and not can_pin():
        raise ConfigError("runtime.pin=true: this platform cannot pin a process to a core "
                          "(no os.sched_setaffinity); use runtime.pin=auto or false")
    if config.pin == "false" or config.compute != "real" or not can_pin():
        return None
    return pin_map(n, core_ids())
