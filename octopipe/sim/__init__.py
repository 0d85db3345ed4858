"""Graph-based, communication-aware pipeline simulator (docs/simulator.md).

`Simulator(table or plan, cost, cluster)` compiles a table once into flat arrays (`program`),
binds durations (`durations`) and runs the event engine (`engine`) under a policy and a
communication semantics; results are `SimResult`s. Deadlock semantics: `octopipe.sim.deadlock`.
"""
from octopipe.sim.deadlock import Deadlock, Wait
from octopipe.sim.durations import Durations, bind
from octopipe.sim.program import Program, compile_table
from octopipe.sim.sim_result import CAUSES, SimResult
from octopipe.sim.simulator import HINTS, POLICIES, ReadyFirst, Simulator, find_deadlock, simulate
from octopipe.sim.variability import Jitter, MonteCarlo

__all__ = [
           "CAUSES",
           "HINTS",
           "POLICIES",
           "Deadlock",
           "Durations",
           "Jitter",
           "MonteCarlo",
           "Program",
           "ReadyFirst",
           "SimResult",
           "Simulator",
           "Wait",
           "bind",
           "compile_table",
           "find_deadlock",
           "simulate",
]
