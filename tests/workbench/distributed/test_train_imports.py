"""The training harness's modules import each other without a circle (errors.py holds the errors, checks.py
the validation, dimensions.py the parallel dimensions, so none of them needs a function-local import to dodge
one), and config.py, which the launching process reads, stays free of torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

grimp = pytest.importorskip("grimp")

PACKAGE = "wavefront.workbench.distributed.train"


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module, or of one that imports itself (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
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
            if len(component) > 1 or v in graph[v]:
                out.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_cycle_finder_finds_a_planted_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_in_the_training_harness():
    graph = grimp.build_graph("wavefront", exclude_type_checking_imports=True)
    modules = {m for m in graph.find_children(PACKAGE) | {PACKAGE}}
    assert f"{PACKAGE}.trainer" in modules and f"{PACKAGE}.dimensions" in modules
    edges = {m: graph.find_modules_directly_imported_by(m) & modules for m in modules}
    assert _cycles(edges) == []


def test_config_and_the_cli_stay_torch_free():
    code = ("import sys, wavefront.workbench.distributed.train.config, wavefront.cli.train; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
