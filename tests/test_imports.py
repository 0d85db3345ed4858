"""The import graph: no cycles (imports inside functions count), imports point down the flow of
docs/architecture.md, nothing imports the CLI module, and in-function imports are only for optional heavy
dependencies, each with its reason on the line."""
from __future__ import annotations

import ast

from tests.package_sources import PACKAGES, modules, source, tree

# Layers, bottom first: a module may import modules of its own layer or below, never above.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("octopipe.errors", "octopipe.io", "octopipe.config", "octopipe.progress", "octopipe.native",
     "octopipe.report"),
    ("octopipe.cluster", "octopipe.cluster_presets", "octopipe.model", "octopipe.schedule",
     "octopipe.plan", "octopipe.plan_io"),
    ("octopipe.cost", "octopipe.layers"),
    ("octopipe.sim", "solvers"),
    ("octopipe.tune",),
    ("octopipe.runtime",),
    ("octopipe.measure", "octopipe.train", "octopipe.asynchronous", "octopipe.layout", "octopipe.interop"),
    # the contract every driver (a mode or an experiment) takes and returns
    ("octopipe.modes.inputs", "octopipe.modes.mode_result", "octopipe.modes.artifacts"),
    ("octopipe.experiments",),
    ("octopipe.modes",),
    ("octopipe.run", "octopipe.__main__"),
)
# Optional or heavy third-party packages a function may import lazily (with a reason).
LAZY_OK = ("matplotlib", "highspy", "torch", "megatron", "torchtitan", "transformers", "tensorboard", "rich",
           "hydra", "pulp", "z3", "networkx", "psutil", "py_spy", "ctypes", "cffi")


MODULES = modules()
SOURCES = {mod: source(mod) for mod in MODULES}
TREES = {mod: tree(mod) for mod in MODULES}


def _targets(mod: str, node: ast.AST, is_pkg: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    assert isinstance(node, ast.ImportFrom)
    if node.level:
        base = mod.split(".") if is_pkg else mod.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    return [target] + [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in MODULES]


def _imports(tree: ast.AST) -> list[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement of `tree`, in `ast.walk` order, with whether a function holds it."""
    out: list[tuple[ast.Import | ast.ImportFrom, bool]] = []
    todo: list[tuple[ast.AST, bool]] = [(tree, False)]
    for node, inside in todo:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            out.append((node, inside))
        inside = inside or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        todo.extend((child, inside) for child in ast.iter_child_nodes(node))
    return out


IMPORTS = {mod: _imports(tree) for mod, tree in TREES.items()}


def _edges() -> dict[str, list[tuple[str, int, bool]]]:
    """module -> [(imported first-party module, line, inside a function)]."""
    edges: dict[str, list[tuple[str, int, bool]]] = {}
    for mod, path in MODULES.items():
        out = []
        for node, inner in IMPORTS[mod]:
            for t in _targets(mod, node, path.name == "__init__.py"):
                if t in MODULES and t != mod:
                    out.append((t, node.lineno, inner))
        edges[mod] = out
    return edges


EDGES = _edges()


def _layer(mod: str) -> int:
    if mod == "octopipe":          # the top-level package: its version, nothing of the flow
        return 0
    for i, prefixes in enumerate(LAYERS):
        if any(mod == p or mod.startswith(p + ".") for p in prefixes):
            return i
    raise AssertionError(f"{mod} belongs to no layer of tests/test_imports.py: add it to LAYERS")


def _is_package_of(a: str, b: str) -> bool:
    return b.startswith(a + ".")


def test_every_module_has_a_layer():
    for mod in MODULES:
        _layer(mod)


def test_no_import_cycles():
    """Tarjan's strongly connected components over every import, in functions too (a package's
    __init__ re-exporting its own submodules is not a cycle)."""
    graph = {m: sorted({t for t, _, _ in e if not _is_package_of(m, t) and not _is_package_of(t, m)})
             for m, e in EDGES.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for m in graph:
        if m not in index:
            visit(m)
    assert not cycles, f"import cycles: {cycles}"


def _package(mod: str) -> str:
    """The unit of the package-level check: `octopipe.tune.search` -> `octopipe.tune`; a module
    directly under a root (`octopipe.plan`, `solvers.compare`) is its own unit."""
    return ".".join(mod.split(".")[:2])


def package_pairs(edges: dict[str, list[tuple[str, int, bool]]]) -> list[tuple[str, str]]:
    """Pairs of packages that import each other (each direction through any module, imports in
    functions included): a cycle at the package level, which the module-level check and the
    layer order (which merges several packages into one layer) cannot see."""
    deps = {(_package(m), _package(t)) for m, e in edges.items() for t, _, _ in e}
    return sorted((a, b) for a, b in deps if a < b and (b, a) in deps)


def test_package_pair_detection_sees_a_pair():
    fake = {"octopipe.plan": [("octopipe.schedule.table", 1, False)],
            "octopipe.schedule.plan_io": [("octopipe.plan", 1, True)]}
    assert package_pairs(fake) == [("octopipe.plan", "octopipe.schedule")]


def test_no_package_pair_imports_each_other():
    pairs = package_pairs(EDGES)
    assert not pairs, f"packages importing each other: {pairs}"


def test_nothing_imports_the_cli():
    bad = [f"{m}:{line}" for m, e in EDGES.items() for t, line, _ in e
           if t == "octopipe.run" and m not in ("octopipe.__main__",)]
    assert not bad, f"modules importing the CLI module octopipe.run: {bad}"


def test_imports_point_down_the_flow():
    bad = [f"{m}:{line} -> {t}" for m, e in EDGES.items() for t, line, _ in e
           if _layer(t) > _layer(m)]
    assert not bad, "imports pointing up the flow (see LAYERS):\n" + "\n".join(bad)


def _module_level_imports(mod: str) -> list[str]:
    path = MODULES[mod]
    return [t for node in TREES[mod].body if isinstance(node, (ast.Import, ast.ImportFrom))
            for t in _targets(mod, node, path.name == "__init__.py")]


def _needs_torch(mod: str, seen: frozenset[str] = frozenset()) -> bool:
    """Whether importing `mod` imports torch: torch at its module level, or a first-party module
    that does (`octopipe.layers`, `octopipe.cost.profiled`, the runtime)."""
    targets = _module_level_imports(mod)
    if any(t.split(".")[0] == "torch" for t in targets):
        return True
    return any(_needs_torch(t, seen | {mod}) for t in targets if t in MODULES and t not in seen | {mod})


def test_in_function_imports_are_lazy_heavy_dependencies_with_a_reason():
    """First-party modules are imported at module level; a function may import an optional or
    heavy third-party package, with a comment on the line saying why. A light module that only
    sometimes needs torch may import the first-party module that brings it the same way."""
    bad = []
    for mod, path in MODULES.items():
        lines = SOURCES[mod].splitlines()
        for node, inner in IMPORTS[mod]:
            if not inner:
                continue
            names = _targets(mod, node, path.name == "__init__.py")
            first_party = getattr(node, "level", 0) > 0 or any(n.split(".")[0] in PACKAGES for n in names)
            heavy = all(n.split(".")[0] in LAZY_OK for n in names)
            if first_party and not getattr(node, "level", 0) and \
                    all(_needs_torch(n) for n in names if n in MODULES):
                first_party, heavy = False, True      # a torch-only module, imported lazily
            reason = "#" in lines[node.lineno - 1]
            if first_party or not heavy or not reason:
                bad.append(f"{mod}:{node.lineno} {lines[node.lineno - 1].strip()}")
    assert not bad, "in-function imports that are not lazy heavy dependencies with a reason:\n" + \
        "\n".join(bad)
