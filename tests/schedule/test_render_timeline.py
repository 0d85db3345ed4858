"""The device timeline PNG, the shared palette and the trace JSON of fixed plans."""
from __future__ import annotations

import io
import json
import struct
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from octopipe.errors import ScheduleError
from octopipe.schedule import palette, render
from octopipe.schedule.idealized import idealize
from octopipe.schedule.library import build_schedule
from octopipe.schedule.render import bars_trace, idealized_timeline_png, idealized_trace, print_grid
from octopipe.schedule.timeline import save_timeline_png, timeline
from octopipe.sim import Simulator
from octopipe.sim.trace import sim_timeline, sim_timeline_png, sim_trace
from octopipe.tune.report_md import plan_timeline_png, sim_bars

FIXTURE = Path(__file__).parent / "data" / "traces_before.json"


def _sim(name: str, p: int, m: int):
    return Simulator(build_schedule(name, p, m)).uniform(1.0, 2.0, transfer=0.25).run()


def _png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", head[16:24])


@pytest.mark.parametrize("name,p,m", [("1f1b", 2, 2), ("zbv", 4, 8), ("interleaved", 8, 16),
                                      ("zbv", 32, 64)])
def test_sim_timeline_png_for_several_shapes(tmp_path, name, p, m):
    res = _sim(name, p, m)
    path = sim_timeline_png(res, tmp_path / "t.png")
    width, height = _png_size(path)
    assert width >= 1000 and height >= 150
    # device rows dominate: the figure grows with the devices, not with the links between them
    assert height < 200 + 60 * p


def test_the_plan_timeline_has_one_row_per_device_not_per_link(tmp_path):
    res = _sim("zbv", 4, 8)
    tl = sim_timeline(res)
    assert tl.n_devices == 4 and len(tl.t_src) == res.program.n_transfers
    path = plan_timeline_png(tmp_path / "plan.png", res, "plan")
    assert _png_size(Path(path))[1] < 500


def test_idealized_and_single_slice_timelines(tmp_path):
    it = idealize(build_schedule("zbh1", 3, 4), "1:1:1")
    assert _png_size(idealized_timeline_png(tmp_path / "i.png", it))[0] >= 1000
    one = timeline(1, {"device": [0], "kind": ["F"], "start": [0.0], "end": [1.0]})
    assert one.labels() == ([""], [""])
    assert save_timeline_png(tmp_path / "one.png", one, "one").exists()


def test_a_timeline_refuses_inconsistent_arrays():
    with pytest.raises(ScheduleError, match="differ in length"):
        timeline(1, {"device": [0, 0], "kind": ["F"], "start": [0.0], "end": [1.0]})
    with pytest.raises(ScheduleError, match="ends before it starts or sits on no device"):
        timeline(1, {"device": [1], "kind": ["F"], "start": [0.0], "end": [1.0]})
    with pytest.raises(ScheduleError, match="at least one device and one slice"):
        save_timeline_png("unused.png", timeline(1, {"device": [], "kind": [], "start": [], "end": []}))


def _has_colour(path: Path, hex_colour: str) -> bool:
    import matplotlib.colors as mcolors  # optional heavy dependency, as in the renderers
    import matplotlib.image as mimage

    rgb = np.array(mcolors.to_rgb(hex_colour))
    img = mimage.imread(str(path))[..., :3]
    return bool((np.abs(img - rgb).max(axis=-1) < 1.5 / 255).any())


def test_every_picture_draws_f_i_w_b_in_the_palette_colours(tmp_path):
    assert render.kind_colour is palette.kind_colour and render.palette is palette
    res = Simulator(build_schedule("zbh1", 3, 6)).uniform(1.0, 1.0, w=1.0, transfer=0.25).run()
    pictures = [sim_timeline_png(res, tmp_path / "sim.png"),
                Path(plan_timeline_png(tmp_path / "plan.png", res, "plan")),
                idealized_timeline_png(tmp_path / "ideal.png", idealize(build_schedule("zbh1", 3, 6), "1:1:1"))]
    for path in pictures:
        for colour in (palette.F, palette.I, palette.W):
            assert _has_colour(path, colour.face), (path.name, colour)
    b_picture = sim_timeline_png(_sim("1f1b", 2, 2), tmp_path / "b.png")
    assert _has_colour(b_picture, palette.B.face)


def test_the_terminal_grid_uses_the_palette_styles():
    console = Console(file=io.StringIO(), record=True, width=80, force_terminal=True)
    print_grid(build_schedule("zbh1", 2, 2), console=console)
    styles = {str(seg.style) for seg in console._record_buffer if seg.style}
    assert {palette.F.terminal, palette.I.terminal, palette.W.terminal} <= styles


def test_trace_json_is_unchanged_for_fixed_plans():
    """The traces of the render rework are those recorded before it (tests/schedule/data)."""
    now = {}
    for name, p, m in (("zbv", 2, 4), ("1f1b", 3, 3)):
        res = _sim(name, p, m)
        now[f"{name}_sim"] = sim_trace(res)
        now[f"{name}_plan"] = bars_trace(sim_bars(res))
    now["zbh1_idealized"] = idealized_trace(idealize(build_schedule("zbh1", 2, 3), "1:1:1"))
    text = json.dumps(now, sort_keys=True, separators=(",", ":"))
    assert text == FIXTURE.read_text()
