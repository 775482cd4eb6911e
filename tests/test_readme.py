"""The README's kernel tour runs as written (so the README keeps telling the truth)."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_kernel_tour_runs():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    tour = blocks[0]
    scope: dict = {}
    exec(compile(tour, str(README), "exec"), scope)
    assert scope["loss"].ndim == 0 and scope["o"].shape == scope["q"].shape
    assert scope["y"].dtype == scope["x"].dtype


def test_readme_moe_tour_runs():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    moe = next(b for b in blocks if "moe_router" in b)
    scope: dict = {}
    exec(compile(moe, str(README), "exec"), scope)
    assert scope["out"].shape == scope["tokens"].shape and int(scope["counts"].sum()) == 16 * 2
    assert sum(p.numel() for p in scope["moe"].parameters()) > 0


def test_readme_names_only_existing_verbs():
    import typer

    from wavefront.cli import build_app

    root = typer.main.get_command(build_app())  # the verbs load on use: their names are the root's list
    verbs = set(root.list_commands(None))
    assert "bench" in verbs and "trace" in verbs
    table_verbs = re.findall(r"^\| `(\w+)", README.read_text(), re.M)
    assert table_verbs and set(table_verbs) <= verbs, set(table_verbs) - verbs
