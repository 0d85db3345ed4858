"""The action IR: the same vocabulary and string form as torch.distributed.pipelining."""
from __future__ import annotations

import re
from enum import Enum
from typing import NamedTuple

from octopipe.errors import ScheduleError


class ActionKind(str, Enum):
    F = "F"
    I = "I"
    W = "W"
    B = "B"
    SEND_F = "SEND_F"
    RECV_F = "RECV_F"
    SEND_B = "SEND_B"
    RECV_B = "RECV_B"

    @property
    def is_compute(self) -> bool:
        return self in COMPUTE_KINDS

    @property
    def is_comm(self) -> bool:
        return not self.is_compute

    def __str__(self) -> str:
        return self.value


COMPUTE_KINDS = frozenset({ActionKind.F, ActionKind.I, ActionKind.W, ActionKind.B})
F, I, W, B = ActionKind.F, ActionKind.I, ActionKind.W, ActionKind.B
SEND_F, RECV_F, SEND_B, RECV_B = (ActionKind.SEND_F, ActionKind.RECV_F,
                                  ActionKind.SEND_B, ActionKind.RECV_B)

_ACTION_RE = re.compile(r"(\d+)(SEND_F|RECV_F|SEND_B|RECV_B|F|I|W|B)(\d+)")
_LEGACY_BW_RE = re.compile(r"\d+BW\d*")


class Action(NamedTuple):
    """One cell of a schedule table: stage, kind and micro-batch (`2F0`, `3I1`, `1SEND_F3`)."""

    stage: int
    kind: ActionKind
    microbatch: int

    def __str__(self) -> str:
        return f"{self.stage}{self.kind.value}{self.microbatch}"

    __repr__ = __str__

    @classmethod
    def parse(cls, text: str) -> Action:
        """Parse torch's string form with a full match; reject the legacy `BW` token."""
        token = text.strip()
        if _LEGACY_BW_RE.fullmatch(token):
            raise ScheduleError(
                f"legacy token {token!r}: 'BW' meant full backward in 2024 torch CSVs; "
                "write it as B (full backward) or as I then W (split backward)")
        m = _ACTION_RE.fullmatch(token)
        if m is None:
            raise ScheduleError(
                f"cannot parse action {token!r}: expected <stage><F|I|W|B|SEND_F|RECV_F|SEND_B|RECV_B>"
                "<microbatch>, e.g. 2F0 or 1SEND_B3")
        return cls(int(m.group(1)), ActionKind(m.group(2)), int(m.group(3)))
