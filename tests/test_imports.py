"""The import graph stays visible and acyclic.

Imports live at the top of a module, where lint-imports, mypy and readers see them. A function-local import
of a wavefront module is kept only where it guards an optional dependency or keeps a light path light
(``wavefront --help``, ``import wavefront.ops`` without Triton, the torch-free verbs), and says so in a
``# lazy: <why>`` comment; ruff's PLC0415 (pyproject.toml) names the files allowed to keep one.
"""

from __future__ import annotations

import ast
import functools
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"

# Files allowed to keep unmarked function-local imports (none).
UNMARKED: set[str] = set()
# The ceiling on function-local wavefront imports: lower it when you hoist one, never raise it.
MAX_LOCAL_WAVEFRONT_IMPORTS = 55


@functools.cache
def _parse(path: Path) -> tuple[ast.Module, list[str]]:
    text = path.read_text()
    return ast.parse(text), text.splitlines()


@functools.cache
def _modules() -> dict[str, tuple[Path, bool]]:
    mods = {}
    for path in sorted((SRC / "wavefront").rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        mods[".".join(parts[:-1] if is_pkg else parts)] = (path, is_pkg)
    return mods


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _module_level_imports(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    """Imports that run when the module is imported: not in a function, not under TYPE_CHECKING."""
    for stmt in body:
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            yield stmt
        elif isinstance(stmt, ast.If):
            if not _is_type_checking(stmt.test):
                yield from _module_level_imports(stmt.body)
                yield from _module_level_imports(stmt.orelse)
        elif isinstance(stmt, ast.Try):
            for block in (stmt.body, *(h.body for h in stmt.handlers), stmt.orelse, stmt.finalbody):
                yield from _module_level_imports(block)
        elif isinstance(stmt, ast.With):
            yield from _module_level_imports(stmt.body)


def _function_local_imports(tree: ast.Module) -> Iterator[ast.Import | ast.ImportFrom]:
    def visit(node: ast.AST, in_function: bool) -> Iterator[ast.Import | ast.ImportFrom]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                yield from visit(child, True)
            elif isinstance(child, (ast.Import, ast.ImportFrom)):
                if in_function:
                    yield child
            else:
                yield from visit(child, in_function)
    yield from visit(tree, False)


def _targets(module: str, is_pkg: bool, node: ast.Import | ast.ImportFrom, mods: dict) -> list[str]:
    """The wavefront modules an import statement loads."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.split(".")[0] == "wavefront"]
    if node.level:
        base = module.split(".")[: None if is_pkg else -1]
        base = base[: len(base) - (node.level - 1)]
        full = ".".join(base + ([node.module] if node.module else []))
    else:
        full = node.module or ""
    if full.split(".")[0] != "wavefront":
        return []
    return [full] + [f"{full}.{a.name}" for a in node.names if f"{full}.{a.name}" in mods]


def _import_graph() -> dict[str, set[str]]:
    """Module -> the wavefront modules its import runs first: each target and the target's packages, less
    the packages that contain the importer (those are already importing)."""
    mods = _modules()
    graph: dict[str, set[str]] = {}
    for module, (path, is_pkg) in mods.items():
        parts = module.split(".")
        own = {".".join(parts[:i]) for i in range(1, len(parts) + 1)}
        edges = set()
        for node in _module_level_imports(_parse(path)[0].body):
            for target in _targets(module, is_pkg, node, mods):
                tparts = target.split(".")
                edges |= {p for i in range(1, len(tparts) + 1) if (p := ".".join(tparts[:i])) in mods} - own
        graph[module] = edges
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(graph)))
    try:
        for v in graph:
            if v not in index:
                connect(v)
    finally:
        sys.setrecursionlimit(limit)
    return found


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_the_module_level_import_graph_has_no_cycle():
    graph = _import_graph()
    assert len(graph) > 100 and sum(map(len, graph.values())) > 300  # the graph was read
    cycles = _cycles(graph)
    detail = "\n".join(f"{c}: " + "; ".join(f"{m} -> {sorted(graph[m] & set(c))}" for m in c) for c in cycles)
    assert not cycles, f"import cycles (open them: move the shared names to a module both import):\n{detail}"


def _local_wavefront_imports() -> list[tuple[str, int, str]]:
    mods = _modules()
    out = []
    for module, (path, is_pkg) in mods.items():
        tree, lines = _parse(path)
        for node in _function_local_imports(tree):
            if _targets(module, is_pkg, node, mods):
                out.append((str(path.relative_to(ROOT)), node.lineno, lines[node.lineno - 1]))
    return out


def test_every_function_local_import_says_why():
    unmarked = []
    for path, _ in _modules().values():
        rel = str(path.relative_to(ROOT))
        tree, lines = _parse(path)
        unmarked += [f"{rel}:{node.lineno}: {lines[node.lineno - 1].strip()}" for node in _function_local_imports(tree)
                     if "# lazy:" not in lines[node.lineno - 1] and rel not in UNMARKED]
    assert not unmarked, ("a function-local import must guard something (an optional dependency, a light "
                          "import path) and say what (`# lazy: <why>`); otherwise move it to the top of the "
                          "module:\n" + "\n".join(unmarked))


def test_function_local_wavefront_imports_stay_under_the_ceiling():
    local = _local_wavefront_imports()
    assert len(local) <= MAX_LOCAL_WAVEFRONT_IMPORTS, (
        f"{len(local)} function-local wavefront imports, over the ceiling {MAX_LOCAL_WAVEFRONT_IMPORTS}")


def test_the_ruff_exemptions_name_exactly_the_files_with_function_local_imports():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    ignores = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"]["lint"]["per-file-ignores"]
    exempt = {f for f, rules in ignores.items() if "PLC0415" in rules and f.startswith("src/")}
    keeping = set()
    for path in (SRC / "wavefront").rglob("*.py"):
        if next(_function_local_imports(_parse(path)[0]), None) is not None:
            keeping.add(str(path.relative_to(ROOT)))
    assert not exempt - keeping, f"exempt from PLC0415 but without a function-local import: {sorted(exempt - keeping)}"
    assert not keeping - exempt, f"function-local imports outside the exemptions: {sorted(keeping - exempt)}"
