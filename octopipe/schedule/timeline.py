"""The device timeline: what every device computes and sends over time, drawn as one PNG.

`Timeline` holds the timed work of a pipeline as flat arrays (compute slices and transfers);
the simulator (`octopipe.sim.trace.sim_timeline`) and the idealized table
(`octopipe.schedule.render.idealized_timeline`) build one. `save_timeline_png` draws it:

- one wide row per device, its compute slices coloured by kind (`octopipe.schedule.palette`)
  over a hatched grey background, so what no slice covers reads as idle time;
- under each row a thin strip of the transfers the device sends (activations and gradients
  in the light tones of F and B);
- the action (``3F5``: stage 3, forward, micro-batch 5) written inside slices wide enough for
  it, the micro-batch alone inside narrower ones, nothing in the narrowest;
- a legend of the kinds drawn, the transfers and idle time.

Slices and transfers are drawn as one polygon collection each, so plans with tens of
thousands of actions take about a second.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from octopipe.errors import ScheduleError
from octopipe.report.figures import pyplot, save
from octopipe.schedule import palette

_MAX_LABELS = 3000        # text objects are the slow part of a large figure
_DPI = 110


@dataclass(frozen=True, eq=False)
class Timeline:
    """Compute slices (`device`, `kind`, `start`, `end`, `stage`, `microbatch`; one entry per
    slice, stage and micro-batch -1 when unknown) and transfers (`t_src`, `t_dst`, `t_kind` as
    ``SEND_F``/``SEND_B``, `t_start`, `t_end`) of `n_devices` devices; `time_unit` is ``s``
    (drawn in ms or s) or ``slot``."""

    n_devices: int
    device: np.ndarray
    kind: tuple[str, ...]
    start: np.ndarray
    end: np.ndarray
    stage: np.ndarray
    microbatch: np.ndarray
    t_src: np.ndarray
    t_dst: np.ndarray
    t_kind: tuple[str, ...]
    t_start: np.ndarray
    t_end: np.ndarray
    time_unit: str = "s"

    def __post_init__(self) -> None:
        n, t = len(self.device), len(self.t_src)
        if not all(len(a) == n for a in (self.kind, self.start, self.end, self.stage, self.microbatch)):
            raise ScheduleError("a timeline's compute arrays differ in length")
        if not all(len(a) == t for a in (self.t_dst, self.t_kind, self.t_start, self.t_end)):
            raise ScheduleError("a timeline's transfer arrays differ in length")
        if n and (np.any(self.end < self.start) or self.device.min() < 0
                  or self.device.max() >= self.n_devices):
            raise ScheduleError("a timeline slice ends before it starts or sits on no device")
        if self.time_unit not in ("s", "slot"):
            raise ScheduleError(f"time_unit {self.time_unit!r}: expected 's' or 'slot'")

    @property
    def span(self) -> float:
        ends = [float(self.end.max())] if len(self.end) else []
        ends += [float(self.t_end.max())] if len(self.t_end) else []
        return max(ends, default=0.0)

    @property
    def n_compute(self) -> int:
        return len(self.device)

    def labels(self) -> tuple[list[str], list[str]]:
        """Per slice, the long label (``3F5``) and the short one (``5``), empty when unknown."""
        long_, short = [], []
        for k, s, m in zip(self.kind, self.stage.tolist(), self.microbatch.tolist()):
            long_.append(f"{s}{k}{m}" if s >= 0 and m >= 0 else "")
            short.append(str(m) if m >= 0 else "")
        return long_, short


def timeline(n_devices: int, compute: dict, transfers: dict | None = None,
             time_unit: str = "s") -> Timeline:
    """A Timeline from per-slice sequences: `compute` has device, kind, start, end and
    optionally stage, microbatch; `transfers` has src, dst, kind, start, end."""
    n = len(compute["device"])
    tr = transfers or {"src": [], "dst": [], "kind": [], "start": [], "end": []}
    i64 = lambda x: np.asarray(x, dtype=np.int64).reshape(-1)
    f64 = lambda x: np.asarray(x, dtype=np.float64).reshape(-1)
    return Timeline(int(n_devices), i64(compute["device"]), tuple(str(k) for k in compute["kind"]),
                    f64(compute["start"]), f64(compute["end"]),
                    i64(compute.get("stage", [-1] * n)), i64(compute.get("microbatch", [-1] * n)),
                    i64(tr["src"]), i64(tr["dst"]), tuple(str(k) for k in tr["kind"]),
                    f64(tr["start"]), f64(tr["end"]), time_unit)


@dataclass(frozen=True)
class _Layout:
    """Figure geometry: row band offsets (y grows downwards: device d is centred on d)."""

    width_in: float
    height_in: float
    bar_top: float = -0.42
    bar_bottom: float = 0.22
    strip_top: float = 0.27
    strip_bottom: float = 0.42
    font: float = 6.5


def _layout(tl: Timeline) -> _Layout:
    per_device = tl.n_compute / max(1, tl.n_devices)
    width = float(np.clip(6.0 + 0.045 * per_device, 10.0, 24.0))
    row = 0.55 if tl.n_devices <= 8 else (0.42 if tl.n_devices <= 16 else 0.32)
    font = 6.5 if tl.n_devices <= 16 else 5.5
    if len(tl.t_src) == 0:  # no send strips: the bars take the whole row
        return _Layout(width, 1.7 + 0.8 * row * tl.n_devices, bar_top=-0.38, bar_bottom=0.38, font=font)
    return _Layout(width, 1.7 + row * tl.n_devices, font=font)


def _rects(y0: np.ndarray, y1: np.ndarray, x0: np.ndarray, x1: np.ndarray) -> np.ndarray:
    """(n, 4, 2) polygon vertices of axis-aligned rectangles."""
    return np.stack([np.stack([x0, y0], 1), np.stack([x1, y0], 1), np.stack([x1, y1], 1),
                     np.stack([x0, y1], 1)], 1)


def _scale(tl: Timeline) -> tuple[float, str]:
    if tl.time_unit == "slot":
        return 1.0, "slot"
    return (1e3, "ms") if tl.span < 10 else (1.0, "s")


def save_timeline_png(path: str | Path, tl: Timeline, title: str = "") -> Path:
    """Draw `tl` (see the module docstring) with the Agg backend and save a PNG at `path`."""
    plt = pyplot()
    from matplotlib.collections import PolyCollection  # heavy: only where a picture is drawn
    from matplotlib.patches import Patch  # heavy: only where a picture is drawn

    if tl.n_devices < 1 or tl.n_compute == 0:
        raise ScheduleError("a timeline picture needs at least one device and one slice")
    lay = _layout(tl)
    scale, unit = _scale(tl)
    span = tl.span * scale or 1.0
    dev = tl.device.astype(float)
    x0, x1 = tl.start * scale, tl.end * scale
    fig, ax = plt.subplots(figsize=(lay.width_in, lay.height_in))
    try:
        rows = np.arange(tl.n_devices, dtype=float)
        ax.add_collection(PolyCollection(
            _rects(rows + lay.bar_top, rows + lay.bar_bottom, np.zeros_like(rows), np.full_like(rows, span)),
            facecolors=palette.IDLE_FACE, edgecolors=palette.IDLE_HATCH, linewidths=0, hatch="////"))
        faces = [palette.kind_colour(k) for k in tl.kind]
        px_per_unit = lay.width_in * 0.86 * _DPI / span
        wide = ((x1 - x0) * px_per_unit > 6).tolist()
        edges = [palette.EDGE if w else f for w, f in zip(wide, faces)]
        ax.add_collection(PolyCollection(
            _rects(dev + lay.bar_top, dev + lay.bar_bottom, x0, x1), facecolors=faces,
            edgecolors=edges, linewidths=0.4))
        if len(tl.t_src):
            t_faces = [palette.kind_colour(k) for k in tl.t_kind]
            src = tl.t_src.astype(float)
            ax.add_collection(PolyCollection(
                _rects(src + lay.strip_top, src + lay.strip_bottom, tl.t_start * scale, tl.t_end * scale),
                facecolors=t_faces, edgecolors=t_faces, linewidths=0.6))
        _labels(ax, tl, lay, x0, x1, px_per_unit)
        ax.set_xlim(0, span * 1.005)
        ax.set_ylim(tl.n_devices - 0.5, -0.5)
        ax.set_yticks(rows, [f"dev {d}" for d in range(tl.n_devices)],
                      fontsize=8 if tl.n_devices <= 16 else 6.5)
        ax.tick_params(axis="y", length=0)
        for side in ("top", "right", "left"):
            ax.spines[side].set_visible(False)
        ax.set_xlabel(f"time ({unit})        labels: 3F5 = stage 3, F, micro-batch 5 "
                      "(the micro-batch alone where narrow)", fontsize=9)
        handles = [Patch(facecolor=palette.kind_colour(k), label=k)
                   for k in dict.fromkeys(sorted(set(tl.kind), key=_kind_order))]
        names = {"SEND_F": "activation sent", "SEND_B": "gradient sent"}
        handles += [Patch(facecolor=palette.kind_colour(k), label=names.get(k, k))
                    for k in sorted(set(tl.t_kind), reverse=True)]
        handles.append(Patch(facecolor=palette.IDLE_FACE, edgecolor=palette.IDLE_HATCH, hatch="////",
                             linewidth=0, label="idle"))
        ax.legend(handles=handles, loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=len(handles),
                  fontsize=8, frameon=False, handlelength=1.6, columnspacing=1.2, borderaxespad=0.2)
        if title:
            ax.set_title(title, loc="left", fontsize=10, pad=20)
        return save(fig, path, dpi=_DPI)
    finally:
        plt.close(fig)      # also when drawing failed; closing a saved figure again is harmless


def _kind_order(kind: str) -> tuple[int, str]:
    order = palette.COMPUTE_ORDER
    return (order.index(kind) if kind in order else len(order), kind)


def _labels(ax, tl: Timeline, lay: _Layout, x0: np.ndarray, x1: np.ndarray, px_per_unit: float) -> None:
    """The action inside each slice wide enough for it, else the micro-batch, else nothing."""
    char_px = 0.62 * lay.font * _DPI / 72
    width_px = (x1 - x0) * px_per_unit
    long_, short = tl.labels()
    y = tl.device + (lay.bar_top + lay.bar_bottom) / 2
    drawn = 0
    order = np.argsort(-width_px, kind="stable")
    for c in order.tolist():
        if drawn >= _MAX_LABELS or width_px[c] < char_px + 3:
            break
        text = long_[c] if len(long_[c]) * char_px + 3 <= width_px[c] else short[c]
        if not text or len(text) * char_px + 3 > width_px[c]:
            continue
        ax.text((x0[c] + x1[c]) / 2, y[c], text, ha="center", va="center", fontsize=lay.font,
                color=palette.kind_style(tl.kind[c]).text, clip_on=True)
        drawn += 1


__all__ = ["Timeline", "save_timeline_png", "timeline"]
