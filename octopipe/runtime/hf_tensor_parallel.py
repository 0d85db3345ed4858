"""Tensor parallelism for a Hugging Face causal LM's blocks (`model=hf`): Megatron's split of
each decoder layer, done in place on the transformers modules so that parameter names stay the
model's own.

Attention: q_proj, k_proj and v_proj keep the rows of this TP rank's heads (and KV heads), o_proj
the matching columns; MLP: gate_proj and up_proj keep a slice of rows, down_proj the matching
columns. The attention and the MLP take their input through `copy_to` (identity forward, the TP
ranks' input gradients summed backward) and hand their output on through `reduce_from` (the
ranks' partial outputs summed forward), hooked around the modules, so the norms, the embedding
and the head, replicated, see whole activations and whole gradients on every rank.
transformers' attention reshapes by `head_dim` with the head count inferred, so fewer heads per
rank need no other change. Families with per-head norms or routed experts (qwen3, mixtral) are
refused: their replicated per-head weights would see partial gradients.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from octopipe.errors import ConfigError
from octopipe.layers.tensor_parallel import copy_to, reduce_from
from octopipe.model.hf import HFDecoder, hf_config
from octopipe.model.user_module import UserBlocks

SPLIT_FAMILIES = ("llama", "mistral", "qwen2")
ROWS = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
COLS = ("o_proj", "down_proj")


def hf_ref(blocks: UserBlocks) -> str | None:
    """The transformers config a `model=hf` block list was built from (None: another factory)."""
    if not blocks.factory.endswith("octopipe.model.hf:build"):
        return None
    return str(dict(blocks.kwargs).get("config", "llama"))


def hf_tp_problem(blocks: UserBlocks, tp: int) -> str | None:
    """Why `blocks` cannot be split `tp` ways (the field and the fix), or None."""
    ref = hf_ref(blocks)
    if ref is None:
        return "a user's blocks (model.factory) cannot be split across TP ranks"
    cfg = hf_config(ref)
    if cfg.model_type not in SPLIT_FAMILIES:
        return (f"model.hf={ref} is {cfg.model_type}, whose per-head norms or routed experts this split does not "
                f"cover (it splits {', '.join(SPLIT_FAMILIES)})")
    kv = cfg.num_key_value_heads or cfg.num_attention_heads
    for name, n in (("num_attention_heads", cfg.num_attention_heads), ("num_key_value_heads", kv),
                    ("intermediate_size", cfg.intermediate_size)):
        if n % tp:
            return f"tp={tp} does not divide model.hf={ref}'s {name}={n}"
    return None


def _slice(n: int, t: int, tp: int) -> slice:
    return slice(t * n // tp, (t + 1) * n // tp)


@torch.no_grad()
def _split(linear: nn.Linear, t: int, tp: int, rows: bool) -> None:
    if rows:
        keep = _slice(linear.out_features, t, tp)
        linear.weight = nn.Parameter(linear.weight[keep].clone())
        if linear.bias is not None:
            linear.bias = nn.Parameter(linear.bias[keep].clone())
        linear.out_features = linear.weight.shape[0]
    else:
        linear.weight = nn.Parameter(linear.weight[:, _slice(linear.in_features, t, tp)].clone())
        linear.in_features = linear.weight.shape[1]


def _region(module: nn.Module, group) -> None:
    """Hook `module`: its input through copy_to, its output (or first output) through reduce_from."""
    def before(_, args, kwargs):
        if args:
            return (copy_to(args[0], group), *args[1:]), kwargs
        return args, {**kwargs, "hidden_states": copy_to(kwargs["hidden_states"], group)}

    def after(_, args, kwargs, out):
        if isinstance(out, tuple):
            return (reduce_from(out[0], group), *out[1:])
        return reduce_from(out, group)
    module.register_forward_pre_hook(before, with_kwargs=True)
    module.register_forward_hook(after, with_kwargs=True)


def split_decoder(block: HFDecoder, t: int, tp: int, group) -> None:
    """Make `block` TP rank t's share of its decoder layer, in place."""
    layer = block.layer
    for region in (layer.self_attn, layer.mlp):
        for name in (*ROWS, *COLS):
            lin = getattr(region, name, None)
            if isinstance(lin, nn.Linear):
                _split(lin, t, tp, name in ROWS)
        _region(region, group)


def _is_split(name: str) -> bool:
    """Whether parameter `name` (a stage's) is one `split_decoder` slices."""
    owner, _, leaf = name.rpartition(".")
    return ".layer." in name and leaf in ("weight", "bias") and owner.rpartition(".")[2] in (*ROWS, *COLS)


def _positions(shape: tuple[int, ...], rows: slice | None, cols: slice | None) -> torch.Tensor:
    """Flat positions of a row or column slice of a tensor of `shape` (all of it when neither)."""
    idx = torch.arange(int(torch.Size(shape).numel())).view(shape)
    if rows is not None:
        idx = idx[rows]
    elif cols is not None:
        idx = idx[:, cols]
    return idx.reshape(-1)


@dataclass(frozen=True)
class HFTPBlocks:
    """A `model=hf` block list as TP rank `t` of `tp` holds it (the block-list protocol of
    `octopipe.runtime.stage`): decoder layers split (`split_decoder`), the rest whole."""

    blocks: UserBlocks
    t: int
    tp: int
    group: object = field(compare=False, repr=False)

    @property
    def n_blocks(self) -> int:
        return self.blocks.n_blocks

    def build_stage(self, lo: int, hi: int, seed: int = 0) -> list[nn.Module]:
        built = self.blocks.build_stage(lo, hi, seed)
        for b in built:
            if isinstance(b.inner, HFDecoder):
                split_decoder(b.inner, self.t, self.tp, self.group)
        return built

    def carry_shape(self, index: int) -> tuple[int, ...]:
        return self.blocks.carry_shape(index)

    def replicated(self, stages) -> set[int]:
        """Ids of the parameters of `stages` every TP rank holds whole (counted once in a norm)."""
        return {id(p) for stage in stages for n, p in stage.named_parameters() if not _is_split(n)}

    def slice_map(self, stages, names) -> dict[str, tuple[str, tuple[int, ...], torch.Tensor]]:
        """Per parameter of `stages` (by its stage name): its name in the model (`names`:
        train.tied.ModelNames), the whole parameter's shape and the flat positions it holds."""
        out = {}
        for stage in stages:
            for n, p in stage.named_parameters():
                owner, _, leaf = n.rpartition(".")
                lin = owner.rpartition(".")[2]
                shape = list(p.shape)
                rows = cols = None
                if leaf in ("weight", "bias") and lin in ROWS and ".layer." in n:
                    shape[0] *= self.tp
                    rows = _slice(shape[0], self.t, self.tp)
                elif leaf == "weight" and lin in COLS and ".layer." in n:
                    shape[1] *= self.tp
                    cols = _slice(shape[1], self.t, self.tp)
                out[n] = (names(n), tuple(shape), _positions(tuple(shape), rows, cols))
        return out

    def shards(self, stages, names) -> dict:
        """What this rank holds of every parameter of its `stages`, under the model's names, as
        `runtime.tensor_parallel.assemble` reads it."""
        where = self.slice_map(stages, names)
        return {where[n][0]: (where[n][1], where[n][2], p.detach().cpu().reshape(-1).clone())
                for stage in stages for n, p in stage.named_parameters()}


def check_hf_tp(blocks: UserBlocks, tp: int) -> None:
    """One line naming train.tp and the fix when `blocks` cannot be split `tp` ways."""
    problem = hf_tp_problem(blocks, tp)
    if problem is not None:
        raise ConfigError(f"train.tp={tp}: {problem}; use train.tp=1" +
                          ("" if hf_ref(blocks) is None else " or another model.hf"))
