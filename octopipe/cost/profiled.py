"""`cost=profiled`: F, I, W and full-backward (B) seconds of each layer measured on this
machine's device (B, one autograd pass, often costs less than I then W).

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
    return time_block(layer, layer_input(model, index, device), batch, device, repeats, warmup, statistic)


def time_block(layer, x_in: torch.Tensor | None, batch: dict, device: torch.device, repeats: int = 5,
               warmup: int = 2, statistic: str = "median") -> dict[str, float]:
    """F, I, W and B seconds of one block in the runtime's form (`layer(x, batch)`) on input
    `x_in` (None for the first block)."""
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
            if params:      # a first block without parameters (a one-hot) has no backward to time
                torch.autograd.grad(out, params, g, allow_unused=True)
        tick()
        out = layer(x, batch)
        tick()
        inputs = ([x] if x is not None else []) + params
        if inputs and out.requires_grad:
            torch.autograd.grad(out, inputs, g, allow_unused=True)
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
    start = index - model.layers[index].piece
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


def profile_device(name: str) -> torch.device:
    """The device `cost.device` names (auto: CUDA where there is one)."""
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
    if cost.tp > 1:
        raise ConfigError(f"cost.tp={cost.tp} with cost=profiled: the profiled F/I/W time whole layers, neither "
                          "split by TP nor with the TP collectives; use cost=analytic for cost.tp > 1, or cost.tp=1")
    cache = cost.cache_dir
    times = time_layers(model, profile_device(cost.device), cost.repeats, cost.warmup, cost.threads,
                        Path(cache) if cache else None, cost.statistic)
    base = analytic_costs(cost, model, cluster)
    k = len(base.kinds)
    for t in times:
        t.setdefault("b", t["i"] + t["w"])         # a cache file of a version that did not time B
    col = {name: np.repeat(np.array([t[name] for t in times])[:, None], k, axis=1) for name in "fiwb"}
    out_bytes = np.array([4.0 * float(np.prod(carry_shape(model, j))) for j in range(model.n_layers)])
    return CostTable(base.layer_names, base.kinds, col["f"], col["i"], col["w"], base.act_bytes,
                     base.static_bytes, out_bytes, base.params, w_act_bytes=base.w_act_bytes,
                     flops=base.flops, tokens_per_microbatch=base.tokens_per_microbatch, full_b=col["b"])


def saved_bytes(layer, x_in: torch.Tensor | None, batch: dict) -> tuple[float, torch.Tensor]:
    """Bytes of the tensors autograd keeps from one forward of `layer` (each storage once, the
    block's input not counted: the stage holds it anyway) and the forward's output."""
    seen: dict[tuple, int] = {}
    x = None if x_in is None else x_in.detach().clone().requires_grad_(True)

    def pack(t: torch.Tensor) -> torch.Tensor:
        if x is None or t.untyped_storage().data_ptr() != x.untyped_storage().data_ptr():
            key = (t.untyped_storage().data_ptr(), t.device.type)
            seen[key] = max(seen.get(key, 0), t.untyped_storage().nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = layer(x, batch)
    return float(sum(seen.values())), out.detach()


def token_batch(blocks, device: torch.device) -> dict[str, torch.Tensor]:
    """One micro-batch of random tokens (seed 0) for a block list: ids and next-token targets."""
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, blocks.vocab, (blocks.micro_batch_size, blocks.seq_len + 1), generator=gen)
    return {"ids": ids[:, :-1].to(device), "targets": ids[:, 1:].to(device)}


def profile_blocks(blocks, cost: ProfiledCost, cluster: Cluster) -> CostTable:
    """The CostTable of a block list (a user's factory, `octopipe.model.user_module`) measured
    here: F, I, W seconds, the bytes autograd keeps per micro-batch, parameter + gradient +
    optimizer bytes (`cost.bytes_per_param` per parameter), the bytes each block hands on, and
    its parameters; one column per device kind of `cluster` (the same times in each).

    Each block runs on its predecessor's real output of one micro-batch of random tokens."""
    device = profile_device(cost.device)
    old = torch.get_num_threads()
    torch.set_num_threads(cost.threads)
    batch = token_batch(blocks, device)
    rows, x = [], None
    try:
        for j in range(blocks.n_blocks):
            layer = blocks.build(j).to(device)
            t = time_block(layer, x, batch, device, cost.repeats, cost.warmup, cost.statistic)
            act, out = saved_bytes(layer, x, batch)
            params = float(sum(p.numel() for p in layer.parameters() if p.requires_grad))
            rows.append((t, act, params, float(out.numel() * out.element_size())))
            x = out
    finally:
        torch.set_num_threads(old)
    kinds = tuple(dict.fromkeys(cluster.kind_of(d).name for d in range(cluster.n_devices)))
    col = {k: np.repeat(np.array([r[0][k] for r in rows])[:, None], len(kinds), axis=1) for k in "fiwb"}
    params = np.array([r[2] for r in rows])
    tokens = blocks.seq_len * blocks.micro_batch_size
    return CostTable(tuple(blocks.names), kinds, col["f"], col["i"], col["w"], np.array([r[1] for r in rows]),
                     params * cost.bytes_per_param, np.array([r[3] for r in rows]), params,
                     flops=2.0 * params * tokens, tokens_per_microbatch=tokens, full_b=col["b"])
