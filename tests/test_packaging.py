"""What `pip install wavefront` brings: the kernels only; the workbench comes with its extras."""

from __future__ import annotations

from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[1]


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _names(requirements: list[str]) -> set[str]:
    import re

    return {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].lower() for r in requirements}


def test_the_core_install_is_the_kernels():
    assert _names(_project()["dependencies"]) == {"torch", "triton", "numpy"}


def test_triton_is_pinned_below_the_next_untested_minor():
    triton = next(r for r in _project()["dependencies"] if r.startswith("triton"))
    assert "<" in triton, f"triton must have an upper bound (interpreter internals are patched): {triton}"


def test_extras_bring_the_workbench():
    extras = _project()["optional-dependencies"]
    assert {"typer", "rich"} <= _names(extras["cli"])
    assert "plotly" in _names(extras["report"])
    assert "scipy" in _names(extras["workbench"])
    assert "wavefront" in _names(extras["workbench"]), "the workbench extra includes cli, report and trace"
    assert "torch" not in _names(extras["trace"]), "trace analysis is numpy-only"
