"""Pinning ranks to cores: which cores this process may use, and the core of each rank."""
from __future__ import annotations

import os
import sys
from collections.abc import Sequence


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
