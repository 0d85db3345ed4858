"""Exported files read by the stacks' own code, where it is installed: torch's CSV parser,
`_validate_schedule` and `_add_send_recv`; Megatron's `PipelineParallelLayerLayout`; torchtitan's
`ParallelismConfig` and `TrainingConfig`. Each check returns what the stack said ("accepted", or
"not installed") and raises AssertionError or the stack's own error when it refuses."""
from __future__ import annotations

import csv
import io
import json
import warnings

import tomllib

from octopipe.interop.targets import placement_of


def torch_accepts(csv_text: str, stage_to_rank: list[int], n_microbatches: int) -> str:
    """torch parses every cell, validates the table (its stage → rank map must be ours) and lowers
    it with send/recv without stalling."""
    from torch.distributed.pipelining.schedules import (  # torch: heavy, only here
        _Action,
        _add_send_recv,
        _validate_schedule,
    )
    rows = list(csv.reader(io.StringIO(csv_text)))
    actions = {r: [_Action.from_str(c) if c else None for c in row] for r, row in enumerate(rows)}
    n_stages = len(stage_to_rank)
    mapping = _validate_schedule(actions, len(rows), n_stages, n_microbatches)
    assert [mapping[s] for s in range(n_stages)] == list(stage_to_rank), (mapping, stage_to_rank)
    compute = {r: [a for a in row if a is not None] for r, row in actions.items()}
    _add_send_recv(compute, lambda s: stage_to_rank[s], n_stages)
    return "accepted"


def megatron_accepts(doc: dict) -> str:
    """Megatron's layout class builds and validates the exported layout (hybrid patterns with
    stage bounds need megatron-core >= 0.17, which needs Python >= 3.12: not checked here)."""
    if "pipeline_model_parallel_layout" not in doc:
        return "not checked (hybrid pattern: megatron-core >= 0.17)"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from megatron.core.transformer.pipeline_parallel_layer_layout import (  # megatron: optional
                PipelineParallelLayerLayout,
            )
    except ImportError:
        return "not installed"
    layout = PipelineParallelLayerLayout(doc["pipeline_model_parallel_layout"], doc["pipeline_model_parallel_size"])
    layout.validate_layer_layout(num_layers=doc["num_layers"], mtp_num_layers=0)
    assert layout.virtual_pipeline_model_parallel_size == doc["virtual_stages_per_rank"]
    return "accepted"


def torchtitan_accepts(doc: dict, toml_text: str) -> str:
    """torchtitan's config dataclasses take the exported fields, and the TOML fragment holds them."""
    try:
        from torchtitan.config.configs import ParallelismConfig, TrainingConfig  # torchtitan: optional
    except ImportError:
        return "not installed"
    par = ParallelismConfig(**doc["parallelism"])
    train = TrainingConfig(**doc["training"])
    assert train.local_batch_size // par.pipeline_parallel_microbatch_size == doc["num_pp_microbatches"]
    assert len(par.module_fqns_per_model_part) % par.pipeline_parallel_degree == 0
    assert tomllib.loads(toml_text) == {"parallelism": doc["parallelism"], "training": doc["training"]}
    return "accepted"


def deepspeed_accepts(doc: dict, snippet: str, n_units: int) -> str:
    """DeepSpeed is not installed here: the parts are checked as `_set_bounds` reads them
    (increasing, from 0 to the layer count, stages + 1 of them) and the subclass compiles."""
    parts = doc["parts"]
    assert parts[0] == 0 and parts[-1] == n_units and len(parts) == doc["num_stages"] + 1
    assert all(b > a for a, b in zip(parts, parts[1:]))
    compile(snippet, "deepspeed_parts.py", "exec")
    return "parts well-formed (DeepSpeed not installed)"


def stack_accepts(target: str, files: dict[str, str], n_microbatches: int, n_units: int) -> str:
    """What the target's own code says of its exported files."""
    if target == "torch":
        doc = json.loads(files["torch.json"])
        return torch_accepts(files["torch_schedule.csv"], doc["stage_to_rank"], n_microbatches)
    if target == "torchtitan":
        doc = json.loads(files["torchtitan.json"])
        torch_accepts(files["torchtitan_schedule.csv"], torchtitan_stage_map(doc), n_microbatches)
        return torchtitan_accepts(doc, files["torchtitan.toml"])
    if target == "megatron":
        return megatron_accepts(json.loads(files["megatron.json"]))
    return deepspeed_accepts(json.loads(files["deepspeed.json"]), files["deepspeed_parts.py"], n_units)


def torchtitan_stage_map(doc: dict) -> list[int]:
    """Stage → rank as torchtitan builds its stages (`_get_pp_rank_to_stage_indices_mapping`):
    V for ZBVZeroBubble and DualPipeV, loop otherwise; the CSV must agree with it."""
    pp = doc["pipeline_parallel_degree"]
    chunks = len(doc["module_fqns_per_model_part"]) // pp
    style = "v" if doc["pipeline_parallel_schedule"] in ("ZBVZeroBubble", "DualPipeV") else "loop"
    return list(placement_of(style, pp, chunks))
