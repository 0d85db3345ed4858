"""`mode=inspect`: the model's layers and their costs on the chosen cluster's first device kind.

Reports one row per layer (kind, parameters, F/I/W time, stored activations, parameter +
gradient + optimizer memory, boundary bytes) and totals; `cost_table.csv` (every device kind)
is its artifact.
"""
from __future__ import annotations

import csv
from pathlib import Path

from rich.table import Table

from octopipe.cost.table import CostTable
from octopipe.errors import ConfigError
from octopipe.model.params import layer_params, model_params
from octopipe.model.spec import ModelSpec
from octopipe.model.validate import validate_model
from octopipe.modes.inputs import Inputs
from octopipe.modes.mode_result import Artifact, Result

MB = 1e6


def _fmt_params(n: float | None) -> str:
    if n is None:
        return "n/a"
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f}{unit}"
    return f"{n:.0f}"


def layer_param_counts(model: ModelSpec, costs: CostTable) -> list[int | None]:
    """Parameters per layer: the cost table's, else counted from the layer shapes; None where a
    profile file gave neither (its layers carry labels, not shapes)."""
    if costs.params.any():
        return [int(p) for p in costs.params]
    try:
        validate_model(model)
    except ConfigError:
        return [None] * model.n_layers
    return [layer_params(x) for x in model.layers]


def layer_rows(model: ModelSpec, costs: CostTable, kind: int) -> list[dict]:
    """Per-layer figures on device-kind column `kind`, in summary.json's units."""
    counts = layer_param_counts(model, costs)
    return [{"index": j, "name": x.label, "kind": x.kind.value, "params": counts[j],
             "flops": float(costs.flops[j]) if costs.flops is not None else None,
             "f_s": float(costs.f[j, kind]), "i_s": float(costs.i[j, kind]),
             "w_s": float(costs.w[j, kind]), "act_bytes": float(costs.act_bytes[j]),
             "static_bytes": float(costs.static_bytes[j]), "out_bytes": float(costs.out_bytes[j])}
            for j, x in enumerate(model.layers)]


def write_cost_table_csv(path: Path, model: ModelSpec, costs: CostTable) -> None:
    """Every layer × device kind: the cost table a user can open in a spreadsheet."""
    with Path(path).open("w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(["index", "name", "kind", "device", "params", "flops", "f_s", "i_s", "w_s",
                      "act_bytes", "w_act_bytes", "static_bytes", "out_bytes"])
        counts = layer_param_counts(model, costs)
        for j, x in enumerate(model.layers):
            for c, dev in enumerate(costs.kinds):
                out.writerow([j, x.label, x.kind.value, dev, counts[j] if counts[j] is not None else "",
                              float(costs.flops[j]) if costs.flops is not None else "",
                              costs.f[j, c], costs.i[j, c], costs.w[j, c], costs.act_bytes[j],
                              costs.w_act_bytes[j], costs.static_bytes[j], costs.out_bytes[j]])


def run(inputs: Inputs) -> Result:
    model, cluster, costs = inputs.costed_model, inputs.cluster, inputs.costs
    kind = cluster.device_kind[0]
    device = cluster.kinds[kind]
    rows = layer_rows(model, costs, kind)

    table = Table(title=f"{model.name} on {cluster.name} ({device.name}, per micro-batch of "
                        f"{model.micro_batch_size}×{model.seq_len} tokens)")
    for col in ("#", "layer", "params", "F ms", "I ms", "W ms", "act MB", "static MB"):
        table.add_column(col, justify="left" if col == "layer" else "right")
    for r in rows:
        table.add_row(str(r["index"]), r["name"], _fmt_params(r["params"]),
                      f"{r['f_s'] * 1e3:.3f}", f"{r['i_s'] * 1e3:.3f}", f"{r['w_s'] * 1e3:.3f}",
                      f"{r['act_bytes'] / MB:.1f}", f"{r['static_bytes'] / MB:.1f}")
    f, i, w = (float(a[:, kind].sum()) for a in (costs.f, costs.i, costs.w))
    act, static = float(costs.act_bytes.sum()), float(costs.static_bytes.sum())
    known = all(r["params"] is not None for r in rows)
    params = sum(r["params"] for r in rows) if known else None
    active = model_params(model, active=True) if known else None
    table.add_section()
    table.add_row("", f"total ({model.n_layers} layers)", _fmt_params(params), f"{f * 1e3:.2f}",
                  f"{i * 1e3:.2f}", f"{w * 1e3:.2f}", f"{act / MB:.1f}", f"{static / MB:.1f}")

    flops = float(costs.flops.sum()) if costs.flops is not None and costs.flops.any() else None
    tokens = costs.tokens_per_microbatch or model.tokens_per_microbatch
    per_token = flops / tokens if flops is not None and tokens else None
    line = (f"params {_fmt_params(params)} (active {_fmt_params(active)}); forward "
            f"{'n/a' if per_token is None else f'{per_token / 1e9:.2f}'} GFLOP/token; one "
            f"micro-batch F+I+W {(f + i + w) * 1e3:.1f} ms on one {device.name}; whole "
            f"model static {static / 1e9:.1f} GB + activations {act / 1e9:.2f} GB per "
            f"micro-batch vs {device.memory_bytes / 1e9:.0f} GB per device")
    return Result({
        "model": model.name,
        "cluster": cluster.name,
        "device": device.name,
        "devices": cluster.n_devices,
        "device_kinds": list(costs.kinds),
        "cost_source": inputs.config.cost.source,
        "layers": model.n_layers,
        "layer_kinds": sorted({x.kind.value for x in model.layers}),
        "params_total": params,
        "params_active": active,
        "seq_len": model.seq_len,
        "micro_batch_size": model.micro_batch_size,
        "tokens_per_microbatch": int(tokens),
        "flops_per_token": per_token,
        "flops_per_microbatch": flops,
        "f_total_s": f,
        "i_total_s": i,
        "w_total_s": w,
        "compute_s_per_microbatch": f + i + w,
        "act_bytes_total": act,
        "static_bytes_total": static,
        "device_memory_bytes": device.memory_bytes,
        "layer_table": rows,
    }, (table, line), (Artifact("cost_table.csv", lambda path: write_cost_table_csv(path, model, costs)),))
