"""The scales the ILPs solve in: times in units of the mean stage's work, bytes in GiB.

Both keep the solver's tolerances meaningful whatever the model's size.
"""
from __future__ import annotations

from solvers.instance import PartitionInstance

GIB = float(2 ** 30)


def time_unit(inst: PartitionInstance) -> float:
    """Seconds per ILP time unit: the mean stage's work on the fastest kind."""
    return max(float(inst.work_ps[-1].min()) / inst.n_stages, 1e-12)
