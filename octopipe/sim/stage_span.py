"""Zero-bubble's bubble rate: idle time inside the longest stage's own span, not the makespan.

Qi et al. 2024 score a schedule by its cost, the largest time any device spends from its own
first start to its own last end, and report the bubble rate (cost - m(T_F + T_B + T_W)) / cost.
Warm-up time before a device's first action does not count, so with one stage per device a
schedule can reach almost zero here while its makespan still pays (p - 1)(T_F + link).
"""
from __future__ import annotations

import numpy as np

from octopipe.sim.sim_result import SimResult


def stage_spans(sim: SimResult) -> np.ndarray:
    """[device] seconds from the device's first compute start to its last compute end."""
    dev = sim.program.c_dev
    spans = np.zeros(sim.n_devices)
    for d in range(sim.n_devices):
        ids = np.flatnonzero(dev == d)
        if len(ids):
            spans[d] = sim.end[ids].max() - sim.start[ids].min()
    return spans


def span_bubble_rate(sim: SimResult) -> float:
    """(cost - work) / cost with cost the largest stage span and work the busiest device's
    compute seconds (m(T_F + T_B + T_W) on identical stages)."""
    cost = float(stage_spans(sim).max())
    return 0.0 if cost <= 0 else float(1.0 - sim.busy.max() / cost)
