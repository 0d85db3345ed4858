"""Tensor parallelism inside a stage: the pp x tp grid, its checks and RRFP's agreement.

World rank r is TP rank `r % tp` of pipeline rank `r // (dp * tp)` (`Grid`); the TP ranks of
one pipeline rank of one data-parallel replica form its TP group. Within a stage the layers are the Megatron variants of
`octopipe.layers.tensor_parallel`. Under ready-first dispatch the TP ranks of a stage must issue
identical collectives in identical order, so before a task with TP collectives they `agree`: an
all-gather of one scalar (the task each would pick, -1 for none); the task runs only if every
rank picked it, otherwise it is deferred and each picks again (see docs/runtime.md). With
real compute a rank builds its stages from `TPBlocks`, reports its shards with `rank_shards`,
and the launcher puts the whole gradients back together with `assemble`.
"""
from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from octopipe.errors import ConfigError
from octopipe.layers.batch import microbatch
from octopipe.layers.build import build_layer, carry_shape
from octopipe.layers.tensor_parallel import TP_KINDS, shard_grads, shard_index, tp_layer, tp_problem
from octopipe.model.layer import LayerKind
from octopipe.model.spec import ModelSpec
from octopipe.runtime.stage import max_rel_err

NONE = -1


@dataclass(frozen=True)
class Grid:
    """`pp` pipeline ranks, each `tp` TP ranks wide, the pipeline repeated `dp` times. World
    ranks in Megatron's order: tp fastest, then dp, then pp."""

    pp: int
    tp: int
    dp: int = 1

    @property
    def world(self) -> int:
        return self.pp * self.dp * self.tp

    def coords(self, rank: int) -> tuple[int, int]:
        """(pipeline rank, TP rank) of a world rank."""
        return rank // (self.dp * self.tp), rank % self.tp

    def place(self, rank: int) -> tuple[int, int, int]:
        """(pipeline rank, DP replica, TP rank) of a world rank."""
        return rank // (self.dp * self.tp), (rank // self.tp) % self.dp, rank % self.tp

    def rank(self, pipeline_rank: int, tp_rank: int, replica: int = 0) -> int:
        return (pipeline_rank * self.dp + replica) * self.tp + tp_rank

    def tp_groups(self) -> dict[tuple[int, int], object]:
        """One process group per (pipeline rank, replica) over its TP ranks (every rank creates
        every group, in the same order, as torch requires)."""
        return {(p, d): dist.new_group([self.rank(p, t, d) for t in range(self.tp)])
                for p in range(self.pp) for d in range(self.dp)}


def check_grid(model: ModelSpec | None, tp: int, pp: int, ranks: int | None = None) -> Grid:
    """The grid, or a ConfigError naming the field: tp out of range, a tp that does not divide a
    layer's heads / FFN width / experts / vocabulary, or more ranks than there are."""
    if tp < 1 or tp > 64:
        raise ConfigError(f"runtime.tp={tp} must lie in [1, 64]")
    if ranks is not None and tp * pp > ranks:
        raise ConfigError(f"runtime.tp={tp} x pp={pp} = {tp * pp} ranks, more than the {ranks} "
                          "available; lower tp or pp")
    if model is not None and tp > 1:
        if model.layers and model.layers[0].hidden % tp:
            raise ConfigError(f"runtime.tp={tp} does not divide the hidden size "
                              f"{model.layers[0].hidden}; choose a divisor")
        for spec in model.layers:
            problem = tp_problem(spec, tp, model.vocab)
            if problem is not None:
                raise ConfigError(f"runtime.{problem}; choose a tp that divides it")
    return Grid(pp, tp)


def agreed(picks: list[int], pick: int) -> bool:
    """Whether a round's gathered `picks` agree on this rank's `pick` (`NONE` never agrees)."""
    return pick != NONE and all(p == pick for p in picks)


class Round:
    """One agreement round posted without blocking: an all-gather of this rank's `pick` (one
    int64) over `group`, on `device` (the CPU for gloo, the rank's GPU for NCCL). `wake` is
    called when it completes (gloo's future; None: poll `done`), so a dispatcher waiting on its
    inbox for arrivals is woken by the round too, and runs other work meanwhile. `seen`: what the
    poster knew when it picked (`runtime.worker`'s change count); `posted`: when (perf_counter s)."""

    def __init__(self, pick: int, group, device: torch.device | None = None,
                 wake: Callable[[], None] | None = None, seen: int = 0, posted: float = 0.0) -> None:
        self.pick, self.seen, self.posted = pick, seen, posted
        mine = torch.tensor([pick], dtype=torch.int64, device=device)
        self.picks = [torch.empty(1, dtype=torch.int64, device=device) for _ in range(dist.get_world_size(group))]
        self.finished = False
        self.work = dist.all_gather(self.picks, mine, group=group, async_op=True)
        if wake is not None:
            self.work.get_future().add_done_callback(lambda _: self._done(wake))

    def _done(self, wake: Callable[[], None]) -> None:
        self.finished = True
        wake()

    def done(self) -> bool:
        return self.finished or self.work.is_completed()

    def result(self) -> list[int]:
        """Every rank's pick (waits for the round if it has not completed; a peer that failed or
        left ends it with a ConnectionError)."""
        try:
            self.work.wait()
        except RuntimeError as e:
            raise ConnectionError(f"agreement round failed: {e}") from e
        return [int(p) for p in self.picks]


def agree(pick: int, group, device: torch.device | None = None) -> bool:
    """Whether every rank of `group` picked the same task `pick` (one blocking `Round`); `NONE`
    (no ready task) never agrees."""
    return agreed(Round(pick, group, device).result(), pick)


@dataclass(frozen=True)
class TPBlocks:
    """A ModelSpec's layers as TP rank `t` of `tp` holds them, as a block list
    (`octopipe.runtime.stage`): the Megatron variant of each layer kind that has one
    (`tp_layer`, collectives over `group`), every other layer replicated whole."""

    model: ModelSpec
    t: int
    tp: int
    group: object = field(compare=False, repr=False)

    @property
    def n_blocks(self) -> int:
        return self.model.n_layers

    def build(self, index: int, seed: int = 0) -> torch.nn.Module:
        return tp_layer(build_layer(self.model, index, seed), self.model.layers[index], self.t, self.tp,
                        self.group)

    def carry_shape(self, index: int) -> tuple[int, ...]:
        return carry_shape(self.model, index)


Shards = dict[str, tuple[tuple[int, ...], torch.Tensor, torch.Tensor]]
"""Whole parameter name -> (its shape, the flat positions a rank holds, their values)."""


def slice_map(stages: Iterable, blocks: TPBlocks, seed: int) -> dict[str, tuple[str, tuple[int, ...], torch.Tensor]]:
    """Per parameter of `stages` (StageModules built from `blocks`; by its stage name): the whole
    parameter it slices (the single-process model's name, `layers.<index>.<name>`), that
    parameter's shape, and the flat positions this TP rank holds of it."""
    out = {}
    for stage in stages:
        for j, layer in stage.layers.items():
            whole = build_layer(blocks.model, int(j), seed)
            shapes = {n: tuple(p.shape) for n, p in whole.named_parameters()}
            index = shard_index(whole, blocks.model.layers[int(j)], blocks.t, blocks.tp)
            for name, _ in layer.named_parameters():
                of, pos = index[name]
                out[f"layers.{j}.{name}"] = (f"layers.{j}.{of}", shapes[of], pos)
    return out


def rank_shards(stages: Iterable, blocks: TPBlocks, seed: int,
                value: Callable[[torch.nn.Parameter], torch.Tensor]) -> Shards:
    """What TP rank `blocks.t` holds of every parameter of its `stages`, under the single-process
    model's names (`slice_map`); `value` reads a parameter (its gradient, its data)."""
    stages = list(stages)
    at = slice_map(stages, blocks, seed)
    out: Shards = {}
    for stage in stages:
        for n, p in stage.named_parameters():
            key, shape, pos = at[n]
            held = value(p).detach().cpu().reshape(-1).clone()
            if key in out:      # a second piece of the same whole parameter
                _, pos0, held0 = out[key]
                pos, held = torch.cat([pos0, pos]), torch.cat([held0, held])
            out[key] = (shape, pos, held)
    return out


def replicated(stages: Iterable, blocks: TPBlocks, seed: int) -> set[int]:
    """Ids of the parameters of `stages` that every TP rank holds whole (norms, replicated
    layers): counted once, on TP rank 0, in a global norm."""
    stages = list(stages)
    at = slice_map(stages, blocks, seed)
    out: set[int] = set()
    for stage in stages:
        for n, p in stage.named_parameters():
            _, shape, pos = at[n]
            size = int(torch.Size(shape).numel())
            if len(pos) == size and p.numel() == size:
                out.add(id(p))
    return out


def assemble(shards: Iterable[Shards]) -> dict[str, torch.Tensor]:
    """The whole tensors from every TP rank's `Shards` (a replicated position is written by each
    rank holding it); a position no rank holds is an error."""
    flat: dict[str, torch.Tensor] = {}
    seen: dict[str, torch.Tensor] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    for doc in shards:
        for name, (shape, pos, values) in doc.items():
            if name not in flat:
                n = int(torch.Size(shape).numel())
                flat[name], seen[name], shapes[name] = torch.zeros(n, dtype=values.dtype), \
                    torch.zeros(n, dtype=torch.bool), shape
            flat[name][pos] = values
            seen[name][pos] = True
    missing = sorted(n for n in flat if not bool(seen[n].all()))
    if missing:
        raise ValueError(f"no TP rank holds part of {missing[:3]}")
    return {n: flat[n].view(shapes[n]) for n in flat}


def agreement_cost(events: list[list[dict]], iterations: Iterable[int]) -> dict | None:
    """What RRFP's agreement cost in a run's `iterations` (from each rank's events), or None when
    no rank agreed (tp = 1, or strict dispatch): microseconds per round (scalar all-gather), rounds
    per task, and the largest share of a rank's iteration spent agreeing."""
    its = set(iterations)
    rounds = spent = tasks = 0.0
    share = 0.0
    for ev in events:
        for e in ev:
            if e["it"] in its and e.get("agree_rounds"):
                n = e["agree_rounds"]
                rank_tasks = sum(1 for a in ev if a["it"] == e["it"] and "action" in a)
                rounds, spent, tasks = rounds + n, spent + n * e["agree_us"], tasks + rank_tasks
                share = max(share, 1e-6 * n * e["agree_us"] / max(e["finish"] - e["begin"], 1e-12))
    if not rounds:
        return None
    return {"us_per_round": spent / rounds, "rounds_per_task": rounds / tasks,
            "us_per_task": spent / tasks, "max_share_of_iteration": share}


def free_port() -> int:
    """A free TCP port on 127.0.0.1 for a process group's rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _agreement_worker(t: int, n: int, port: int, rounds: int, out) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=t, world_size=n)
    group = dist.new_group(list(range(n)))
    agree(0, group)
    t0 = time.perf_counter()
    for k in range(rounds):
        agree(k, group)
    out.put((t, (time.perf_counter() - t0) / rounds))
    dist.barrier()
    dist.destroy_process_group()


def _on_ranks(worker, tp: int, args: tuple, timeout_s: float) -> list:
    """Run `worker(t, tp, port, *args, queue)` on `tp` spawned gloo ranks; what each put."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=worker, args=(t, tp, port, *args, out)) for t in range(tp)]
    for p in procs:
        p.start()
    got = [out.get(timeout=timeout_s) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    return got


def agreement_cost_s(tp: int = 2, rounds: int = 200) -> float:
    """Seconds one agreement (a scalar all-gather over `tp` gloo ranks on this machine) takes,
    the mean over `rounds`, slowest rank."""
    return max(s for _, s in _on_ranks(_agreement_worker, tp, (rounds,), timeout_s=300))


def layer_errors(models: list[ModelSpec], t: int, tp: int, group) -> dict[str, float]:
    """Per layer of `models` (seed 0, micro-batch 0): the largest relative error of rank t's
    variant (output, input gradient, every parameter gradient) against the whole layer, whose
    gradients `shard_grads` slices; the first layer's output feeds the next."""
    errs = {}
    for model in models:
        batch = microbatch(model, 0, 0, 0)
        x = None
        for i, spec in enumerate(model.layers):
            whole = build_layer(model, i, seed=0)
            part = tp_layer(build_layer(model, i, seed=0), spec, t, tp, group)
            if x is None or not x.is_floating_point():
                x = whole(x, batch).detach()
                continue
            xw, xp = x.clone().requires_grad_(), x.clone().requires_grad_()
            out_w = whole(xw, batch)
            probe = torch.randn(out_w.shape, generator=torch.Generator().manual_seed(i))
            out_p = part(xp, batch)
            (out_w * probe).sum().backward()
            (out_p * probe).sum().backward()
            want = {"out": out_w.detach(), "dx": xw.grad}
            want |= shard_grads(whole, spec, t, tp) if spec.kind in TP_KINDS else \
                {n: p.grad for n, p in whole.named_parameters()}
            got = {"out": out_p.detach(), "dx": xp.grad} | {n: p.grad for n, p in part.named_parameters()}
            errs[f"{model.name}/{i}:{spec.kind.value}"] = max_rel_err(got, want)
            if spec.kind is not LayerKind.HEAD:
                x = out_w.detach()
    return errs


def _exactness_worker(t: int, tp: int, port: int, models: list[ModelSpec], out) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=t, world_size=tp)
    out.put(layer_errors(models, t, tp, dist.new_group(list(range(tp)))))
    dist.barrier()
    dist.destroy_process_group()


def tp_exactness(models: list[ModelSpec], tp: int = 2) -> dict[str, float]:
    """`layer_errors` on `tp` gloo ranks; per layer, the worst rank."""
    got = _on_ranks(_exactness_worker, tp, (models,), timeout_s=600)
    return {k: max(g[k] for g in got) for k in got[0]}
