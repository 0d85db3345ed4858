"""The registry of named schedules: generator, natural chunk count, constraints, torch's name."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from octopipe.errors import ScheduleError
from octopipe.schedule import generators as gen
from octopipe.schedule.generators._common import PLACEMENT_STYLES
from octopipe.schedule.table import ScheduleTable

Generator = Callable[[int, int, int], ScheduleTable]


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


SCHEDULES: dict[str, ScheduleInfo] = {info.name: info for info in (
    ScheduleInfo("gpipe", gen.gpipe, 1, False, "loop", "ScheduleGPipe",
                 "chunks = 1", "Huang et al. 2019, GPipe"),
    ScheduleInfo("1f1b", gen.one_f_one_b, 1, False, "loop", "Schedule1F1B",
                 "chunks = 1; n_microbatches >= n_devices", "Narayanan et al. 2021, PipeDream-Flush"),
    ScheduleInfo("interleaved", gen.interleaved, 2, False, "loop", "ScheduleInterleaved1F1B",
                 "any chunks >= 1 and n_microbatches >= 1 (torch additionally needs m divisible "
                 "by max(1, m // p))", "Narayanan et al. 2021 §2.2.2, Megatron virtual pipeline"),
    ScheduleInfo("looped_bfs", gen.looped_bfs, 2, False, "loop", "ScheduleLoopedBFS",
                 "any chunks >= 1", "Lamy-Poirier 2023, breadth-first pipeline parallelism"),
    ScheduleInfo("zbh1", gen.zbh1, 1, True, "loop", "ScheduleInterleavedZeroBubble",
                 "any chunks >= 1 (torch builds chunks >= 2)", "Qi et al. 2024, ZB-H1 / ZB1P"),
    ScheduleInfo("zbh2", gen.zbh2, 1, True, "loop", None,
                 "chunks = 1", "Qi et al. 2024, ZB-H2"),
    ScheduleInfo("zbv", gen.zbv, 2, True, "v", "ScheduleZBVZeroBubble",
                 "chunks = 2", "Qi et al. 2024 §6, ZB-V"),
    ScheduleInfo("dualpipev", gen.dualpipev, 2, True, "v", "ScheduleDualPipeV",
                 "chunks = 2; n_microbatches >= 2 * n_devices", "DeepSeek-AI 2024, DualPipe(V)"),
    ScheduleInfo("chimera", gen.chimera, 1, False, "bidirectional", None,
                 "chunks = 1 per direction; n_devices even; n_microbatches even",
                 "Li & Hoefler SC'21, Chimera"),
    ScheduleInfo("hanayo", gen.hanayo, 2, False, "v", None,
                 "chunks even (2 per wave)", "Liu et al. SC'23, Hanayo"),
    ScheduleInfo("pipedream", gen.pipedream, 1, False, "loop", None,
                 "chunks = 1 (asynchronous: see generators.weight_versions)",
                 "Narayanan et al. SOSP'19, PipeDream 1F1B with weight stashing"),
)}


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


__all__ = ["SCHEDULES", "ScheduleInfo", "build_schedule", "schedule_info"]
