"""The MILP backend: CBC through PuLP's current API, and a clear error when it is missing."""
from __future__ import annotations

import warnings

import pulp
import pytest

from octopipe.errors import SolverUnavailableError
from solvers import backend
from solvers.backend import SolverConfig, make_solver, run_model


def test_cbc_solves_through_coin_cmd_without_deprecations():
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        solver = make_solver(SolverConfig())
        prob = pulp.LpProblem("tiny", pulp.LpMinimize)
        x = prob.add_variable("x", lowBound=0, upBound=3, cat=pulp.LpInteger)
        prob += -x
        prob += x <= 2.5, "cap"
        out = run_model(prob, SolverConfig())
    assert isinstance(solver, pulp.COIN_CMD)
    assert out.proven_optimal and out.objective == pytest.approx(-2.0)


def test_missing_cbc_is_named(monkeypatch):
    monkeypatch.setattr(pulp.apis.coin_api, "pulp_cbc_path", "/nonexistent/cbc")
    monkeypatch.setattr(backend.shutil, "which", lambda name: None)
    with pytest.raises(SolverUnavailableError, match="pulp\\[cbc\\]"):
        make_solver(SolverConfig())
