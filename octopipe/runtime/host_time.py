"""The runtime's host seconds per compute action, measured here.

Layers timed alone (`cost=profiled`) show their own seconds; a stage's action in the runtime
costs more: the input detached and marked for its gradient, the forward's output checked and
kept, the split-backward helpers' walk of the graph, the gradients handed to the parameters.
That work comes once per action whatever the stage holds, so it decides between a plan of few
large stages and one of many small ones with split backwards (three actions per micro-batch
and stage instead of two). `action_host_seconds` runs the runtime's own compute path
(`RealCompute`) on stages of one block each, in this process, and returns the median over
blocks and action kinds of an action's seconds less its blocks' profiled ones: the table's
`action_s` (`CostTable`).
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from octopipe.config.cost import ProfiledCost
from octopipe.cost.profiled import profile_device, token_batch
from octopipe.cost.table import CostTable
from octopipe.runtime.compute import RealCompute
from octopipe.runtime.stage import SpecBlocks

MICROBATCHES = 2
ROUNDS = 5
PASSES = (ROUNDS + 1) * MICROBATCHES
"""The measurement's cost in profiler passes (`train.work.profile_seconds`: about 6 forwards'
worth each): per block, ROUNDS + 1 iterations of MICROBATCHES forwards and backwards (about 3
forwards' worth each), once split and once not."""


class FixedBatches:
    """The same batch for every iteration and micro-batch (a user's blocks have no synthetic data)."""

    def __init__(self, batch: dict) -> None:
        self._batch = batch

    def batch(self, iteration: int, mb: int) -> dict:
        return self._batch


def _timed(fn, *args) -> tuple[object, float]:
    """`fn(*args)` and its seconds (a CUDA device's queued kernels included)."""
    t0 = time.perf_counter()
    out = fn(*args)
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
    return out, time.perf_counter() - t0


def _one_iteration(rc: RealCompute, n: int, split: bool, seen: dict[tuple[int, str], list[float]]) -> None:
    """Every stage's F in order, then the backwards in reverse (I then W, or B), per micro-batch."""
    for mb in range(rc.m):
        x = None
        for s in range(n):
            x, dt = _timed(rc.forward, s, mb, x)
            seen.setdefault((s, "f"), []).append(dt)
        g = None
        for s in reversed(range(n)):
            if split:
                g_in, dt = _timed(rc.backward_input, s, mb, g)
                seen.setdefault((s, "i"), []).append(dt)
                _, dt = _timed(rc.backward_weight, s, mb)
                seen.setdefault((s, "w"), []).append(dt)
            else:
                g_in, dt = _timed(rc.backward, s, mb, g)
                seen.setdefault((s, "b"), []).append(dt)
            g = g_in


def action_host_seconds(model, costs: CostTable, device: torch.device, batches=None, rounds: int = ROUNDS,
                        seed: int = 0) -> float:
    """Seconds an action of a one-block stage takes in the runtime beyond the block's profiled
    F, I, W or B (`costs`, column 0): the median over blocks and kinds of the median of `rounds`
    iterations (after one to warm up), never below 0. `model`: a ModelSpec or a block list, as
    `RealCompute` takes it; `batches`: its data (None: the model's synthetic batches)."""
    n = costs.n_layers
    partition = tuple((j, j + 1) for j in range(n))
    profiled = {"f": costs.f[:, 0], "i": costs.i[:, 0], "w": costs.w[:, 0], "b": costs.b[:, 0]}
    seen: dict[tuple[int, str], list[float]] = {}
    for split in (True, False):
        rc = RealCompute(model, partition, tuple((0, s) for s in range(n)), MICROBATCHES, seed, device)
        if batches is not None:
            rc.batches = batches
        rc.metering, rc.check_finite = False, True
        for it in range(rounds + 1):
            rc.start_iteration(it)
            _one_iteration(rc, n, split, seen if it else {})
    excess = [float(np.median(v)) - float(profiled[kind][s]) for (s, kind), v in seen.items()]
    return max(0.0, float(np.median(excess)))


def cache_path(blocks, cost: ProfiledCost) -> Path | None:
    """Where a preset's host time is kept beside its profiled layers (`cost.cache_dir`), so that a
    run on cached costs plans as the last one did; a user's blocks are profiled afresh on every
    run, and so is their host time."""
    if not cost.cache_dir or not isinstance(blocks, SpecBlocks):
        return None
    m = blocks.model
    text = repr((tuple(replace(layer, name="") for layer in m.layers), m.seq_len, m.micro_batch_size, m.vocab,
                 cost.device, cost.threads, cost.statistic, torch.__version__, ROUNDS, MICROBATCHES))
    return Path(cost.cache_dir) / f"host-{hashlib.sha1(text.encode()).hexdigest()[:16]}.json"


def with_host_time(costs: CostTable, blocks, cost: ProfiledCost, seed: int = 0) -> CostTable:
    """`costs` (profiled from `blocks`: a preset's `SpecBlocks` or a user's block list) with the
    runtime's host seconds per action measured here, on `cost`'s device and threads (a preset's
    read from the cache when measured before: `cache_path`)."""
    path = cache_path(blocks, cost)
    if path is not None and path.is_file():
        return replace(costs, action_s=float(json.loads(path.read_text())["action_s"]), _prefix={})
    device = profile_device(cost.device)
    model, batches = (blocks.model, None) if isinstance(blocks, SpecBlocks) else \
        (blocks, FixedBatches(token_batch(blocks, device)))
    old = torch.get_num_threads()
    torch.set_num_threads(cost.threads)
    try:
        h = action_host_seconds(model, costs, device, batches, seed=seed)
    finally:
        torch.set_num_threads(old)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"action_s": h}))
    return replace(costs, action_s=h, _prefix={})
