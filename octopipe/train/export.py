"""`python -m octopipe.train.export CHECKPOINT OUT`: a training checkpoint as the user's own
model's weights.

The checkpoint is verified (`octopipe.train.checkpoint.read_meta`), its parameters read in one
process (no ranks: a checkpoint of any plan), and loaded into the model its factory builds
afresh. A user's factory gives `OUT` as one `torch.save`d `state_dict` of
`nn.Sequential(*blocks)` (a shared parameter under each of its names, buffers included), which
`load_state_dict` accepts on the factory's own module; `model=hf` gives a directory that
transformers' `from_pretrained` loads; a preset's layers give their tensors under the runtime's
names. Bad input is one line on stderr, exit 2.
"""
from __future__ import annotations

import sys
import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from octopipe.errors import ConfigError, OctoPipeError
from octopipe.model.hf import _transformers, hf_config
from octopipe.model.user_module import UserBlocks
from octopipe.train.checkpoint import read_meta

HF_FACTORY = "octopipe.model.hf:build"
USAGE = "usage: python -m octopipe.train.export CHECKPOINT OUT"


def model_tensors(path: str | Path) -> dict[str, torch.Tensor]:
    """Every `model.<name>` tensor of a checkpoint, under `<name>`, read in this process."""
    md = dcp.FileSystemReader(str(path)).read_metadata()
    state = {k: torch.empty(tuple(v.size), dtype=v.properties.dtype) for k, v in md.state_dict_metadata.items()
             if k.startswith("model.") and isinstance(v, TensorStorageMetadata)}
    with warnings.catch_warnings():     # "assuming the intent is to load in a single process": it is
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, checkpoint_id=str(path), no_dist=True)
    return {k[len("model."):]: v for k, v in state.items()}


def model_of(ref: dict) -> UserBlocks:
    """The factory a checkpoint's `model_ref` names, at its training shape."""
    return UserBlocks(ref["factory"], int(ref["seq_len"]), int(ref["micro_batch_size"]), int(ref["vocab"]),
                      tuple((k, v) for k, v in ref.get("kwargs", [])))


def loaded_model(path: str | Path, meta: dict) -> tuple[nn.Sequential, UserBlocks]:
    """The factory's model built afresh with the checkpoint's weights; ConfigError naming the
    first parameter the two do not share."""
    ref = meta["model_ref"]
    blocks = model_of(ref)
    seq = nn.Sequential(*blocks.fresh(int(ref["seed"]))[0])
    tensors = model_tensors(path)
    names = dict(seq.named_parameters())
    for name, t in sorted(tensors.items()):
        if name not in names:
            raise ConfigError(f"{path}: the checkpoint's parameter {name} is not in {ref['factory']}'s model")
        if tuple(names[name].shape) != tuple(t.shape):
            raise ConfigError(f"{path}: {name} has shape {list(t.shape)} in the checkpoint and "
                              f"{list(names[name].shape)} in {ref['factory']}'s model")
    missing = sorted(set(names) - set(tensors))
    if missing:
        raise ConfigError(f"{path}: the checkpoint has no {missing[0]} of {ref['factory']}'s model")
    with torch.no_grad():
        for name, t in tensors.items():
            names[name].copy_(t)
    return seq, blocks


def _hf_names(seq: nn.Sequential) -> dict[str, torch.Tensor]:
    """The blocks' parameters under the transformers model's names (embedding, layers, norm, head)."""
    last = len(seq) - 1
    out = {}
    for name, p in seq.state_dict(keep_vars=False).items():
        j, _, rest = name.partition(".")
        j = int(j)
        if j == 0:
            out["model.embed_tokens." + rest.partition(".")[2]] = p
        elif j == last:
            part, _, tail = rest.partition(".")
            out[("model.norm." if part == "norm" else "lm_head.") + tail] = p
        else:
            out[f"model.layers.{j - 1}." + rest.partition(".")[2]] = p
    return out


def export(path: str | Path, out: str | Path) -> Path:
    """Write checkpoint `path`'s weights to `out` (see the module docstring); the path written."""
    meta = read_meta(path, what="CHECKPOINT")
    out = Path(out)
    if out.exists() and (out.is_file() or any(out.iterdir())):
        raise ConfigError(f"{out}: exists already; give a new path (an export never overwrites)")
    ref = meta.get("model_ref")
    if ref is None:             # a preset's layers: the tensors as the runtime names them
        torch.save(model_tensors(path), out)
        return out
    seq, blocks = loaded_model(path, meta)
    if ref["factory"] != HF_FACTORY:
        torch.save(seq.state_dict(), out)
        return out
    kwargs = dict(blocks.kwargs)
    lm = _transformers().AutoModelForCausalLM.from_config(hf_config(kwargs.pop("config", "llama"), kwargs))
    result = lm.load_state_dict(_hf_names(seq), strict=False)
    left = [k for k in result.missing_keys if not (k == "lm_head.weight" and lm.config.tie_word_embeddings)]
    if left or result.unexpected_keys:
        raise ConfigError(f"{path}: the checkpoint does not map onto the transformers model "
                          f"({(left or result.unexpected_keys)[0]})")
    lm.save_pretrained(str(out))
    return out


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0].startswith("-"):
        print(USAGE, file=sys.stderr)
        sys.exit(2)
    try:
        written = export(args[0], args[1])
    except OctoPipeError as e:
        print(f"octopipe: error: {str(e).splitlines()[0]}", file=sys.stderr)
        sys.exit(2)
    print(f"exported {args[0]} -> {written}")


if __name__ == "__main__":
    main()
