"""`solver`: the MILP backend (solvers/) and the solver comparison (`mode=solvers`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from octopipe.config.convert import check
from octopipe.config.fields import setting


@dataclass(frozen=True)
class SolverCompare:
    """`mode=solvers`: which instances the comparison runs; null keeps the built-in set."""

    small: bool = setting(False, "true: tiny instances, a quick smoke run")
    models: tuple[str, ...] | None = setting(None, "model presets, e.g. [nemotron_h_8b, llama3_8b]")
    clusters: tuple[str, ...] | None = setting(None, "cluster presets, e.g. [h100_4x8]")
    stages: tuple[int, ...] | None = setting(None, "stage counts, e.g. [4, 8, 16, 32]", ge=1)
    joint_max_stages: int | None = setting(None, "largest stage count of the joint ILP", ge=1)
    plain_time_limit_s: float | None = setting(None, "time limit of the plain ILP", gt=0)


@dataclass(frozen=True)
class SolverConfig:
    """Which MILP backend to use and how long it may run."""

    name: Literal["cbc", "highs"] = setting("cbc", "cbc (bundled with PuLP) | highs (highspy)")
    time_limit_s: float = setting(30.0, "cap of one solve", gt=0)
    max_nodes: int | None = setting(None, "branch-and-bound nodes of one solve at most (a "
                                          "deterministic limit, unlike time_limit_s); null: none",
                                    ge=1)
    gap: float = setting(0.0, "relative MIP gap at which the solver may stop (0 = prove "
                              "optimality)", ge=0, lt=1)
    threads: int = setting(1, "threads, for backends that accept it", ge=1)
    msg: bool = setting(False, "print the backend's log")
    cbc_options: tuple[str, ...] = setting((), "extra CBC options, e.g. [\"preprocess off\"]")
    compare: SolverCompare = setting(SolverCompare(), "mode=solvers: the instance set")

    def __post_init__(self) -> None:
        check(self, "solver.")
