"""Small clusters and cost tables for the tuner's tests, and brute force over frozen plans."""
from collections.abc import Iterable, Iterator

from octopipe.cluster import Cluster, DeviceKind, Link
from octopipe.errors import InfeasibleError
from octopipe.tune.candidate import Candidate, Problem
from octopipe.tune.evaluate import evaluate
from octopipe.tune.freeze import to_plan


def free_cluster(n: int, memory_bytes: float = 1e18, latency: float = 0.0,
                 bandwidth: float = 1e30) -> Cluster:
    """`n` identical devices in one node; links free unless told otherwise."""
    dk = DeviceKind("dev", 1e15, memory_bytes, 3e12)
    link = Link("link", bandwidth, latency)
    return Cluster("test", (dk,), (0,) * n, (0,) * n, link, link)


def simulated_makespans(problem: Problem, candidates: Iterable[Candidate]) -> Iterator[tuple[Candidate, float]]:
    """Each candidate the tuner can freeze into a feasible plan, with its simulated makespan
    (the simulator's memory check included): what a bound must stay below."""
    for cand in candidates:
        est = problem.estimate(cand)
        if not est.complete:
            continue
        try:
            ev = evaluate(problem, "x", "octopipe", to_plan(problem, cand, est))
        except InfeasibleError:
            continue
        if ev.feasible:
            yield cand, ev.makespan_s
