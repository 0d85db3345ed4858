"""The code's shape: no function in octopipe/ or solvers/ takes more than 8 parameters (bundle
them in a value), the simulator's flat-array inner loops excepted, each named below with why."""
from __future__ import annotations

import ast

from tests.package_sources import modules, tree

MAX_PARAMETERS = 8

# "module.function" -> why its long list is the point (flat arrays for an inner loop). Keep the
# reason in the function's docstring too ("flat arrays for the inner loop: ...").
ALLOWED: dict[str, str] = {}


def _functions() -> dict[str, int]:
    """'module.[Class.]function' -> parameter count (self and cls not counted)."""
    out: dict[str, int] = {}

    def visit(mod: str, node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(mod, child, f"{prefix}{child.name}.")
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = child.args
                n = (len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs)
                     + bool(a.vararg) + bool(a.kwarg))
                first = (a.posonlyargs + a.args)[:1]
                if first and first[0].arg in ("self", "cls"):
                    n -= 1
                out[f"{mod}.{prefix}{child.name}"] = n
                visit(mod, child, f"{prefix}{child.name}.")
            else:
                visit(mod, child, prefix)

    for mod in modules():
        visit(mod, tree(mod), "")
    return out


FUNCTIONS = _functions()


def test_no_function_takes_more_than_eight_parameters():
    long = sorted(f"{name}: {n} parameters" for name, n in FUNCTIONS.items()
                  if n > MAX_PARAMETERS and name not in ALLOWED)
    assert not long, (f"functions with more than {MAX_PARAMETERS} parameters (bundle them in a "
                      "frozen value, or name a flat-array inner loop in ALLOWED):\n" + "\n".join(long))


def test_the_allow_list_names_only_long_functions_that_exist():
    stale = sorted(name for name in ALLOWED if FUNCTIONS.get(name, 0) <= MAX_PARAMETERS)
    assert not stale, f"ALLOWED names functions that are gone or no longer long: {stale}"
