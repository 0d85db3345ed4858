"""Checkpoints through torch.distributed.checkpoint, written atomically.

Every rank saves its stages' parameters (`model.<name>`) and AdamW state (`optim.<name>.*`)
into `<dir>/step_<N>.tmp`; after all have written, rank 0 adds `octopipe.json` (the step and
the fingerprints of the model and the plan) and `plan.json` (the plan it trains, which a resumed
run follows) and renames the directory to `<dir>/step_<N>`, so a
checkpoint directory without the `.tmp` suffix is always complete. Resuming checks the
fingerprints first: a checkpoint of another model or another plan is refused by name.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from octopipe.errors import ConfigError

META = "octopipe.json"


def fingerprint(doc) -> str:
    """A short stable hash of a JSON-able description."""
    return hashlib.sha1(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()[:16]


def step_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"step_{step:06d}"


def save(root: str | Path, step: int, tensors: dict[str, torch.Tensor], meta: dict,
         files: dict[str, str] | None = None) -> Path:
    """Collective: every rank calls it with its own tensors; rank 0 adds `files` (name -> text,
    the plan's JSON) and the metadata. Returns the final directory."""
    final = step_dir(root, step)
    tmp = final.with_name(final.name + ".tmp")
    rank = dist.get_rank()
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    dist.barrier()
    dcp.save({k: v.detach().cpu() for k, v in tensors.items()}, checkpoint_id=str(tmp))
    dist.barrier()
    if rank == 0:
        for name, text in (files or {}).items():
            (tmp / name).write_text(text)
        (tmp / META).write_text(json.dumps({**meta, "step": step}, indent=1, sort_keys=True))
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    dist.barrier()
    return final


def read_meta(path: str | Path) -> dict:
    """The metadata of checkpoint `path`; ConfigError if it is not a complete checkpoint."""
    p = Path(path)
    if not (p / META).is_file() or not (p / ".metadata").is_file():
        raise ConfigError(f"train.resume={path}: not a complete OctoPipe checkpoint (no {META} "
                          f"and .metadata there)")
    return json.loads((p / META).read_text())


def check_meta(path: str | Path, meta: dict, want: dict) -> int:
    """The checkpoint's step, after its model and plan fingerprints matched `want`'s."""
    for what in ("model", "plan"):
        if meta.get(what) != want.get(what):
            raise ConfigError(f"train.resume={path}: the checkpoint is of another {what} "
                              f"({meta.get(what + '_name', '?')}, fingerprint {meta.get(what)}; "
                              f"this run: {want.get(what + '_name', '?')}, {want.get(what)})")
    return int(meta["step"])


def load(path: str | Path, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Collective: fill `tensors` (this rank's names, preallocated) from checkpoint `path`."""
    state = {k: v.detach().cpu().clone() for k, v in tensors.items()}
    dcp.load(state, checkpoint_id=str(path))
    return state
