"""The modules a training stack cuts a model between, over OctoPipe's layers.

OctoPipe's presets list attention and MLP as separate layers; torchtitan and Megatron-LM build a
decoder layer (`layers.N`, Megatron's `t`) from both and never cut inside it, and put the vision
encoder in the first stage with the embedding. `Units` groups OctoPipe's layers into those
modules, with the names each stack knows them by, so that a plan whose stage bounds fall on unit
bounds can be written for the stack, and a stack's stage list can be read back as layers.

Hybrid models (Mamba layers present) are Megatron's hybrid stacks, where every symbol of the
pattern is its own layer (`M` Mamba, `*` attention, `-` MLP, `E` MoE): there each OctoPipe layer
is a unit.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from octopipe.cost.table import CostTable
from octopipe.errors import ConfigError
from octopipe.model.layer import LayerKind
from octopipe.model.spec import ModelSpec
from octopipe.plan import Partition

VISION = (LayerKind.PATCH_EMBED, LayerKind.VIT_BLOCK, LayerKind.PROJECTOR)
MIXERS = (LayerKind.ATTENTION, LayerKind.MLA, LayerKind.LINEAR_ATTENTION, LayerKind.MAMBA1,
          LayerKind.MAMBA2)
SSM = (LayerKind.MAMBA1, LayerKind.MAMBA2)
# Megatron's hybrid-pattern symbol of each layer kind (megatron/core/models/hybrid)
HYBRID_SYMBOLS = {LayerKind.MAMBA2: "M", LayerKind.MAMBA1: "M", LayerKind.ATTENTION: "*",
                  LayerKind.MLP: "-", LayerKind.MOE: "E", LayerKind.MLA: "+"}


@dataclass(frozen=True)
class Units:
    """`bounds[u]..bounds[u+1]` are unit u's layers; `names[u]` its module names in the stack's
    model; `symbols[u]` its Megatron symbol (`E`, `t`, `L`, or a hybrid-pattern letter);
    `source` says whose names they are (torchtitan, transformers, the user's Sequential)."""

    bounds: tuple[int, ...]
    names: tuple[tuple[str, ...], ...]
    symbols: tuple[str, ...]
    hybrid: bool
    source: str

    @property
    def n_units(self) -> int:
        return len(self.names)

    @property
    def n_layers(self) -> int:
        return self.bounds[-1]

    @property
    def decoder_count(self) -> int:
        """Units that are neither the embedding (with the vision encoder) nor the head."""
        return sum(1 for s in self.symbols if s not in ("E", "L"))

    def aligned(self, partition: Partition) -> bool:
        """Whether every stage bound of a layer partition falls on a unit bound."""
        return not self.misaligned(partition)

    def misaligned(self, partition: Partition) -> list[int]:
        """The stage bounds (layer indices) that cut inside a unit."""
        edges = set(self.bounds)
        return [b for b in partition.bounds if b not in edges]

    def to_layers(self, unit_partition: Partition) -> Partition:
        """A partition of units as the partition of layers it is."""
        return Partition(tuple(self.bounds[hi] - self.bounds[lo] for lo, hi in unit_partition.ranges))

    def to_units(self, partition: Partition) -> Partition:
        """A unit-aligned layer partition as a partition of units (ConfigError if not aligned)."""
        bad = self.misaligned(partition)
        if bad:
            raise ConfigError(f"stage bound at layer {bad[0]} cuts inside a module")
        index = {b: u for u, b in enumerate(self.bounds)}
        return Partition.from_cuts([index[b] for b in partition.bounds[1:-1]], self.n_units)

    def stage_names(self, partition: Partition) -> list[list[str]]:
        """Per stage, the module names it holds (`module_fqns_per_model_part`)."""
        units = self.to_units(partition)
        return [[n for u in range(lo, hi) for n in self.names[u]] for lo, hi in units.ranges]

    def merge(self, costs: CostTable) -> CostTable:
        """The cost table with one row per unit: sums of the additive columns, the last layer's
        message bytes (a stage bound after the unit sends what its last layer outputs). A
        unit-aligned plan costs the same on it as on the layers."""
        if costs.n_layers != self.n_layers:
            raise ConfigError(f"the cost table has {costs.n_layers} layers but the model's modules "
                              f"cover {self.n_layers}")
        lo, hi = np.asarray(self.bounds[:-1]), np.asarray(self.bounds[1:])

        def sums(a: np.ndarray | None) -> np.ndarray | None:
            if a is None:
                return None
            p = np.concatenate([np.zeros((1,) + a.shape[1:]), np.cumsum(a, axis=0)])
            return p[hi] - p[lo]
        names = tuple("+".join(n) for n in self.names)
        return CostTable(names, costs.kinds, sums(costs.f), sums(costs.i), sums(costs.w),
                         sums(costs.act_bytes), sums(costs.static_bytes), costs.out_bytes[hi - 1],
                         sums(costs.params), sums(costs.w_act_bytes), sums(costs.flops),
                         costs.tokens_per_microbatch, full_b=sums(costs.full_b), action_s=costs.action_s)


def _groups(model: ModelSpec) -> tuple[list[int], bool]:
    """Unit start indices: the embedding with any vision layers before it, each decoder layer
    (a mixer with the feed-forward layers after it; each layer for hybrid models), the head."""
    kinds = [layer.kind for layer in model.layers]
    hybrid = any(k in SSM for k in kinds)
    starts = [0]
    for j in range(1, len(kinds)):
        k, prev = kinds[j], kinds[j - 1]
        if k in VISION or k == LayerKind.EMBEDDING:
            continue
        if prev in VISION or prev == LayerKind.EMBEDDING or k == LayerKind.HEAD or hybrid or k in MIXERS:
            starts.append(j)
    return starts, hybrid


def preset_units(model: ModelSpec) -> Units:
    """A preset's modules under torchtitan's names (`tok_embeddings`, `layers.N`, `norm`,
    `output`; `vision_encoder` beside the embedding)."""
    kinds = [layer.kind for layer in model.layers]
    if LayerKind.EMBEDDING not in kinds or kinds[-1] != LayerKind.HEAD:
        raise ConfigError(f"model {model.name!r} has no embedding or no head layer; "
                          "the stacks' module names need both")
    starts, hybrid = _groups(model)
    bounds = (*starts, len(kinds))
    names, symbols = [], []
    n = 0
    for lo in bounds[:-1]:
        k = kinds[lo]
        if k == LayerKind.HEAD:
            names.append(("norm", "output"))
            symbols.append("L")
        elif k in VISION or k == LayerKind.EMBEDDING:
            names.append(("vision_encoder", "tok_embeddings") if k in VISION else ("tok_embeddings",))
            symbols.append("E")
        else:
            names.append((f"layers.{n}",))
            n += 1
            symbols.append(HYBRID_SYMBOLS.get(k, "?") if hybrid else "t")
    return Units(bounds, tuple(names), tuple(symbols), hybrid, "torchtitan")


def block_units(names: Sequence[tuple[str, ...]], source: str) -> Units:
    """A user's blocks, one unit each, under the module names of their own model."""
    n = len(names)
    symbols = tuple("E" if j == 0 else "L" if j == n - 1 else "t" for j in range(n))
    return Units(tuple(range(n + 1)), tuple(tuple(x) for x in names), symbols, False, source)


def sequential_names(n_blocks: int) -> list[tuple[str, ...]]:
    """The children of the `nn.Sequential` a factory returns: `0`, `1`, ..."""
    return [(str(j),) for j in range(n_blocks)]


def hf_names(n_blocks: int) -> list[tuple[str, ...]]:
    """A transformers causal LM's modules as OctoPipe's blocks take them: the embedding, each
    decoder layer, the final norm with the LM head."""
    return ([("model.embed_tokens",)] + [(f"model.layers.{j}",) for j in range(n_blocks - 2)]
            + [("model.norm", "lm_head")])
