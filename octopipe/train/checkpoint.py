"""Checkpoints through torch.distributed.checkpoint, written atomically and verified at load.

Every rank saves its stages' parameters (`model.<name>`) and AdamW state (`optim.<name>.*`)
into `<dir>/step_<N>.tmp`; after all have written, rank 0 adds `plan.json` (the plan it trains,
which a resumed run follows) and `octopipe.json`: the step, the fingerprints of the model and
the plan, and a manifest with the size and SHA-256 of every other file, itself sealed by a
checksum of its own text. Every file is flushed to disk before rank 0 renames the directory
to `<dir>/step_<N>`, so a directory without the `.tmp` suffix is complete. `verify` checks the
manifest before any rank starts: a truncated, missing, extra, swapped or edited file is one
line naming it. A step that exists already is never replaced.
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
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from octopipe.errors import ConfigError

META = "octopipe.json"
SEAL = "meta_sha256"
_CHUNK = 1 << 20


def fingerprint(doc) -> str:
    """A short stable hash of a JSON-able description."""
    return hashlib.sha1(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()[:16]


def step_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"step_{step:06d}"


def file_digest(path: Path) -> dict:
    """{'bytes', 'sha256'} of one file, read in chunks."""
    h, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
            size += len(chunk)
    return {"bytes": size, "sha256": h.hexdigest()}


def manifest(directory: Path) -> dict[str, dict]:
    """Name -> digest of every file of a checkpoint directory but its metadata file."""
    return {p.name: file_digest(p) for p in sorted(Path(directory).iterdir()) if p.name != META}


def _seal_of(doc: dict) -> str:
    body = {k: v for k, v in doc.items() if k != SEAL}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def meta_text(meta: dict) -> str:
    """The metadata file's text: `meta` with its own checksum."""
    return json.dumps({**meta, SEAL: _seal_of(meta)}, indent=1, sort_keys=True)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save(root: str | Path, step: int, tensors: dict[str, torch.Tensor], meta: dict,
         files: dict[str, str] | None = None) -> Path:
    """Collective: every rank calls it with its own tensors; rank 0 adds `files` (name -> text,
    the plan's JSON) and the metadata with the manifest. Returns the final directory."""
    final = step_dir(root, step)
    tmp = final.with_name(final.name + ".tmp")
    rank = dist.get_rank()
    if rank == 0:
        if final.exists():
            raise ConfigError(f"train.checkpoint_dir={root}: {final.name} exists already and is never "
                              f"replaced; give another train.checkpoint_dir")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    dist.barrier()
    dcp.save({k: v.detach().cpu() for k, v in tensors.items()}, checkpoint_id=str(tmp))
    dist.barrier()
    if rank == 0:
        for name, text in (files or {}).items():
            (tmp / name).write_text(text)
        (tmp / META).write_text(meta_text({**meta, "step": step, "files": manifest(tmp)}))
        for p in tmp.iterdir():
            _fsync(p)
        os.replace(tmp, final)
        _fsync(final.parent)
    dist.barrier()
    return final


class _Damaged(Exception):
    """What is wrong with a checkpoint's files (read_meta names the field and the fix)."""


def _read_meta_doc(p: Path) -> dict:
    try:
        doc = json.loads((p / META).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _Damaged(f"{META} cannot be read as JSON ({type(e).__name__})") from None
    if not isinstance(doc, dict):
        raise _Damaged(f"{META} holds no object")
    return doc


def _check_fields(p: Path, doc: dict) -> None:
    step = doc.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or step < 1:
        raise _Damaged(f"{META} gives step {step!r} (a positive whole number expected)")
    for key in ("model", "plan"):
        if not isinstance(doc.get(key), str):
            raise _Damaged(f"{META} lacks the {key} fingerprint")


def _check_files(p: Path, listed: dict) -> None:
    if not isinstance(listed, dict) or not listed:
        raise _Damaged(f"{META}'s manifest is empty")
    present = {q.name for q in p.iterdir() if q.name != META}
    extra = sorted(present - set(listed))
    if extra:
        raise _Damaged(f"{extra[0]} is not in the manifest")
    for name, want in sorted(listed.items()):
        q = p / name
        if not q.is_file():
            raise _Damaged(f"{name} is missing")
        got = file_digest(q)
        if not isinstance(want, dict) or got["bytes"] != want.get("bytes"):
            raise _Damaged(f"{name} has {got['bytes']} bytes, the manifest says "
                              f"{want.get('bytes') if isinstance(want, dict) else '?'}")
        if got["sha256"] != want.get("sha256"):
            raise _Damaged(f"{name}'s contents do not match its checksum")


def _verified(p: Path) -> dict:
    doc = _read_meta_doc(p)
    _check_fields(p, doc)
    if SEAL not in doc and "files" not in doc:
        return {**doc, "verified": False}
    if doc.get(SEAL) != _seal_of(doc):
        raise _Damaged(f"{META} was edited (its checksum does not match its contents)")
    _check_files(p, doc.get("files"))
    return {**doc, "verified": True}


def read_meta(path: str | Path, what: str = "train.resume") -> dict:
    """The metadata of checkpoint `path` once its files are verified against its manifest (a
    checkpoint written before manifests has `verified` False); ConfigError, one line naming
    `what` (the field that gave the path) and the file, for a directory that is not a complete,
    intact checkpoint."""
    p = Path(path)
    if p.name.endswith(".tmp"):
        raise ConfigError(f"{what}={path}: an unfinished checkpoint (its save was interrupted); "
                          f"use a complete step_N")
    if not p.is_dir():
        raise ConfigError(f"{what}={path}: no such checkpoint directory")
    if not (p / META).is_file() or not (p / ".metadata").is_file():
        raise ConfigError(f"{what}={path}: not a complete OctoPipe checkpoint (no {META} "
                          f"and .metadata there)")
    try:
        return _verified(p)
    except _Damaged as e:
        raise ConfigError(f"{what}={path}: the checkpoint is damaged: {e}; use an intact checkpoint (an "
                          f"earlier step_N)") from None


def _differences(meta: dict, want: dict, what: str) -> str:
    """What differs between the checkpoint's and this run's description of the model or plan."""
    a, b = meta.get(f"{what}_desc"), want.get(f"{what}_desc")
    if isinstance(a, dict) and isinstance(b, dict):
        diff = [f"{k} {a.get(k)!r} (this run: {b.get(k)!r})" for k in sorted(set(a) | set(b))
                if a.get(k) != b.get(k)]
        if diff:
            return "its " + "; its ".join(diff)
    return (f"{meta.get(what + '_name', '?')}, fingerprint {meta.get(what)}; this run: "
            f"{want.get(what + '_name', '?')}, {want.get(what)}")


def check_meta(path: str | Path, meta: dict, want: dict, plan: bool = True) -> int:
    """The checkpoint's step, after its model (and with `plan`, its plan) fingerprints matched
    `want`'s; else one line saying what differs (the seed, the blocks, the shape, the partition)."""
    for what in ("model", "plan") if plan else ("model",):
        if meta.get(what) != want.get(what):
            raise ConfigError(f"train.resume={path}: the checkpoint is of another {what} "
                              f"({_differences(meta, want, what)})")
    return int(meta["step"])


def tensor_shapes(path: str | Path) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor a checkpoint holds (from its .metadata, no tensor read)."""
    md = dcp.FileSystemReader(str(path)).read_metadata()
    return {k: tuple(v.size) for k, v in md.state_dict_metadata.items() if isinstance(v, TensorStorageMetadata)}


def load(path: str | Path, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Collective: fill `tensors` (this rank's names, preallocated) from checkpoint `path`."""
    state = {k: v.detach().cpu().clone() for k, v in tensors.items()}
    dcp.load(state, checkpoint_id=str(path))
    return state
