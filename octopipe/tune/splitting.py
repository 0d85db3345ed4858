"""The planner's fourth lever: piece layers heavier than a device's share (cut them into pieces).

No partition can beat its heaviest layer: at 16 or 32 stages an LM head or an MoE layer holds
more than one device's even share of the work, and at 32 stages whole attention and Mamba layers
cap how many chunks a device can hold. `octopipe.model.pieces` defines exact pieces (a
vocabulary-split head, an FFN-width-split MLP, an expert-split MoE, attention split by key/value
heads, Mamba-2 by groups); this module decides how many pieces each heavy layer gets and
supplies the CostTable of the split model, either from the model (analytic costs: exact per
piece) or by dividing a measured row evenly (profile files, whose
per-piece times are not measured: an assumption the plan reports).
"""
from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from octopipe.cost.table import CostTable
from octopipe.model.pieces import choose_counts, piece_map, split_extent, split_model, splittable
from octopipe.model.spec import ModelSpec

MAX_ROW_PIECES = 8


@dataclass(frozen=True)
class LayerSplitter:
    """Which layers may be split, into how many pieces at most, and the costs of a split model."""

    splittable: tuple[bool, ...]
    max_pieces: tuple[int, ...]
    costs_for: Callable[[Mapping[int, int]], CostTable]
    source: str = "model"            # "model": pieces costed exactly; "rows": rows divided evenly

    def counts(self, layer_work: Sequence[float], n_devices: int, max_share: float) -> dict[int, int]:
        """Pieces per heavy layer (empty when no splittable layer exceeds the share)."""
        return choose_counts(layer_work, self.splittable, n_devices, max_share, self.max_pieces)

    def options(self, layer_work: Sequence[float], n_devices: int,
                max_share: float) -> list[dict[int, int]]:
        """Splittings worth comparing: none, and pieces capped at `max_share`, half and a quarter of it
        (distinct ones, fewest pieces first)."""
        out: list[dict[int, int]] = [{}]
        for f in (1.0, 0.5, 0.25):
            c = self.counts(layer_work, n_devices, max_share * f)
            if c not in out:
                out.append(c)
        return out


def model_splitter(model: ModelSpec, costs_of: Callable[[ModelSpec], CostTable]) -> LayerSplitter:
    """Piece `model`'s HEAD, MLP, MoE, attention and Mamba-2 layers; `costs_of` prices the split
    model."""
    ok = tuple(splittable(x) for x in model.layers)
    cap = tuple(split_extent(x) for x in model.layers)
    return LayerSplitter(ok, cap, lambda counts: costs_of(split_model(model, counts)), "model")


def row_splitter(costs: CostTable, may_split: Sequence[bool], fixed: Sequence[float] | None = None,
                max_pieces: Sequence[int] | None = None) -> LayerSplitter:
    """Piece measured rows (at most `MAX_ROW_PIECES` pieces per row, and `max_pieces[i]` where
    the row's layer is known); `fixed[i]` is the share of row i that cannot split (a composite's
    attention part) and stays with its first piece."""
    ok = tuple(bool(x) for x in may_split)
    cap = max_pieces if max_pieces is not None else [MAX_ROW_PIECES] * len(ok)
    return LayerSplitter(ok, tuple(min(MAX_ROW_PIECES, int(c)) if x else 1 for x, c in zip(ok, cap)),
                         lambda counts: split_rows(costs, counts, fixed), "rows")


def split_rows(costs: CostTable, counts: Mapping[int, int],
               fixed: Sequence[float] | None = None) -> CostTable:
    """`costs` with row i divided into `counts[i]` pieces: the first holds the row's fixed share
    (`fixed[i]`, default 0) plus an equal part of the rest, the others an equal part each.

    Times, memory, parameters and FLOPs divide this way; a piece that is not the last sends a
    carry about twice the layer's boundary tensor (an MLP piece passes the residual sum and the
    norm output; a head piece the norm output and two statistics per token), so its out_bytes
    are twice the larger of the row's own and its predecessor's.
    """
    n = costs.n_layers
    idx = piece_map(n, counts)
    k = np.array([int(counts.get(i, 1)) for i in range(n)], dtype=np.float64)[idx]
    fix = np.zeros(n) if fixed is None else np.clip(np.asarray(fixed, dtype=np.float64), 0.0, 1.0)
    starts = np.concatenate([[True], idx[1:] != idx[:-1]])     # the first piece of each row
    last = np.concatenate([starts[1:], [True]])
    share = np.where(starts, fix[idx], 0.0) + (1.0 - fix[idx]) / k
    prev_out = np.concatenate([[0.0], costs.out_bytes[:-1]])
    carry = 2.0 * np.maximum(costs.out_bytes, prev_out)[idx]
    out = np.where(last, costs.out_bytes[idx], carry)
    names = tuple(costs.layer_names[i] if counts.get(i, 1) == 1 else
                  f"{costs.layer_names[i]}[{j}/{counts[i]}]"
                  for i in range(n) for j in range(int(counts.get(i, 1))))

    def div(a: np.ndarray | None) -> np.ndarray | None:
        if a is None:
            return None
        a = np.asarray(a, dtype=np.float64)[idx]
        return a * (share[:, None] if a.ndim == 2 else share)

    return CostTable(names, costs.kinds, div(costs.f), div(costs.i), div(costs.w),
                     div(costs.act_bytes), div(costs.static_bytes), out, div(costs.params),
                     w_act_bytes=div(costs.w_act_bytes), flops=div(costs.flops),
                     tokens_per_microbatch=costs.tokens_per_microbatch, full_b=div(costs.full_b),
                     action_s=costs.action_s)


def map_sizes(sizes: Sequence[int], counts: Mapping[int, int]) -> tuple[int, ...]:
    """Stage sizes over the original layers → the same stages over the split model's layers."""
    out, lo = [], 0
    for n in sizes:
        out.append(sum(int(counts.get(i, 1)) for i in range(lo, lo + int(n))))
        lo += int(n)
    return tuple(out)


def packed_max(work: Sequence[float], n_devices: int) -> float:
    """The busiest device when layers of `work` are packed longest first onto the least-loaded
    device (LPT): about the balance a search with several stages per device reaches (LPT is
    within 4/3 of the best packing)."""
    w = np.sort(np.asarray(work, dtype=np.float64))[::-1]
    if len(w) < n_devices:
        return float("inf")
    load = [(0.0, d) for d in range(n_devices)]
    heapq.heapify(load)
    for x in w:
        t, d = heapq.heappop(load)
        heapq.heappush(load, (t + float(x), d))
    return max(t for t, _ in load)
