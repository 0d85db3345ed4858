"""SMT (z3) checks of lowered tables: deadlock-freedom and memory feasibility."""
from solvers.smt.deadlock import check_deadlock_free
from solvers.smt.events import SEMANTICS, build_event_graph
from solvers.smt.memory import check_memory_feasible
from solvers.smt.verdict import SmtVerdict

__all__ = ["SEMANTICS", "SmtVerdict", "build_event_graph", "check_deadlock_free", "check_memory_feasible"]
