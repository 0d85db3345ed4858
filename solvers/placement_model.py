"""The joint partition + placement model: which layers form each stage AND which device holds it.

Layer-level formulation (L layers, D devices, S stages, k = S / D stages per device):

- y[j, d] binary: layer j on device d, sum_d y[j, d] = 1. A device's stages are its maximal runs
  of layers; it may hold several non-adjacent runs (interleaved, V-shaped or any map), at most
  k of them (runs: y[0, d] + sum_j recv[j, d] <= k) and at least k layers; a device with fewer
  runs than k splits one at no cost (`cut_runs`), so every device holds exactly k stages;
- send[j, d] >= y[j, d] - y[j+1, d], recv[j, d] >= y[j+1, d] - y[j, d] (continuous): device d
  sends / receives over boundary j; on clusters of several nodes also send_node / recv_node >=
  y[j, d] - (layers j+1 on d's node): the inter-node surcharge;
- load_d = sum_j work[j, kind(d)] y[j, d] + sum_j intra_j (send + recv) + (inter_j - intra_j)
  (send_node + recv_node) <= T, memory_d = sum_j (static_j + inflight_d / k act_j) y[j, d] <=
  capacity_d; minimize T.

Every cost is exact in y (no big-M): the transfer cost of boundary j is a constant, because the
boundary is between two fixed layers. Valid inequalities: one sender and one receiver per
boundary at most (and as many of each), at least 2 - y[0, d] - y[L-1, d] crossings per device,
T >= the largest layer's work. Symmetry: devices of one kind in one node whose memory limits are
alike (or cannot bind below the incumbent's T: fractional-knapsack bound) are used in first-
occurrence order (y[j, d2] <= sum_{i<j} y[i, d1]), and so are identical nodes.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pulp

from octopipe.errors import ConfigError, OctoPipeError
from solvers.instance import Partition, PartitionInstance
from solvers.units import GIB, time_unit


@dataclass(frozen=True)
class PlacementModel:
    """The joint model's per-device expressions and how to read its solution."""

    load_expr: list            # per device: load expression (time units)
    mem_expr: list             # per device: memory expression (GiB)
    solution: Callable[[], tuple[Partition, tuple[int, ...]]]


def stages_per_device(inst: PartitionInstance) -> int:
    S, D = inst.n_stages, inst.n_devices
    if S % D:
        raise ConfigError(f"joint placement needs n_stages ({S}) to be a multiple of the devices "
                          f"({D}): each device holds n_stages/pp stages (chunks)")
    return S // D


def layer_memory(inst: PartitionInstance, d: int, k: int) -> np.ndarray:
    """Bytes layer j costs on device d: static + its share of the activations in flight."""
    return inst.costs.static_bytes + inst.inflight[d] / k * inst.costs.act_bytes


def memory_cannot_bind(inst: PartitionInstance, d: int, k: int,
                       upper_bound: float | None = None) -> bool:
    """Whether device d fits memory in every plan (with objective <= `upper_bound`, if given).

    A device holds at most L - (S - k) layers (every other device needs k), and with T <= UB
    its work on its own kind is at most UB: the larger of the top L - S + k layer memories and
    the fractional knapsack (most bytes per second of work first, up to UB seconds) bounds its
    memory from above.
    """
    mem = layer_memory(inst, d, k)
    most = inst.n_layers - inst.n_stages + k
    bound = float(np.sort(mem)[::-1][:most].sum())
    if upper_bound is not None:
        work = np.diff(inst.work_ps[:, inst.col[d]])
        free = work <= 0
        order = np.argsort(-(mem[~free] / work[~free]))
        w, m = work[~free][order], mem[~free][order]
        budget, fill = upper_bound * (1 + 1e-9), float(mem[free].sum())
        full = np.cumsum(w) <= budget
        fill += float(m[full].sum())
        rest = budget - float(w[full].sum())
        nxt = int(full.sum())
        if nxt < len(w):
            fill += m[nxt] * rest / w[nxt]
        bound = min(bound, fill)
    return bool(bound <= float(inst.cap[d]))


def device_keys(inst: PartitionInstance, k: int, memory_free: Sequence[bool]) -> list[tuple]:
    """Per device, what a permutation must preserve apart from the node: its kind and, unless it
    fits memory in every plan (`memory_free`), its capacity and activation share."""
    return [(inst.col[d], 0.0, 0.0) if memory_free[d]
            else (inst.col[d], float(inst.cap[d]), inst.inflight[d] / k)
            for d in range(inst.n_devices)]


def interchangeable(inst: PartitionInstance, keys: Sequence[tuple]
                    ) -> tuple[list[list[int]], list[list[int]]]:
    """Groups of devices, and of nodes, that any optimal plan may permute.

    Devices of one node with equal `keys` are interchangeable (same kind, same links to every
    other device, same memory limit in effect); so are nodes whose devices' keys are equal as
    multisets. Returns (device groups, node groups), each group sorted, of size >= 2.
    """
    cl = inst.cluster
    by_dev: dict[tuple, list[int]] = {}
    for d in range(inst.n_devices):
        by_dev.setdefault((cl.node[d], keys[d]), []).append(d)
    by_node: dict[tuple, list[int]] = {}
    for n in sorted(set(cl.node)):
        sig = tuple(sorted(keys[d] for d in range(inst.n_devices) if cl.node[d] == n))
        by_node.setdefault(sig, []).append(n)
    return ([g for g in by_dev.values() if len(g) > 1], [g for g in by_node.values() if len(g) > 1])


def build_placement_model(prob: pulp.LpProblem, inst: PartitionInstance,
                          objective: pulp.LpVariable | None,
                          upper_bound: float | None = None) -> PlacementModel:
    """Add the joint model's variables and constraints to `prob` (see the module docstring).

    With `objective` (T) every device's load is at most T and its memory at most its capacity,
    and interchangeable devices and nodes are used in first-occurrence order; `upper_bound`
    (seconds, a known plan's objective) adds T <= UB and lets devices whose memory cannot bind
    below UB be interchanged. Without `objective` (the shortfall model) only the plan structure
    is constrained.
    """
    L, D = inst.n_layers, inst.n_devices
    k = stages_per_device(inst)
    tu = time_unit(inst)
    costs, cl = inst.costs, inst.cluster
    work = (costs.f + costs.i + costs.w) / tu
    y = {(j, d): prob.add_variable(f"y_{j}_{d}", cat=pulp.LpBinary)
         for j in range(L) for d in range(D)}
    for j in range(L):
        prob += pulp.lpSum(y[j, d] for d in range(D)) == 1, f"one_device_{j}"
    nodes = sorted(set(cl.node))
    on = {n: [d for d in range(D) if cl.node[d] == n] for n in nodes}

    def ny(j: int, n: int) -> pulp.LpAffineExpression:
        return pulp.lpSum(y[j, d] for d in on[n])

    out = costs.out_bytes
    intra = [cl.intra_link.transfer_time(float(out[j])) / tu for j in range(L)]
    inter = [cl.inter_link.transfer_time(float(out[j])) / tu for j in range(L)]
    load_terms: list[list] = [[(y[j, d], float(work[j, inst.col[d]])) for j in range(L)]
                              for d in range(D)]
    crossings: list[list] = [[] for _ in range(D)]
    runs: list[list] = [[y[0, d]] for d in range(D)]
    send_at: list[list] = [[] for _ in range(L)]
    recv_at: list[list] = [[] for _ in range(L)]
    for j in range(L - 1):
        for d in range(D):
            send = prob.add_variable(f"send_{j}_{d}", lowBound=0)
            recv = prob.add_variable(f"recv_{j}_{d}", lowBound=0)
            prob += send >= y[j, d] - y[j + 1, d], f"send_{j}_{d}"
            prob += recv >= y[j + 1, d] - y[j, d], f"recv_{j}_{d}"
            load_terms[d] += [(send, intra[j]), (recv, intra[j])]
            crossings[d] += [send, recv]
            send_at[j].append(send)
            recv_at[j].append(recv)
            runs[d].append(recv)
            if len(nodes) > 1:
                # the inter-node link's surcharge when the other side sits on another node
                n, extra = cl.node[d], inter[j] - intra[j]
                xs = prob.add_variable(f"send_node_{j}_{d}", lowBound=0)
                xr = prob.add_variable(f"recv_node_{j}_{d}", lowBound=0)
                prob += xs >= y[j, d] - ny(j + 1, n), f"send_node_{j}_{d}"
                prob += xr >= y[j + 1, d] - ny(j, n), f"recv_node_{j}_{d}"
                if extra < 0:   # a faster inter-node link: the flags must be exact, not just >=
                    prob += xs <= y[j, d], f"send_node_ub_{j}_{d}"
                    prob += xs <= 1 - ny(j + 1, n), f"send_node_ub2_{j}_{d}"
                    prob += xr <= y[j + 1, d], f"recv_node_ub_{j}_{d}"
                    prob += xr <= 1 - ny(j, n), f"recv_node_ub2_{j}_{d}"
                load_terms[d] += [(xs, extra), (xr, extra)]
    for j in range(L - 1):
        # one device sends over boundary j exactly when one receives, and at most one does
        sends = pulp.lpSum(send_at[j])
        prob += sends == pulp.lpSum(recv_at[j]), f"pair_{j}"
        prob += sends <= 1, f"one_send_{j}"
    for d in range(D):
        prob += pulp.lpSum(runs[d]) <= k, f"runs_{d}"
        prob += pulp.lpSum(y[j, d] for j in range(L)) >= k, f"layers_{d}"
        if D > 1:
            # a device that holds neither end of the model both receives and sends
            prob += pulp.lpSum(crossings[d]) >= 2 - y[0, d] - y[L - 1, d], f"crossings_{d}"
    load_expr = [pulp.LpAffineExpression(t) for t in load_terms]
    mem_expr = [pulp.LpAffineExpression([(y[j, d], float(m) / GIB)
                                         for j, m in enumerate(layer_memory(inst, d, k)) if m])
                for d in range(D)]
    used = sorted(set(inst.col))
    largest = float(np.max(np.min(work[:, used], axis=1)))
    if objective is not None:
        prob += objective >= largest, "largest_layer"
        if upper_bound is not None:
            prob += objective <= upper_bound / tu * (1 + 1e-9), "incumbent"
        for d in range(D):
            prob += load_expr[d] <= objective, f"load_{d}"
            prob += mem_expr[d] <= inst.cap[d] / GIB, f"mem_{d}"
        free = [memory_cannot_bind(inst, d, k, upper_bound) for d in range(D)]
    else:
        free = [False] * D
    dev_groups, node_groups = interchangeable(inst, device_keys(inst, k, free))
    _first_occurrence(prob, L, dev_groups, lambda j, d: y[j, d], "order")
    _first_occurrence(prob, L, node_groups, ny, "order_node")

    def solution() -> tuple[Partition, tuple[int, ...]]:
        dev = [int(np.argmax([y[j, d].value() or 0.0 for d in range(D)])) for j in range(L)]
        return cut_runs(dev, k, D)

    return PlacementModel(load_expr, mem_expr, solution)


def _first_occurrence(prob: pulp.LpProblem, n_layers: int, groups, held, name: str) -> None:
    """Symmetry breaking: within each group of interchangeable devices (or nodes), member g+1
    may hold layer j only if member g holds an earlier layer; `held(j, d)` is 1 when d holds j."""
    for g in groups:
        for d1, d2 in zip(g, g[1:]):
            for j in range(n_layers):
                prob += held(j, d2) <= pulp.lpSum(held(i, d1) for i in range(j)), f"{name}_{d2}_{j}"


def cut_runs(device_of_layer: Sequence[int], k: int, n_devices: int
               ) -> tuple[Partition, tuple[int, ...]]:
    """The plan of a layer -> device map with every device holding exactly k stages.

    Each maximal run of layers on one device is a stage; a device with fewer than k runs has
    its longest run halved until it has k (stages on one device back to back cost nothing, so
    loads and memory are unchanged).
    """
    stages: list[list[int]] = []       # [lo, hi, device]
    for j, d in enumerate(device_of_layer):
        if stages and stages[-1][2] == d:
            stages[-1][1] = j + 1
        else:
            stages.append([j, j + 1, d])
    for d in range(n_devices):
        mine = [s for s in stages if s[2] == d]
        if len(mine) > k or sum(hi - lo for lo, hi, _ in mine) < k:
            raise OctoPipeError(f"the joint ILP's solution gives device {d} {len(mine)} runs of "
                                f"layers; it must be able to hold exactly {k} stages")
        while len(mine) < k:
            lo, hi, _ = max(mine, key=lambda s: s[1] - s[0])
            i = next(i for i, s in enumerate(stages) if s[0] == lo)
            mid = (lo + hi) // 2
            stages[i:i + 1] = [[lo, mid, d], [mid, hi, d]]
            mine = [s for s in stages if s[2] == d]
    return tuple((lo, hi) for lo, hi, _ in stages), tuple(d for _, _, d in stages)
