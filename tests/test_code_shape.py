"""The code's shape in octopipe/ and solvers/: no function takes more than 8 parameters (bundle
them in a value), no module is over 500 lines and no function over 100, the Python twins of the
C kernels excepted (they stay step for step the oracles of `sim/strict.c` and `tune/listsched.c`)."""
from __future__ import annotations

import ast

from tests.package_sources import modules, source, tree

MAX_PARAMETERS = 8
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 100
# the Python twins of the C kernels: each mirrors its kernel's single loop, step for step
LONG_TWINS = frozenset({"octopipe.sim.engine.run_strict_py", "octopipe.tune.listsched._list_schedule_py"})

# "module.function" -> why its long list is the point (flat arrays for an inner loop). Keep the
# reason in the function's docstring too ("flat arrays for the inner loop: ...").
ALLOWED: dict[str, str] = {}


def _function_defs() -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    """'module.[Class.]function' -> its definition, for every function in octopipe/ and solvers/."""
    out: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {}

    def visit(mod: str, node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out[f"{mod}.{prefix}{child.name}"] = child
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                visit(mod, child, f"{prefix}{child.name}.")
            else:
                visit(mod, child, prefix)

    for mod in modules():
        visit(mod, tree(mod), "")
    return out


def _parameters(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """The parameter count (self and cls not counted)."""
    a = fn.args
    n = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + bool(a.vararg) + bool(a.kwarg)
    first = (a.posonlyargs + a.args)[:1]
    return n - 1 if first and first[0].arg in ("self", "cls") else n


DEFS = _function_defs()
FUNCTIONS = {name: _parameters(fn) for name, fn in DEFS.items()}


def test_no_function_takes_more_than_eight_parameters():
    long = sorted(f"{name}: {n} parameters" for name, n in FUNCTIONS.items()
                  if n > MAX_PARAMETERS and name not in ALLOWED)
    assert not long, (f"functions with more than {MAX_PARAMETERS} parameters (bundle them in a "
                      "frozen value, or name a flat-array inner loop in ALLOWED):\n" + "\n".join(long))


def test_the_allow_list_names_only_long_functions_that_exist():
    stale = sorted(name for name in ALLOWED if FUNCTIONS.get(name, 0) <= MAX_PARAMETERS)
    assert not stale, f"ALLOWED names functions that are gone or no longer long: {stale}"


def test_no_module_is_over_500_lines():
    big = sorted(f"{m} ({n})" for m in modules() if (n := len(source(m).splitlines())) > MAX_MODULE_LINES)
    assert not big, "modules over 500 lines (split them by what they hold):\n" + "\n".join(big)


def test_no_function_is_over_100_lines_but_the_c_kernels_twins():
    lengths = {name: (fn.end_lineno or fn.lineno) - fn.lineno + 1 for name, fn in DEFS.items()}
    long = sorted(f"{f} ({n})" for f, n in lengths.items() if n > MAX_FUNCTION_LINES and f not in LONG_TWINS)
    assert not long, "functions over 100 lines:\n" + "\n".join(long)
    assert set(lengths) >= LONG_TWINS, f"a twin named in LONG_TWINS is gone: {sorted(LONG_TWINS - set(lengths))}"
