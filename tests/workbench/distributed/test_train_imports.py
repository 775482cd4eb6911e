"""The training harness's modules import each other without a circle (errors.py holds the errors, checks.py
the validation, dimensions.py the parallel dimensions, so none of them needs a function-local import to dodge
one), and config.py, which the launching process reads, stays free of torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

grimp = pytest.importorskip("grimp")

PACKAGE = "wavefront.workbench.distributed.train"


def _cycles(graph: dict[str, set[str]]) -> list[str]:
    """The modules on or behind an import circle: what is left after repeatedly removing the modules that import
    nothing left in the graph (a topological peel; tests/test_imports.py names the circles package-wide)."""
    left = {m: set(deps) for m, deps in graph.items()}
    while True:
        leaves = [m for m, deps in left.items() if not deps & left.keys()]
        if not leaves:
            return sorted(left)
        for m in leaves:
            del left[m]


def test_cycle_finder_finds_a_planted_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "d"]
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
