"""The registry of named schedules: one entry per schedule holds everything about it.

An entry names its generator, natural chunk count, placement style, chunk rule and constraints,
its closed forms (bubble ratio, in-flight activations; `formulas`), the torch class that builds
the same table, and the baselines the planner compares with (`Baseline`). Adding a schedule is
one entry here (plus its generator and formulas).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from octopipe.errors import ScheduleError
from octopipe.schedule import formulas as fm
from octopipe.schedule import generators as gen
from octopipe.schedule.generators._common import PLACEMENT_STYLES
from octopipe.schedule.table import ScheduleTable

Generator = Callable[[int, int, int], ScheduleTable]
BubbleFormula = Callable[[int, int, int, fm.Costs], float]
InflightFormula = Callable[[int, int, int, int], float]
BASELINE_GROUPS = ("uniform", "balanced", "balanced-v")


@dataclass(frozen=True)
class Baseline:
    """A planner baseline built from this schedule: its label, its partition group ("uniform":
    Megatron-style even layers; "balanced": the memory-aware DP partition; "balanced-v": min-max
    balanced V stages) and the chunk counts tried (the best feasible one is kept)."""

    label: str
    group: str
    chunks: tuple[int, ...]


@dataclass(frozen=True)
class ChunkRule:
    """Which chunk counts a schedule accepts, as a predicate and the words that explain it."""

    allows: Callable[[int], bool]
    text: str


ANY_CHUNKS = ChunkRule(lambda v: v >= 1, "any chunks >= 1")
ONE_CHUNK = ChunkRule(lambda v: v == 1, "chunks = 1")
TWO_CHUNKS = ChunkRule(lambda v: v == 2, "chunks = 2")


@dataclass(frozen=True)
class ScheduleInfo:
    """What a user needs to know about one named schedule before asking for it."""

    name: str
    generator: Generator
    default_chunks: int
    split_backward: bool
    placement: str          # "loop" (stage s on device s mod p), "v" (zig-zag), "bidirectional"
    torch_class: str | None  # torch.distributed.pipelining schedule building the same table
    constraints: str
    source: str
    bubble: BubbleFormula
    inflight: InflightFormula
    chunk_rule: ChunkRule = ANY_CHUNKS
    baselines: tuple[Baseline, ...] = ()


SCHEDULES: dict[str, ScheduleInfo] = {info.name: info for info in (
    ScheduleInfo("gpipe", gen.gpipe, 1, False, "loop", "ScheduleGPipe",
                 "chunks = 1", "Huang et al. 2019, GPipe", fm.bubble_gpipe, fm.inflight_gpipe,
                 ONE_CHUNK),
    ScheduleInfo("1f1b", gen.one_f_one_b, 1, False, "loop", "Schedule1F1B",
                 "chunks = 1; n_microbatches >= n_devices", "Narayanan et al. 2021, PipeDream-Flush",
                 fm.bubble_1f1b, fm.inflight_1f1b, ONE_CHUNK,
                 (Baseline("S-1F1B", "uniform", (1,)), Baseline("1F1B balanced", "balanced", (1,)))),
    ScheduleInfo("interleaved", gen.interleaved, 2, False, "loop", "ScheduleInterleaved1F1B",
                 "any chunks >= 1 and n_microbatches >= 1 (torch additionally needs m divisible "
                 "by max(1, m // p))", "Narayanan et al. 2021 §2.2.2, Megatron virtual pipeline",
                 fm.bubble_interleaved, fm.inflight_interleaved, ANY_CHUNKS,
                 (Baseline("I-1F1B", "uniform", (2, 3, 4)),)),
    ScheduleInfo("looped_bfs", gen.looped_bfs, 2, False, "loop", "ScheduleLoopedBFS",
                 "any chunks >= 1", "Lamy-Poirier 2023, breadth-first pipeline parallelism",
                 fm.bubble_looped_bfs, fm.inflight_looped_bfs),
    ScheduleInfo("zbh1", gen.zbh1, 1, True, "loop", "ScheduleInterleavedZeroBubble",
                 "any chunks >= 1 (torch builds chunks >= 2)", "Qi et al. 2024, ZB-H1 / ZB1P",
                 fm.bubble_zbh1, fm.inflight_zbh1, ANY_CHUNKS,
                 (Baseline("ZB-H1", "uniform", (1,)), Baseline("ZB-H1 balanced", "balanced", (1,)))),
    ScheduleInfo("zbh2", gen.zbh2, 1, True, "loop", None,
                 "chunks = 1", "Qi et al. 2024, ZB-H2", fm.bubble_zbh2, fm.inflight_zbh2, ONE_CHUNK),
    ScheduleInfo("zbv", gen.zbv, 2, True, "v", "ScheduleZBVZeroBubble",
                 "chunks = 2", "Qi et al. 2024 §6, ZB-V", fm.bubble_zbv, fm.inflight_zbv, TWO_CHUNKS,
                 (Baseline("ZB-V", "uniform", (2,)), Baseline("ZB-V balanced", "balanced-v", (2,)))),
    ScheduleInfo("dualpipev", gen.dualpipev, 2, True, "v", "ScheduleDualPipeV",
                 "chunks = 2; n_microbatches >= 2 * n_devices", "DeepSeek-AI 2024, DualPipe(V)",
                 fm.bubble_dualpipev, fm.inflight_dualpipev, TWO_CHUNKS),
    ScheduleInfo("chimera", gen.chimera, 1, False, "bidirectional", None,
                 "chunks = 1 per direction; n_devices even; n_microbatches even",
                 "Li & Hoefler SC'21, Chimera", fm.bubble_chimera, fm.inflight_chimera,
                 ChunkRule(lambda v: v == 1, "chunks = 1 per direction")),
    ScheduleInfo("hanayo", gen.hanayo, 2, False, "v", None,
                 "chunks even (2 per wave)", "Liu et al. SC'23, Hanayo",
                 fm.bubble_hanayo, fm.inflight_hanayo,
                 ChunkRule(lambda v: v % 2 == 0, "an even number of chunks (2 per wave)")),
    ScheduleInfo("pipedream", gen.pipedream, 1, False, "loop", None,
                 "chunks = 1 (asynchronous: see generators.weight_versions)",
                 "Narayanan et al. SOSP'19, PipeDream 1F1B with weight stashing",
                 fm.bubble_pipedream, fm.inflight_pipedream, ONE_CHUNK),
    ScheduleInfo("pipedream_vsync", gen.pipedream_vsync, 1, False, "loop", None,
                 "chunks = 1 (asynchronous, vertical sync: octopipe.asynchronous.tables)",
                 "Narayanan et al. SOSP'19 §3.3, PipeDream with vertical sync",
                 fm.bubble_pipedream, fm.inflight_pipedream, ONE_CHUNK),
    ScheduleInfo("pipedream_2bw", gen.pipedream_2bw, 1, False, "loop", None,
                 "chunks = 1; microbatches a multiple of pp (the update window; asynchronous: "
                 "octopipe.asynchronous.tables)",
                 "Narayanan et al. ICML'21, PipeDream-2BW (double-buffered weight updates)",
                 fm.bubble_pipedream, fm.inflight_pipedream, ONE_CHUNK),
)}

FORMULA_SCHEDULES = tuple(sorted(SCHEDULES))
# `schedule=<name>` choices on the command line: every named schedule and the tuner's plan
SCHEDULE_PRESETS = (*SCHEDULES, "octopipe")


def baselines() -> tuple[tuple[str, Baseline], ...]:
    """Every (schedule name, baseline) of the registry, uniform group first, then balanced."""
    pairs = [(name, b) for name, info in SCHEDULES.items() for b in info.baselines]
    return tuple(sorted(pairs, key=lambda nb: BASELINE_GROUPS.index(nb[1].group)))


def schedule_info(name: str) -> ScheduleInfo:
    try:
        return SCHEDULES[name]
    except KeyError:
        raise ScheduleError(f"unknown schedule {name!r}; valid names: {', '.join(SCHEDULES)}") from None


def build_schedule(name: str, n_devices: int, n_microbatches: int, chunks: int | None = None,
                   placement: str | None = None) -> ScheduleTable:
    """The table of schedule `name`; `chunks=None` takes the schedule's natural chunk count and
    `placement=None` its own placement style (only looped_bfs also offers "v")."""
    info = schedule_info(name)
    v = info.default_chunks if chunks is None else chunks
    if placement is None or placement == info.placement or _same_map(info.placement, placement,
                                                                      n_devices, v):
        return info.generator(n_devices, n_microbatches, v)
    if name in _PLACEMENT_CHOICES:
        return info.generator(n_devices, n_microbatches, v, placement=placement)
    why = _PLACEMENT_FIXED.get(name, "its order is derived for that placement")
    raise ScheduleError(f"{name} uses placement {info.placement!r} only ({why}), got "
                        f"placement={placement!r}; omit placement or pick looped_bfs for 'v'")


def _same_map(style: str, other: str, n_devices: int, chunks: int) -> bool:
    """Whether two placement styles give the same stage → device map (e.g. any style, 1 chunk)."""
    styles = PLACEMENT_STYLES
    return (style in styles and other in styles and isinstance(chunks, int) and chunks >= 1
            and n_devices >= 1 and styles[style](n_devices, chunks) == styles[other](n_devices, chunks))


_PLACEMENT_CHOICES = {"looped_bfs"}
_PLACEMENT_FIXED = {
    "interleaved": "its depth-first warm-up deadlocks under a V placement for many shapes",
    "zbh1": "its depth-first warm-up deadlocks under a V placement for many shapes",
    "zbv": "the V is the schedule", "dualpipev": "the V is the schedule",
    "hanayo": "its waves are the zig-zag", "chimera": "its two pipelines run in opposite directions",
}


def _chunks_for(name: str, n_devices: int, n_microbatches: int, chunks: int | None) -> int:
    """The chunk count the formulas use: the entry's natural one for None, checked by its rule."""
    if name not in SCHEDULES:
        raise ScheduleError(f"no formula for schedule {name!r}; known: {', '.join(FORMULA_SCHEDULES)}")
    if n_devices < 1 or n_microbatches < 1:
        raise ScheduleError(f"n_devices and n_microbatches must be at least 1, got "
                            f"{n_devices} and {n_microbatches}")
    info = SCHEDULES[name]
    v = info.default_chunks if chunks is None else int(chunks)
    if v < 1:
        raise ScheduleError(f"chunks must be at least 1, got {chunks}")
    if not info.chunk_rule.allows(v):
        raise ScheduleError(f"{name} needs {info.chunk_rule.text}, got chunks={v}")
    return v


def bubble_ratio(name: str, n_devices: int, n_microbatches: int, chunks: int | None = None,
                 costs: fm.Costs = fm.UNIT_COSTS) -> float:
    """Closed-form idle fraction of a device's step for schedule `name` (uniform stages).

    `costs` = (f, i, w) per stage and micro-batch; only the split-backward schedules (zbh1,
    zbh2, zbv, dualpipev) depend on it.
    """
    v = _chunks_for(name, n_devices, n_microbatches, chunks)
    return float(SCHEDULES[name].bubble(n_devices, n_microbatches, v, tuple(float(x) for x in costs)))


def inflight_microbatches(name: str, n_devices: int, device: int, n_microbatches: int,
                          chunks: int | None = None) -> float:
    """Peak number of stage-activations (one stage, one micro-batch each) live on `device`.

    For a multi-chunk schedule the unit is still a single stage's activations, so a device
    holding both chunks of one micro-batch counts 2. Multiply by a stage's activation bytes per
    micro-batch to get bytes (uniform stages).
    """
    v = _chunks_for(name, n_devices, n_microbatches, chunks)
    if not 0 <= device < n_devices:
        raise ScheduleError(f"device {device} is outside 0..{n_devices - 1}")
    return SCHEDULES[name].inflight(n_devices, device, n_microbatches, v)


__all__ = [
    "FORMULA_SCHEDULES",
    "SCHEDULES",
    "SCHEDULE_PRESETS",
    "Baseline",
    "ScheduleInfo",
    "baselines",
    "bubble_ratio",
    "build_schedule",
    "inflight_microbatches",
    "schedule_info",
]
