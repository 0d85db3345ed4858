"""The first-party modules' sources and syntax trees, parsed once for the tests that read the
code itself (tests/test_imports.py, tests/test_code_shape.py)."""
from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("octopipe", "solvers")


@functools.cache
def modules() -> dict[str, Path]:
    """Dotted module name -> its file, for every .py under PACKAGES."""
    out = {}
    for pkg in PACKAGES:
        for p in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(p.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = p
    return out


@functools.cache
def source(mod: str) -> str:
    return modules()[mod].read_text()


@functools.cache
def tree(mod: str) -> ast.Module:
    return ast.parse(source(mod))
