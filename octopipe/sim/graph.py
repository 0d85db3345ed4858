"""A networkx view of a compiled program, for users: export, cycle finding, critical path.

Nodes are compute nodes (`0..n_compute-1`) and transfers (`n_compute + t`). Edges carry a
`type`: ``data`` (same-device data dependency, producer → transfer, transfer → consumer),
``device`` (consecutive compute cells of a row) and ``link`` (consecutive transfers on one link
direction, in the order the sending row posts them). The engine never goes through this graph.
For a compute-only table under strict + eager, the longest path (node weights = durations) is
the simulated makespan: each node starts when its last in-edge's source ends.
"""
from __future__ import annotations

import networkx as nx

from octopipe.sim.durations import Durations
from octopipe.sim.program import CELL_COMPUTE, CELL_SEND, KIND_OF_CODE, Program


def to_networkx(program: Program, durations: Durations | None = None) -> nx.DiGraph:
    """The program as a DiGraph (node attrs: label, kind, device/src/dst, duration_s)."""
    P = program
    n_c = P.n_compute
    g = nx.DiGraph(name=P.table.name)
    for c in range(n_c):
        g.add_node(c, label=str(P.action(c)), kind=KIND_OF_CODE[int(P.c_kind[c])].value,
                   device=int(P.c_dev[c]), stage=int(P.c_stage[c]), microbatch=int(P.c_mb[c]),
                   duration_s=float(durations.compute[c]) if durations is not None else 1.0)
    for t in range(P.n_transfers):
        g.add_node(n_c + t, label=P.transfer_label(t), kind="transfer", src=int(P.t_src[t]),
                   dst=int(P.t_dst[t]), duration_s=float(durations.transfer[t]) if durations is not None else 0.0)
        g.add_edge(int(P.t_producer[t]), n_c + t, type="data")
        g.add_edge(n_c + t, int(P.t_consumer[t]), type="data")
    for c in range(n_c):
        for k in range(P.lp_ptr[c], P.lp_ptr[c + 1]):
            g.add_edge(int(P.lp_idx[k]), c, type="data")
    last_on_link: dict[int, int] = {}
    for d in range(P.n_devices):
        prev = -1
        for ty, x in zip(P.row_type[d].tolist(), P.row_id[d].tolist()):
            if ty == CELL_COMPUTE:
                if prev >= 0:
                    g.add_edge(prev, x, type="device")
                prev = x
            elif ty == CELL_SEND:
                lk = int(P.t_link[x])
                if lk in last_on_link:
                    g.add_edge(n_c + last_on_link[lk], n_c + x, type="link")
                last_on_link[lk] = x
    return g


def find_cycle(program: Program) -> list[str] | None:
    """Labels of a cycle of data/device/link edges (a table no semantics can run), or None."""
    g = to_networkx(program)
    try:
        edges = nx.find_cycle(g)
    except nx.NetworkXNoCycle:
        return None
    return [g.nodes[u]["label"] for u, _ in edges]


def critical_path(program: Program, durations: Durations) -> tuple[float, list[str]]:
    """Length (seconds) and labels of the longest duration-weighted path of the graph."""
    g = to_networkx(program, durations)
    order = list(nx.topological_sort(g))
    finish = {}
    best_pred: dict[int, int | None] = {}
    for v in order:
        preds = list(g.predecessors(v))
        start, arg = 0.0, None
        for u in preds:
            if finish[u] > start or (arg is None and finish[u] >= start):
                start, arg = finish[u], u
        finish[v] = start + g.nodes[v]["duration_s"]
        best_pred[v] = arg
    if not finish:
        return 0.0, []
    v = max(finish, key=finish.get)
    length = finish[v]
    path = []
    while v is not None:
        path.append(g.nodes[v]["label"])
        v = best_pred[v]
    return float(length), path[::-1]


def write_graphml(program: Program, path, durations: Durations | None = None) -> None:
    nx.write_graphml(to_networkx(program, durations), str(path))


__all__ = ["critical_path", "find_cycle", "to_networkx", "write_graphml"]
