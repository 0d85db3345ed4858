"""`runtime`: the torch.distributed executor (octopipe/runtime; mode=execute)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from octopipe.config.fields import setting


@dataclass(frozen=True)
class RuntimeConfig:
    """How plans run on torch.distributed ranks. See docs/runtime.md."""

    backend: Literal["gloo", "nccl"] = setting("gloo", "gloo (127.0.0.1) | nccl (a GPU per rank)")
    device: Literal["auto", "cpu", "cuda"] = setting(
        "auto", "auto (cuda with nccl, else cpu) | cpu | cuda (with gloo: ranks share the GPUs, "
        "transfers staged through host memory); cost=profiled measures on this device too")
    transport: Literal["auto", "tagged", "ordered"] = setting(
        "auto", "auto (ordered with nccl, tagged with gloo) | tagged (gloo only) | ordered")
    compute: Literal["real", "emulated"] = setting(
        "real", "real: the layers compute | emulated: each action sleeps its modelled time")
    dispatch: Literal["strict", "ready_first"] = setting(
        "ready_first", "strict (row order) | ready_first (the row ranks the ready actions)")
    hint: Literal["table", "bf", "bfw"] = setting(
        "table", "ready_first ranking: table (row order) | bf (backward before forward) | bfw "
        "(I/B, then F, then deferred W); octopipe/sim/hints.py, shared with the simulator")
    max_inflight: int | Literal["plan"] | None = setting(
        "plan", "ready_first: cap on micro-batches live per rank: plan (each rank at most its own "
        "row's need, the count the plan's memory was priced for) | an integer for every rank (one "
        "that could deadlock the table is refused) | null (none: forwards run as soon as ready)", ge=1)
    memory_cap: float | None = setting(
        None, "ready_first: modelled activation bytes per rank an admission may not exceed "
        "(null: none)", gt=0)
    jitter_cv: float = setting(0.0, "compute jitter: lognormal per action, coefficient of "
                                    "variation", ge=0, le=3)
    straggler_prob: float = setting(0.0, "probability that an action is a straggler", ge=0, le=1)
    straggler_factor: float = setting(3.0, "how many times longer a straggler takes", ge=1)
    slow_rank: int = setting(-1, "a persistently slow rank (-1: none)", ge=-1)
    slow_rank_factor: float = setting(1.5, "how much slower that rank is", ge=1)
    transfer_delay: float = setting(0.0, "mean delay before a send is posted, in mean stage "
                                         "F times (exponential)", ge=0)
    seq_len_cv: float = setting(0.0, "data: micro-batch sequence length, lognormal around the "
                                     "mean with this coefficient of variation", ge=0, le=3)
    images_max: int = setting(0, "data (vision models): images per sample drawn from "
                                 "1..images_max (0: fixed)", ge=0)
    tp: int = setting(1, "tensor-parallel ranks per pipeline rank (world = ranks x tp): with "
                          "compute=real each stage's attention, MLP, MoE and head are split "
                          "Megatron-style over them, other layers replicated; under ready_first "
                          "they agree on each task by a scalar all-gather", ge=1, le=64)
    iterations: int = setting(3, "measured iterations", ge=1)
    warmup: int = setting(1, "iterations run before them and not measured", ge=0)
    model: str = setting(
        "auto", "compute=real: `auto` runs the selected model if it has at most max_params "
        "parameters and otherwise tiny_hybrid (and says so); a preset name forces it")
    max_params: int = setting(50_000_000, "the largest model compute=real builds as is", ge=1)
    max_ranks: int = setting(8, "the most local processes a launch starts (mode=train's dp x tp x pp); a larger "
                                "world runs under torchrun on several machines", ge=1)
    lr: float = setting(0.0, "SGD learning rate applied after each iteration (0: no step)", ge=0)
    calibrate: bool = setting(
        True, "compute=real: predict from costs calibrated in situ (a separate launch per "
        "partition on the same ranks, octopipe/measure/insitu.py); false: from cost=profiled alone")
    pin: Literal["auto", "true", "false"] = setting(
        "auto", "compute=real: auto pins rank r to core r (mod the cores this process may use) "
        "where the platform can (Linux); true insists; false leaves ranks to the OS")
    grad_check: bool = setting(True, "compute=real: loss and gradients against a single-process "
                                     "reference")
    schedules: tuple[str, ...] | None = setting(
        None, "a list of schedule names run side by side; null: the schedule group's")
    emulate_step_s: float = setting(
        0.01, "compute=emulated: modelled times scaled so the mean stage F lasts this", gt=0)
    max_message_bytes: int = setting(
        262144, "compute=emulated: message sizes scaled so the largest fits this (bigger "
        "loopback messages cost CPU time the emulation does not model)", ge=1)
    timeout_s: float = setting(300.0, "the whole run", gt=0)
    stall_s: float = setting(30.0, "watchdog: no rank made progress for this long", gt=0)
