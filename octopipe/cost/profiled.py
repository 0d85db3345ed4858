"""`cost=profiled`: F, I and W seconds of each layer measured on this machine's device.

Each distinct layer (kind, shape, the shape it receives, sequence, micro-batch size, device,
threads, torch version; each piece of a split layer is a layer of its own) is timed once with
its real module (`octopipe.layers`), the same way the runtime runs it: F is the forward, I the input
gradient with the graph kept, W the parameter gradients from what I kept; the median (or
`statistic`) of `repeats` runs after `warmup` is cached as JSON under `cache_dir`, so the
planner can plan for the machine it runs on without re-measuring. Memory, parameter and FLOP
columns come from the analytic model; message sizes are the runtime's real fp32 activations.
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight

from octopipe.cluster import Cluster
from octopipe.config.convert import convert, to_plain
from octopipe.config.cost import ProfiledCost
from octopipe.cost.analytic import analytic_costs
from octopipe.cost.table import CostTable
from octopipe.errors import ConfigError
from octopipe.layers import build_layer, carry_shape
from octopipe.layers.batch import microbatch
from octopipe.model.spec import ModelSpec

STATISTICS = {"median": 50, "q25": 25, "min": 0}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_layer(model: ModelSpec, index: int, device: torch.device, repeats: int = 5,
                  warmup: int = 2, statistic: str = "median") -> dict[str, float]:
    """F, I, W (and full B) seconds of layer `index` for one micro-batch on `device`, run as the
    runtime runs them; `statistic` (median, q25, min) of `repeats` runs."""
    layer = build_layer(model, index).to(device)
    batch = {k: v.to(device) for k, v in microbatch(model, 0, 0, 0).items()}
    x_in = layer_input(model, index, device)
    params = [p for p in layer.parameters() if p.requires_grad]
    samples: dict[str, list[float]] = {"f": [], "i": [], "w": [], "b": []}
    for r in range(warmup + repeats):
        x = None if x_in is None else x_in.detach().clone().requires_grad_(True)
        clock = [time.perf_counter()]

        def tick() -> None:
            _sync(device)
            clock.append(time.perf_counter())

        out = layer(x, batch)
        out = out.clone() if out._is_view() else out
        tick()
        g = torch.ones_like(out)
        if x is not None:
            _, groups = stage_backward_input([out], [g], [x], iter(params))
            tick()
            stage_backward_weight(iter(params), groups)
        else:
            tick()
            torch.autograd.grad(out, params, g, allow_unused=True)
        tick()
        out = layer(x, batch)
        tick()
        torch.autograd.grad(out, ([x] if x is not None else []) + params, g, allow_unused=True)
        tick()
        if r >= warmup:
            c = clock
            for k, v in zip("fiwb", (c[1] - c[0], c[2] - c[1], c[3] - c[2], c[5] - c[4])):
                samples[k].append(v)
    return {k: float(np.percentile(v, STATISTICS[statistic])) for k, v in samples.items()}


def layer_input(model: ModelSpec, index: int, device: torch.device) -> torch.Tensor | None:
    """What layer `index` is timed on: random activations of its input shape (None for the
    first layer), except that a piece after the first of a split layer gets the carry its
    preceding pieces compute from such activations (an MoE piece must see top-k gates, whose
    zeros decide the tokens its experts run on, not noise)."""
    start = index - model.layers[index].shard
    gen = torch.Generator().manual_seed(index)
    x = torch.randn(carry_shape(model, start - 1), generator=gen) if start > 0 else None
    if start < index:
        batch = microbatch(model, 0, 0, 0)
        with torch.no_grad():
            for j in range(start, index):
                x = build_layer(model, j)(x, batch)
    return None if x is None else x.to(device)


def _key(model: ModelSpec, index: int, device: str, threads: int, statistic: str) -> str:
    """The layer's shape (its spec without the name, the shape it receives) and the conditions."""
    spec = replace(model.layers[index], name="")
    shape_in = carry_shape(model, index - 1) if index else None
    text = repr((spec, shape_in, model.seq_len, model.micro_batch_size,
                 model.vocab, device, threads, statistic, torch.__version__))
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"cost.device={name}: no CUDA device here; use cpu or auto")
    if name != "cpu" and not name.startswith("cuda"):
        raise ConfigError(f"cost.device={name!r}: choose auto, cpu or cuda")
    return torch.device(name)


def time_layers(model: ModelSpec, device: torch.device, repeats: int = 5, warmup: int = 2,
                threads: int = 1, cache_dir: Path | None = None,
                statistic: str = "median") -> list[dict[str, float]]:
    """Per-layer timings, each distinct layer measured once (and cached when `cache_dir`)."""
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out, seen = [], {}
        for j in range(model.n_layers):
            key = _key(model, j, str(device), threads, statistic)
            path = cache_dir / f"{key}.json" if cache_dir is not None else None
            if key not in seen:
                if path is not None and path.exists():
                    seen[key] = json.loads(path.read_text())
                else:
                    seen[key] = measure_layer(model, j, device, repeats, warmup, statistic)
                    if path is not None:
                        path.parent.mkdir(parents=True, exist_ok=True)
                        path.write_text(json.dumps(seen[key]))
            out.append(seen[key])
        return out
    finally:
        torch.set_num_threads(old)


def profiled_costs(cost: ProfiledCost, model: ModelSpec, cluster: Cluster) -> CostTable:
    """The CostTable of `model` with F, I, W measured on the local device for every kind of
    `cluster` (one machine measures one device: every column gets the same times). A raw
    mapping (a preset file read directly) goes through the schema first."""
    if not isinstance(cost, ProfiledCost):
        cost = convert(ProfiledCost, {**to_plain(cost), "source": "profiled"}, "cost.")
    cache = cost.cache_dir
    times = time_layers(model, _device(cost.device), cost.repeats, cost.warmup, cost.threads,
                        Path(cache) if cache else None, cost.statistic)
    base = analytic_costs(cost, model, cluster)
    k = len(base.kinds)
    col = {name: np.repeat(np.array([t[name] for t in times])[:, None], k, axis=1) for name in "fiw"}
    out_bytes = np.array([4.0 * float(np.prod(carry_shape(model, j))) for j in range(model.n_layers)])
    return CostTable(base.layer_names, base.kinds, col["f"], col["i"], col["w"], base.act_bytes,
                     base.static_bytes, out_bytes, base.params, w_act_bytes=base.w_act_bytes,
                     flops=base.flops, tokens_per_microbatch=base.tokens_per_microbatch)
