"""The training harness's shape: a ``--parallel`` name is read in one function (mesh.resolve) and everything
after it reads the layout's degrees; no function in the package is over 80 lines. Read from the source (AST),
so a branch on the name that comes back anywhere else fails here."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from wavefront.workbench.distributed.train import mesh
from wavefront.workbench.distributed.train.errors import ConfigError
from wavefront.workbench.distributed.train.mesh import Layout, resolve
from wavefront.workbench.distributed.train.vocabulary import DTYPES, PARALLEL_PLANS

TRAIN = Path(mesh.__file__).parent
RESOLVER = ("mesh.py", "resolve")  # the one function allowed to read the name
MAX_LINES = 80
#: Names that are only ``--parallel`` words ("auto" is a --dtype word too: it is caught beside ``parallel``).
PLAN_NAMES = set(PARALLEL_PLANS) - set(DTYPES)


def _names_in(node: ast.AST) -> set[str]:
    """The plan names a comparison operand or a lookup table spells: a literal, or literals in a tuple/list/set,
    or the keys of a dict literal."""
    if isinstance(node, ast.Constant) and node.value in PLAN_NAMES:
        return {node.value}
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return set().union(*(_names_in(e) for e in node.elts)) if node.elts else set()
    if isinstance(node, ast.Dict):
        return set().union(*(_names_in(k) for k in node.keys if k is not None)) if node.keys else set()
    return set()


def _is_parallel(node: ast.AST) -> bool:
    return (isinstance(node, ast.Name) and node.id == "parallel") or (
        isinstance(node, ast.Attribute) and node.attr == "parallel")


def plan_name_tests(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, what) for every comparison against, ``match`` case on, or table lookup keyed by a ``--parallel``
    name in `tree`."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            spelled = set().union(*(_names_in(o) for o in operands))
            if any(_is_parallel(o) for o in operands):  # cfg.parallel == "auto", or any word
                spelled |= {o.value for o in operands if isinstance(o, ast.Constant) and isinstance(o.value, str)}
        elif isinstance(node, ast.MatchValue):
            spelled = _names_in(node.value)
        elif isinstance(node, ast.Subscript):
            spelled = _names_in(node.value) if isinstance(node.value, ast.Dict) else set()
        else:
            continue
        if spelled:
            out.append((node.lineno, ", ".join(sorted(spelled))))
    return out


def _outside_resolver(path: Path) -> ast.Module:
    tree = ast.parse(path.read_text())
    if path.name == RESOLVER[0]:
        tree.body = [n for n in tree.body if not (isinstance(n, ast.FunctionDef) and n.name == RESOLVER[1])]
    return tree


def test_the_name_finder_finds_planted_branches():
    code = ('def f(plan, layout, cfg):\n    if plan == "ddp": pass\n    if plan in ("single", "fsdp2"): pass\n'
            '    x = {"mesh": 1}[plan]\n    match plan:\n        case "fsdp2": pass\n'
            '    if cfg.parallel == "auto" or cfg.dtype == "auto": pass\n'
            '    return layout.label() or "single", plan == "other"\n')
    assert [line for line, _ in plan_name_tests(ast.parse(code))] == [2, 3, 4, 6, 7]


def test_only_the_resolver_reads_a_parallel_name():
    found = [f"{p.name}:{line}: compares with {what}" for p in sorted(TRAIN.glob("*.py"))
             for line, what in plan_name_tests(_outside_resolver(p))]
    assert found == [], "read the layout's degrees (mesh.RunLayout), not the --parallel name:\n" + "\n".join(found)
    resolver = ast.parse((TRAIN / RESOLVER[0]).read_text())
    assert any(isinstance(n, ast.FunctionDef) and n.name == RESOLVER[1] and plan_name_tests(n) for n in resolver.body)


def test_no_function_in_the_training_harness_is_over_80_lines():
    long = [f"{p.name}:{n.lineno} {n.name}: {n.end_lineno - n.lineno + 1} lines" for p in sorted(TRAIN.glob("*.py"))
            for n in ast.walk(ast.parse(p.read_text()))
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.end_lineno - n.lineno + 1 > MAX_LINES]
    assert long == []


@pytest.mark.parametrize(("parallel", "world", "degrees", "as_mesh"), [
    ("single", 1, {"dp_replicate": 1, "dp_shard": 1}, False),
    ("auto", 1, {"dp_replicate": 1, "dp_shard": 1}, False),
    ("ddp", 4, {"dp_replicate": 4, "dp_shard": 1}, False),
    ("auto", 4, {"dp_replicate": 4, "dp_shard": 1}, False),
    ("fsdp2", 4, {"dp_replicate": 1, "dp_shard": 4}, False),
    ("mesh", 4, {"dp_replicate": 1, "dp_shard": 4}, True),
])
def test_each_parallel_name_is_a_degenerate_mesh(parallel, world, degrees, as_mesh):
    run = resolve(parallel, Layout(), world, mesh_options=False)
    assert {k: run.layout.degrees[k] for k in degrees} == degrees
    assert run.layout.tp == run.layout.pp == run.layout.cp == 1 and run.layout.world_size == world
    assert run.as_mesh is as_mesh and (run.document is not None) is as_mesh
    assert run.label == (f"mesh {run.layout.label()}" if as_mesh else run.name)


def test_fsdp2_and_a_dp_shard_mesh_are_the_same_layout_but_ddp_is_not():
    fsdp2 = resolve("fsdp2", Layout(), 2, mesh_options=False).layout
    shard = resolve("auto", Layout(dp_shard=2), 2, mesh_options=True).layout
    ddp = resolve("ddp", Layout(), 2, mesh_options=False).layout
    assert fsdp2.degrees == shard.degrees and fsdp2.shards and shard.shards
    assert ddp.replicates_only and not ddp.shards


@pytest.mark.parametrize(("parallel", "world", "layout", "message"), [
    ("tp", 1, Layout(), "--parallel must be one of"),
    ("single", 2, Layout(), "--parallel single runs one process, but 2 were launched"),
    ("ddp", 1, Layout(), "--parallel ddp needs at least 2 processes"),
    ("fsdp2", 1, Layout(), "--parallel fsdp2 needs at least 2 processes"),
    ("ddp", 2, Layout(tp=2), "build a device mesh: use --parallel auto or mesh, not ddp"),
    ("mesh", 2, Layout(tp=0), "--tp must be >= 1, got 0"),
    ("mesh", 3, Layout(tp=2), "world size 3 is not divisible by tp x pp x cp x dp-replicate"),
])
def test_a_name_that_does_not_fit_the_launch_is_named(parallel, world, layout, message):
    with pytest.raises(ConfigError) as err:
        resolve(parallel, layout, world, mesh_options=layout != Layout())
    assert message in str(err.value)
