"""Checkpoints of a tensor-parallel run: whole tensors under the model's names, as any other run
writes them, so that a checkpoint resumes on another tp (or none).

A TP rank holds slices of the split parameters (and AdamW moments of the same slices). Saving,
the ranks of a TP group all-gather their slices with the flat positions each covers and put every
tensor back together (`runtime.tensor_parallel.assemble`); each writes the same whole tensors,
which torch's checkpoint writer stores once. Loading, a rank reads the whole tensors and keeps its
positions.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from octopipe.runtime.hf_tensor_parallel import HFTPBlocks
from octopipe.runtime.tensor_parallel import assemble, slice_map

Where = dict[str, tuple[str, tuple[int, ...], torch.Tensor]]


def where(worker, names) -> Where:
    """Stage parameter name -> (the model's name, the whole shape, the flat positions held)."""
    stages = [mod for c, mod in sorted(worker.compute.copies.items()) if c[0] == 0]
    if isinstance(worker.blocks, HFTPBlocks):
        return worker.blocks.slice_map(stages, names)
    return {n: (names(w), shape, pos) for n, (w, shape, pos) in
            slice_map(stages, worker.blocks, worker.job.seed).items()}


def _split_key(key: str) -> tuple[str, str, str]:
    """`model.<stage name>` or `optim.<stage name>.<state>` -> (kind, stage name, state)."""
    kind, _, rest = key.partition(".")
    if kind == "model":
        return kind, rest, ""
    name, _, state = rest.rpartition(".")
    return kind, name, state


def _whole_key(key: str, at: Where) -> str:
    kind, name, state = _split_key(key)
    return f"{kind}.{at[name][0]}" + (f".{state}" if state else "")


def whole_tensors(worker, local: dict[str, torch.Tensor], names) -> dict[str, torch.Tensor]:
    """Collective over the TP group: `local` (keys under stage names) as whole tensors under the
    model's names; scalars (AdamW's step) as they are."""
    at = where(worker, names)
    mine, out = {}, {}
    for key, t in local.items():
        name = _split_key(key)[1]
        if t.dim() == 0:
            out[_whole_key(key, at)] = t
            continue
        _, shape, pos = at[name]
        mine[_whole_key(key, at)] = (shape, pos, t.detach().cpu().reshape(-1).clone())
    gathered: list = [None] * dist.get_world_size(worker.tp_group)
    dist.all_gather_object(gathered, mine, group=worker.tp_group)
    out.update(assemble(gathered))
    return out


def template(worker, local: dict[str, torch.Tensor], names) -> dict[str, torch.Tensor]:
    """Tensors of the whole shapes `whole_tensors` writes (what a checkpoint load fills)."""
    at = where(worker, names)
    return {_whole_key(k, at): (t.clone() if t.dim() == 0 else torch.zeros(at[_split_key(k)[1]][1], dtype=t.dtype))
            for k, t in local.items()}


def take(worker, local: dict[str, torch.Tensor], loaded: dict[str, torch.Tensor], names) -> dict[str, torch.Tensor]:
    """This rank's slice of each loaded whole tensor, under `local`'s keys and shapes."""
    at = where(worker, names)
    out = {}
    for k, t in local.items():
        whole = loaded[_whole_key(k, at)]
        out[k] = whole.clone() if t.dim() == 0 else whole.reshape(-1)[at[_split_key(k)[1]][2]].view_as(t).clone()
    return out
