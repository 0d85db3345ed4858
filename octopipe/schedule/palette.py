"""The colours of F, I, W and B, of transfers and of idle time in every picture OctoPipe draws.

The PNG timelines (plan, simulation, idealized table), the generic Gantt chart and the coloured
terminal grid all read their colours here, so an F is the same blue everywhere. Chrome/Perfetto
traces carry no colours: Perfetto ignores the `cname` field by design and chrome://tracing
only knows a fixed set of reserved names, so the traces name each slice's kind in `cat` instead.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass


@dataclass(frozen=True)
class KindColour:
    """How one action kind is drawn: `face` (matplotlib), `text` (label on the face),
    `terminal` and `terminal_chunk` (rich styles; the second for a device's second chunk)."""

    face: str
    text: str
    terminal: str
    terminal_chunk: str


F = KindColour("#4C78A8", "white", "bold white on blue", "bold white on dark_blue")
I = KindColour("#ECA82C", "black", "bold black on yellow", "bold black on dark_orange")
W = KindColour("#B279A2", "white", "bold white on magenta", "bold white on purple4")
B = KindColour("#54A24B", "white", "bold white on green", "bold white on dark_green")
SEND_F = KindColour("#6BAED6", "black", "cyan", "cyan")
RECV_F = KindColour("#C6DBEF", "black", "cyan", "cyan")
SEND_B = KindColour("#74C476", "black", "bright_green", "bright_green")
RECV_B = KindColour("#C7E9C0", "black", "bright_green", "bright_green")

KINDS: dict[str, KindColour] = {"F": F, "I": I, "W": W, "B": B, "SEND_F": SEND_F,
                                "RECV_F": RECV_F, "SEND_B": SEND_B, "RECV_B": RECV_B}
COMPUTE_ORDER = ("F", "I", "W", "B")

IDLE_FACE = "#F4F4F4"    # the background of a device row: what no bar covers is idle
IDLE_HATCH = "#CFCFCF"
EDGE = "white"           # the thin line between adjacent bars
_EXTRA = ("#E45756", "#72B7B2", "#FF9DA6", "#9D755D", "#BAB0AC", "#F58518", "#EECA3B")


def kind_style(kind: str) -> KindColour:
    """The colours of a kind name (``F``, ``SEND_B``); any other name gets a stable colour."""
    if kind in KINDS:
        return KINDS[kind]
    face = _EXTRA[zlib.crc32(kind.encode()) % len(_EXTRA)]
    return KindColour(face, "black", "bold black on white", "bold black on white")


def kind_colour(kind: str) -> str:
    """The matplotlib colour of a kind name."""
    return kind_style(kind).face


__all__ = [
    "COMPUTE_ORDER",
    "EDGE",
    "IDLE_FACE",
    "IDLE_HATCH",
    "KINDS",
    "RECV_B",
    "RECV_F",
    "SEND_B",
    "SEND_F",
    "B",
    "F",
    "I",
    "KindColour",
    "W",
    "kind_colour",
    "kind_style",
]
