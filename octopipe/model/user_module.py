"""A user's own model as a list of pipeline blocks: `model=module model.factory=PKG.MOD:FUNC`.

The contract: FUNC() (or FUNC(**kwargs)) returns a `torch.nn.Sequential` or a list of modules;
every element is one block the planner may cut after. The first takes int64 token ids
`[batch, seq]`, the last returns logits `[batch, seq, vocab]`, and each one in between takes
the tensor its predecessor returns. The loss is next-token cross-entropy, or `loss_fn(logits,
targets)` when the factory's module exports one. FUNC is called under `torch.manual_seed(seed)`,
so every rank (and the single-process reference) builds the same weights; a FUNC with a `vocab`
parameter gets `model.vocab`.

`UserBlocks` wraps them in the runtime's block form, `block(x, batch) -> Tensor` (x: what the
previous block handed on, None for the first; batch: the micro-batch's `ids` and `targets`).
`check_blocks` runs a tiny batch through them before anything is planned and names the
offending block on a breach of the contract.
"""
from __future__ import annotations

import copy
import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from octopipe.errors import ConfigError

REPO_ROOT = Path(__file__).resolve().parent.parent.parent


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over every position (the default loss)."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


def _import_file(path: Path) -> Any:
    name = f"octopipe_user_{abs(hash(str(path.resolve())))}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"model.factory: {path} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    folder = str(path.resolve().parent)
    if folder not in sys.path:      # as `python path/model.py` would: modules beside it import
        sys.path.insert(0, folder)
    argv, sys.argv = sys.argv, [str(path)]     # an argparse at import sees its own file, not ours
    try:
        spec.loader.exec_module(module)
    except SystemExit as e:     # a script's sys.exit or argparse at import: it must not end the run
        del sys.modules[name]
        raise ConfigError(f"model.factory: importing {path} called sys.exit({e.code!r}); keep script code "
                          f"under if __name__ == '__main__'") from None
    except Exception as e:  # the user's file: any error it raises is reported in one line
        del sys.modules[name]
        raise ConfigError(f"model.factory: importing {path} failed: {type(e).__name__}: {e}") from e
    finally:
        sys.argv = argv
    return module


def load_factory(ref: str) -> tuple[Callable[..., Any], Any]:
    """The factory function and its module from `PKG.MOD:FUNC` or `path/to/file.py:FUNC` (a
    relative path is tried from the working directory, then from the repository root)."""
    where, sep, func = ref.rpartition(":")
    if not sep or not where or not func:
        raise ConfigError(f"model.factory={ref!r}: expected PKG.MOD:FUNC or path/to/file.py:FUNC")
    if where.endswith(".py") or "/" in where:
        path = Path(where)
        if not path.is_absolute() and not path.exists():
            path = REPO_ROOT / where
        if not path.exists():
            raise ConfigError(f"model.factory={ref!r}: file {where} does not exist")
        module = _import_file(path)
    else:
        try:
            module = importlib.import_module(where)
        except SystemExit as e:     # a script's sys.exit at import: it must not end the run
            raise ConfigError(f"model.factory={ref!r}: importing {where} called sys.exit({e.code!r}); keep "
                              f"script code under if __name__ == '__main__'") from None
        except Exception as e:  # the user's package: any import error is reported in one line
            raise ConfigError(f"model.factory={ref!r}: module {where} does not import: "
                              f"{type(e).__name__}: {e}") from e
    fn = getattr(module, func, None)
    if not callable(fn):
        raise ConfigError(f"model.factory={ref!r}: {where} has no function {func!r}")
    return fn, module


def _as_list(ref: str, made: Any) -> list[nn.Module]:
    if isinstance(made, (nn.Sequential, list, tuple, nn.ModuleList)):
        blocks = list(made)
    else:
        raise ConfigError(f"model.factory={ref!r} returned {type(made).__name__}; return an "
                          f"nn.Sequential or a list of nn.Module blocks")
    if not blocks:
        raise ConfigError(f"model.factory={ref!r} returned no blocks")
    bad = next((j for j, b in enumerate(blocks) if not isinstance(b, nn.Module)), None)
    if bad is not None:
        raise ConfigError(f"model.factory={ref!r}: block {bad} is a {type(blocks[bad]).__name__}, "
                          f"not an nn.Module")
    return blocks


def block_name(block: nn.Module, index: int) -> str:
    return f"{index}:{type(block).__name__}"


class UserBlock(nn.Module):
    """One user block in the runtime's form: the first reads `batch['ids']`, the last turns its
    logits into the loss against `batch['targets']`."""

    def __init__(self, inner: nn.Module, first: bool, last: bool, loss_fn: Callable) -> None:
        super().__init__()
        self.inner, self.first, self.last, self.loss_fn = inner, first, last, loss_fn

    def forward(self, x: torch.Tensor | None, batch: dict) -> torch.Tensor:
        h = self.inner(batch["ids"] if self.first else x)
        return self.loss_fn(h, batch["targets"]) if self.last else h


@dataclass(frozen=True)
class UserBlocks:
    """The blocks of `factory` (a reference, so that every rank can rebuild them), with the
    training shape: `micro_batch_size` sequences of `seq_len` tokens from a `vocab`-token
    alphabet. `carry_shapes[j]` is the shape block j hands on (filled in by `check_blocks`)."""

    factory: str
    seq_len: int
    micro_batch_size: int
    vocab: int
    kwargs: tuple[tuple[str, Any], ...] = ()
    carry_shapes: tuple[tuple[int, ...], ...] = ()
    names: tuple[str, ...] = ()
    _cache: dict = field(default_factory=dict, repr=False, compare=False, hash=False)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_cache"] = {}
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)

    @property
    def n_blocks(self) -> int:
        return len(self.carry_shapes)

    @property
    def name(self) -> str:
        return self.factory.rpartition(":")[2] or self.factory

    def raw(self, seed: int) -> tuple[list[nn.Module], Callable]:
        """The factory's blocks built under `seed` (cached per process) and the loss function."""
        if seed not in self._cache:
            fn, module = load_factory(self.factory)
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                kwargs = dict(self.kwargs)
                if "vocab" in inspect.signature(fn).parameters:
                    kwargs.setdefault("vocab", self.vocab)
                try:
                    made = fn(**kwargs)
                except SystemExit as e:     # the factory must return blocks, not end the run
                    raise ConfigError(f"model.factory={self.factory!r} called sys.exit({e.code!r}); a "
                                      f"factory returns its blocks") from None
                except Exception as e:  # the user's factory: any error is reported in one line
                    raise ConfigError(f"model.factory={self.factory!r} raised {type(e).__name__}: {e}") from e
            loss = getattr(module, "loss_fn", None)
            self._cache[seed] = (_as_list(self.factory, made), loss if callable(loss) else cross_entropy)
        return self._cache[seed]

    def build(self, index: int, seed: int = 0) -> nn.Module:
        """Block `index` in the runtime's form, a fresh copy with the weights `seed` gives."""
        return self.build_stage(index, index + 1, seed)[0]

    def build_stage(self, lo: int, hi: int, seed: int = 0) -> list[nn.Module]:
        """Blocks lo..hi-1 in the runtime's form, copied together: a parameter or module two of
        them share stays one object (`octopipe.model.sharing`; across stages, the training
        loop keeps the copies equal)."""
        blocks, loss = self.raw(seed)
        copies = copy.deepcopy(blocks[lo:hi])
        return [UserBlock(c, j == 0, j == len(blocks) - 1, loss) for j, c in zip(range(lo, hi), copies)]

    def fresh(self, seed: int) -> tuple[list[nn.Module], Callable]:
        """A new call of the factory under `seed` (not the cached one): the user's model as their
        factory returns it, the single-process reference's."""
        self._cache.pop(seed, None)
        try:
            return self.raw(seed)
        finally:
            self._cache.pop(seed, None)

    def carry_shape(self, index: int) -> tuple[int, ...]:
        return self.carry_shapes[index]


def _run_block(ref: str, j: int, block: nn.Module, x: torch.Tensor, what: str) -> torch.Tensor:
    try:
        return block(x)
    except Exception as e:  # the user's block: its error is reported in one line, named
        first = next((ln for ln in str(e).splitlines() if ln.strip()), "")
        raise ConfigError(f"model.factory={ref!r}: block {block_name(block, j)} rejects {what}: "
                          f"{type(e).__name__}: {first}") from e


def _check_seeded(blocks: UserBlocks, raw: list[nn.Module], seed: int) -> None:
    """A second call of the factory under the same seed builds the same weights: every rank
    builds its blocks with it, so a factory that reseeds (or draws from elsewhere) would start
    each rank from different weights. ConfigError naming the first block that differs."""
    again, _ = blocks.fresh(seed)
    for j, (a, b) in enumerate(zip(raw, again)):
        sa, sb = a.state_dict(), b.state_dict()
        if sa.keys() != sb.keys() or any(not torch.equal(sa[k], sb[k]) for k in sa):
            raise ConfigError(f"model.factory={blocks.factory!r}: two calls under seed {seed} build different "
                              f"weights in block {block_name(a, j)}; build the model from torch's generator "
                              f"(the factory runs under torch.manual_seed(seed)) without reseeding it")


def check_blocks(blocks: UserBlocks, seed: int = 0) -> UserBlocks:
    """`blocks` with their names and carry shapes, after a tiny batch (2 x min(seq, 8) tokens)
    and then one micro-batch of the training shape went through them: the first must take int64
    ids, each later block its predecessor's tensor, and the last return [batch, seq, vocab]
    logits; anything else is a ConfigError naming the block."""
    raw, loss = blocks.raw(seed)
    ref = blocks.factory
    shapes: tuple[tuple[int, ...], ...] = ()
    for b, s in ((2, min(blocks.seq_len, 8)), (blocks.micro_batch_size, blocks.seq_len)):
        gen = torch.Generator().manual_seed(0)
        ids = torch.randint(0, blocks.vocab, (b, s), generator=gen)
        x, out = ids, []
        with torch.no_grad():
            for j, block in enumerate(raw):
                what = f"int64 token ids of shape {list(ids.shape)}" if j == 0 else \
                    f"the output of block {block_name(raw[j - 1], j - 1)} (shape {list(x.shape)})"
                x = _run_block(ref, j, block, x, what)
                if not isinstance(x, torch.Tensor):
                    raise ConfigError(f"model.factory={ref!r}: block {block_name(block, j)} returned "
                                      f"{type(x).__name__}; a block returns one tensor")
                if j < len(raw) - 1 and x.dtype != torch.float32:
                    raise ConfigError(f"model.factory={ref!r}: block {block_name(block, j)} hands on a "
                                      f"{str(x.dtype).replace('torch.', '')} tensor; stages exchange float32 "
                                      f"activations: return x.float() (bf16 compute: train.precision=bf16)")
                out.append(tuple(x.shape))
        if tuple(x.shape) != (b, s, blocks.vocab):
            raise ConfigError(f"model.factory={ref!r}: the last block {block_name(raw[-1], len(raw) - 1)} "
                              f"returns shape {list(x.shape)}, expected logits [batch, seq, vocab] = "
                              f"{[b, s, blocks.vocab]}")
        value = loss(x, torch.randint(0, blocks.vocab, (b, s), generator=gen))
        if not isinstance(value, torch.Tensor) or value.numel() != 1:
            raise ConfigError(f"model.factory={ref!r}: loss_fn must return a scalar tensor")
        shapes = tuple(out[:-1]) + ((),)
    _check_seeded(blocks, raw, seed)
    names = tuple(block_name(b, j) for j, b in enumerate(raw))
    return UserBlocks(blocks.factory, blocks.seq_len, blocks.micro_batch_size, blocks.vocab,
                      blocks.kwargs, shapes, names)
