"""Named schedule generators: pure functions (n_devices, n_microbatches, chunks) -> ScheduleTable."""
from octopipe.schedule.generators.chimera import chimera
from octopipe.schedule.generators.dualpipev import dualpipev
from octopipe.schedule.generators.gpipe import gpipe
from octopipe.schedule.generators.hanayo import hanayo
from octopipe.schedule.generators.interleaved import interleaved
from octopipe.schedule.generators.looped_bfs import looped_bfs
from octopipe.schedule.generators.one_f_one_b import one_f_one_b
from octopipe.schedule.generators.pipedream import forward_version, pipedream, weight_versions
from octopipe.schedule.generators.zbv import zbv
from octopipe.schedule.generators.zero_bubble import zbh1, zbh2

__all__ = ["chimera", "dualpipev", "gpipe", "hanayo", "interleaved", "looped_bfs", "one_f_one_b",
           "pipedream", "weight_versions", "forward_version", "zbv", "zbh1", "zbh2"]
