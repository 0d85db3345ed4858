"""The fixed-placement model's terms: each device's load and memory, linear in the staircase.

`load_d` sums F+I+W of the device's stages on its own kind plus one transfer per crossing
boundary it touches (latency + boundary bytes / link bandwidth; the bytes depend on where the
boundary falls, linearly in z); `memory_d` sums static and in-flight activation bytes.
"""
from __future__ import annotations

from collections.abc import Sequence

from solvers.instance import PartitionInstance
from solvers.staircase import Staircase
from solvers.units import GIB


def add_device_terms(inst: PartitionInstance, stair: Staircase, placement: Sequence[int],
                     tu: float) -> tuple[list, list]:
    """Per device: (load terms, load constant) and (memory terms) for a fixed placement."""
    D = inst.n_devices
    work = inst.costs.f + inst.costs.i + inst.costs.w
    mult = inst.act_mult(placement)
    load = [([], 0.0) for _ in range(D)]
    mem = [[] for _ in range(D)]
    for s, d in enumerate(placement):
        load[d][0].extend(stair.stage_terms(s, work[:, inst.col[d]], 1.0 / tu))
        mem_layer = inst.costs.static_bytes + mult[s] * inst.costs.act_bytes
        mem[d].extend(stair.stage_terms(s, mem_layer, 1.0 / GIB))
    load = [list(x) for x in load]
    for s in range(inst.n_stages - 1):
        a, b = placement[s], placement[s + 1]
        link = inst.cluster.link(a, b)
        if link is None:
            continue
        terms = stair.boundary_terms(s, inst.costs.out_bytes, 1.0 / (link.bandwidth * tu))
        for d in (a, b):
            load[d][0].extend(terms)
            load[d][1] += link.latency / tu
    return load, mem
