"""SmtVerdict: what an SMT check concluded, with a counterexample a user can read."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class SmtVerdict:
    """`ok` is the answer (an execution exists); on failure `explanation` lists who waits on
    whom (or which device overflows) and `grid` prints the table with the culprit cell marked.

    `cycle` holds (device, column, cell, waits-for) steps of a deadlock; `witness` maps each
    device to its activation+buffer peak in the execution found (memory checks).
    """

    ok: bool
    check: str
    semantics: str
    solve_time_s: float
    n_events: int = 0
    n_constraints: int = 0
    explanation: str = ""
    grid: str = ""
    cycle: tuple[tuple[int, int, str, str], ...] = ()
    witness: dict = field(default_factory=dict, compare=False)

    def __bool__(self) -> bool:
        return self.ok

    def report(self) -> str:
        head = (f"{self.check} under {self.semantics}: "
                f"{'yes' if self.ok else 'NO'} ({self.solve_time_s:.2f} s, {self.n_events} events, "
                f"{self.n_constraints} constraints)")
        return "\n".join(x for x in (head, self.explanation, self.grid) if x)
