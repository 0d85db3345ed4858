"""Collective costs on a cluster's links: ring/tree all-reduce, all-gather, reduce-scatter,
all-to-all, and the collectives of Megatron-style tensor parallelism and of data parallelism.

The alpha-beta model (Thakur, Rabenseifner and Gropp 2005; NCCL's ring and tree): a step costs
the link's latency alpha plus its bytes over the link's one-direction bandwidth beta. For a
group of n ranks and a buffer of B bytes (the full, unsharded buffer):

- ring all-reduce: 2(n-1) steps of B/n bytes: `2(n-1)·alpha + 2(n-1)/n · B/beta`;
- tree all-reduce (pipelined reduce then broadcast over a binary tree):
  `2·ceil(log2 n)·alpha + 2·B/beta`;
- ring all-gather and reduce-scatter: n-1 steps of B/n bytes: `(n-1)·alpha + (n-1)/n · B/beta`;
- all-to-all (pairwise exchange), B the bytes each rank holds before the exchange:
  `(n-1)·alpha + (n-1)/n · B/beta`.

A group of one rank costs nothing. A group's link is the slowest it spans: NVLink when it sits
inside one node, the inter-node link (one NIC per GPU) otherwise.

Tensor parallelism (Megatron-LM, Shoeybi et al. 2019; Korthikanti et al. 2022 for sequence
parallelism), per layer and micro-batch of `n_tok` tokens, activations in bf16 (2 bytes):

- a mixer (attention, MLA, linear attention, Mamba) and a dense MLP (or projector): one
  all-reduce of the `n_tok·h` output in F and one of the input gradient in I; with sequence
  parallelism each becomes an all-gather plus a reduce-scatter of the same buffer;
- a ViT block holds both, so twice that;
- a vocabulary-parallel embedding: one all-reduce of its output in F (a reduce-scatter under
  sequence parallelism), none in the backward (token ids have no gradient);
- a vocabulary-parallel head: three all-reduces of `n_tok` fp32 values in F (max logit, sum of
  exponentials, target logit: Megatron's vocab_parallel_cross_entropy); the input gradient's
  all-reduce in I (under sequence parallelism an all-gather of the input in F and a
  reduce-scatter of its gradient in I);
- an MoE layer with its experts expert-parallel over the TP group (EP = tp): an all-to-all
  dispatch and combine of the routed copies (`top_k·n_tok/tp·h` values per rank) in F and again
  in I; shared experts are tensor-parallel and add one all-reduce in F and one in I.

W passes run no collectives. With `overlap`, a pass's collectives overlap its compute (the pass
takes the longer of the two); otherwise they add to it.

Data parallelism per pipeline stage at the end of the iteration: an all-reduce of the stage's
gradients (`grad_bytes` per parameter) or, under ZeRO-1/2, a reduce-scatter of the gradients and
an all-gather of the updated bf16 weights. Memory under ZeRO: stage 1 divides the optimizer
state by dp, stage 2 the gradients too.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

from octopipe.cluster import Cluster, Link
from octopipe.errors import ConfigError
from octopipe.model.layer import LayerKind, LayerSpec

ACT_BYTES = 2.0       # bf16 activations and their gradients
WEIGHT_BYTES = 2.0    # bf16 weights (what ZeRO's all-gather moves)


class Op(str, Enum):
    ALL_REDUCE = "all_reduce"
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"
    ALL_TO_ALL = "all_to_all"


ALGORITHMS = ("ring", "tree")


def all_reduce_seconds(nbytes: float, n: int, link: Link, algorithm: str = "ring") -> float:
    """All-reduce of a `nbytes` buffer over `n` ranks (ring or tree)."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    if algorithm == "ring":
        return 2 * (n - 1) * link.latency + 2.0 * (n - 1) / n * nbytes / link.bandwidth
    if algorithm == "tree":
        return 2 * math.ceil(math.log2(n)) * link.latency + 2.0 * nbytes / link.bandwidth
    raise ConfigError(f"collective algorithm {algorithm!r} is unknown; use one of {', '.join(ALGORITHMS)}")


def all_gather_seconds(nbytes: float, n: int, link: Link) -> float:
    """Ring all-gather whose gathered (full) buffer is `nbytes`."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    return (n - 1) * link.latency + (n - 1) / n * nbytes / link.bandwidth


def reduce_scatter_seconds(nbytes: float, n: int, link: Link) -> float:
    """Ring reduce-scatter of a full buffer of `nbytes` (each rank keeps nbytes/n)."""
    return all_gather_seconds(nbytes, n, link)


def all_to_all_seconds(nbytes: float, n: int, link: Link) -> float:
    """Pairwise all-to-all where each rank holds `nbytes` and keeps 1/n of them."""
    return all_gather_seconds(nbytes, n, link)


def collective_seconds(op: Op, nbytes: float, n: int, link: Link, algorithm: str = "ring") -> float:
    """Seconds of one collective `op`."""
    if op is Op.ALL_REDUCE:
        return all_reduce_seconds(nbytes, n, link, algorithm)
    if op is Op.ALL_GATHER:
        return all_gather_seconds(nbytes, n, link)
    if op is Op.REDUCE_SCATTER:
        return reduce_scatter_seconds(nbytes, n, link)
    return all_to_all_seconds(nbytes, n, link)


@dataclass(frozen=True)
class Collective:
    """One collective of a pass: its operation, its buffer's bytes, and the pass (f or i)."""

    op: Op
    nbytes: float
    phase: str              # "f" (forward) or "i" (input gradient)


@dataclass(frozen=True)
class PassComm:
    """Seconds of tensor-parallel collectives in a layer's F and I passes (W has none)."""

    f: float = 0.0
    i: float = 0.0


_MIXERS = (LayerKind.ATTENTION, LayerKind.MLA, LayerKind.LINEAR_ATTENTION, LayerKind.MAMBA2,
           LayerKind.MAMBA1, LayerKind.MLP, LayerKind.PROJECTOR)


def _reduce_pair(nbytes: float, sequence_parallel: bool) -> list[Collective]:
    """A row-parallel output in F and its input gradient in I: all-reduces, or under sequence
    parallelism an all-gather and a reduce-scatter in each pass."""
    if not sequence_parallel:
        return [Collective(Op.ALL_REDUCE, nbytes, "f"), Collective(Op.ALL_REDUCE, nbytes, "i")]
    return [Collective(o, nbytes, p) for p in ("f", "i")
            for o in (Op.ALL_GATHER, Op.REDUCE_SCATTER)]


def tp_layer_collectives(x: LayerSpec, n_tok: int, tp: int,
                         sequence_parallel: bool = False) -> list[Collective]:
    """The collectives Megatron-style TP of degree `tp` runs for layer `x` on `n_tok` tokens."""
    if tp <= 1:
        return []
    act = ACT_BYTES * n_tok * x.hidden
    k = x.kind
    if k in _MIXERS:
        return _reduce_pair(act, sequence_parallel)
    if k is LayerKind.VIT_BLOCK:
        return 2 * _reduce_pair(act, sequence_parallel)
    if k is LayerKind.EMBEDDING:
        return [Collective(Op.REDUCE_SCATTER if sequence_parallel else Op.ALL_REDUCE, act, "f")]
    if k is LayerKind.HEAD:
        stats = [Collective(Op.ALL_REDUCE, 4.0 * n_tok, "f") for _ in range(3)]
        if sequence_parallel:
            return stats + [Collective(Op.ALL_GATHER, act, "f"),
                            Collective(Op.REDUCE_SCATTER, act, "i")]
        return stats + [Collective(Op.ALL_REDUCE, act, "i")]
    if k is LayerKind.MOE:
        routed = ACT_BYTES * x.top_k * n_tok / tp * x.hidden
        out = [Collective(Op.ALL_TO_ALL, routed, p) for p in ("f", "i") for _ in range(2)]
        return out + (_reduce_pair(act, sequence_parallel) if x.shared_experts else [])
    return []                                  # patch embedding: replicated, no collective


def tp_collective_seconds(x: LayerSpec, n_tok: int, tp: int, link: Link,
                          sequence_parallel: bool = False, algorithm: str = "ring") -> PassComm:
    """Seconds of layer `x`'s TP collectives in its F and I passes on `link` (the API the
    simulator's durations and the runtime's models read)."""
    f = i = 0.0
    for c in tp_layer_collectives(x, n_tok, tp, sequence_parallel):
        t = collective_seconds(c.op, c.nbytes, tp, link, algorithm)
        if c.phase == "f":
            f += t
        else:
            i += t
    return PassComm(f, i)


def with_collectives(compute_s: float, comm_s: float, overlap: bool) -> float:
    """A pass's time with its collectives: overlapped (the longer) or exposed (the sum)."""
    return max(compute_s, comm_s) if overlap else compute_s + comm_s


# -- data parallelism ------------------------------------------------------------------------


def dp_sync_seconds(params: float, dp: int, link: Link, zero: int = 0, grad_bytes: float = 4.0,
                    algorithm: str = "ring") -> float:
    """End-of-iteration gradient synchronization of `params` parameters over `dp` replicas:
    an all-reduce of the gradients (ZeRO 0), or a reduce-scatter of them and an all-gather of
    the updated bf16 weights (ZeRO 1/2)."""
    if dp <= 1 or params <= 0:
        return 0.0
    grads = params * grad_bytes
    if zero == 0:
        return all_reduce_seconds(grads, dp, link, algorithm)
    if zero in (1, 2):
        return reduce_scatter_seconds(grads, dp, link) + all_gather_seconds(params * WEIGHT_BYTES, dp, link)
    raise ConfigError(f"zero={zero}: use 0 (none), 1 (optimizer state) or 2 (and gradients)")


def static_bytes_per_param(bytes_per_param: float, dp: int = 1, zero: int = 0,
                           grad_bytes: float = 4.0) -> float:
    """Parameter + gradient + optimizer bytes one GPU holds per parameter of its shard: bf16
    weights (2), gradients (`grad_bytes`), optimizer state (the rest of `bytes_per_param`);
    ZeRO-1 divides the optimizer state by dp, ZeRO-2 the gradients too."""
    opt = bytes_per_param - WEIGHT_BYTES - grad_bytes
    if opt < 0:
        raise ConfigError(f"cost.bytes_per_param={bytes_per_param} is less than the bf16 weight "
                          f"({WEIGHT_BYTES:g}) plus the gradient ({grad_bytes:g}) bytes")
    if zero not in (0, 1, 2):
        raise ConfigError(f"zero={zero}: use 0 (none), 1 (optimizer state) or 2 (and gradients)")
    grad = grad_bytes / dp if zero >= 2 else grad_bytes
    return WEIGHT_BYTES + grad + (opt / dp if zero >= 1 else opt)


def group_link(cluster: Cluster, ranks: list[int] | tuple[int, ...]) -> Link | None:
    """The link a collective over `ranks` (GPU ranks of `cluster`) runs on: the intra-node link
    if they share a node, the inter-node link otherwise; None for a single rank."""
    if len(ranks) <= 1:
        return None
    nodes = {cluster.node[r] for r in ranks}
    return cluster.intra_link if len(nodes) == 1 else cluster.inter_link
