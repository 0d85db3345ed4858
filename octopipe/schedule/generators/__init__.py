"""Named schedule generators: pure functions (n_devices, n_microbatches, chunks) -> ScheduleTable.

Each family fixes its placement style (loop, V or bidirectional; see library.SCHEDULES). Tables
that torch also builds keep torch's idle cells (interleaved, looped_bfs, zbv; zbh1 is aligned by
the full dependency rule); tables built by unit-slot list scheduling (zbh2, chimera, hanayo) are
time-aligned at unit costs; the others (gpipe, 1f1b, pipedream, dualpipev) are compact. An
impossible request raises ScheduleError naming the constraint and a shape that satisfies it.
"""
from octopipe.schedule.generators.chimera import chimera
from octopipe.schedule.generators.dualpipev import dualpipev
from octopipe.schedule.generators.gpipe import gpipe
from octopipe.schedule.generators.hanayo import hanayo
from octopipe.schedule.generators.interleaved import interleaved
from octopipe.schedule.generators.looped_bfs import looped_bfs
from octopipe.schedule.generators.one_f_one_b import one_f_one_b
from octopipe.schedule.generators.pipedream import (
                                                     forward_version,
                                                     pipedream,
                                                     pipedream_2bw,
                                                     pipedream_vsync,
                                                     weight_versions,
)
from octopipe.schedule.generators.zbv import zbv
from octopipe.schedule.generators.zero_bubble import zbh1, zbh2

__all__ = [
                                                     "chimera",
                                                     "dualpipev",
                                                     "forward_version",
                                                     "gpipe",
                                                     "hanayo",
                                                     "interleaved",
                                                     "looped_bfs",
                                                     "one_f_one_b",
                                                     "pipedream",
                                                     "pipedream_2bw",
                                                     "pipedream_vsync",
                                                     "weight_versions",
                                                     "zbh1",
                                                     "zbh2",
                                                     "zbv",
]
