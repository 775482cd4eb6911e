"""The style guide's flag rule, enforced: no kernel in src/wavefront/kernels takes more than eight non-block
``tl.constexpr`` parameters (BLOCK_* tile sizes are not flags). A kernel past that splits along its biggest
axis over a shared ``@triton.jit`` body (``_norm_fwd_fp8`` under ``_rms_norm_fwd_fp8_kernel`` and
``_layer_norm_fwd_fp8_kernel``, say): the body may carry the union of its kernels' flags, each kernel only its
own. Kernels are the launched entry points: every jit function named ``*_kernel`` and every function that a
launcher passes to ``launch(...)`` (or to a ``*_launch`` wrapper over it). No kernel is an
exception.

Read from the source (ast), so the test imports no Triton and takes milliseconds.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import wavefront.kernels

KERNELS_DIR = Path(wavefront.kernels.__file__).parent
MAX_FLAGS = 8



def _is_jit(fn: ast.FunctionDef) -> bool:
    return any("jit" in ast.unparse(d) for d in fn.decorator_list)


def _flags(fn: ast.FunctionDef) -> list[str]:
    args = fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs
    return [a.arg for a in args if a.annotation is not None and "constexpr" in ast.unparse(a.annotation)
            and not a.arg.startswith("BLOCK")]


def _launched(tree: ast.AST) -> set[str]:
    """Names of the functions passed first to launch(...) or a *_launch wrapper, through attributes and `a if c else
    b`."""
    names: set[str] = set()

    def add(node: ast.AST) -> None:
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.IfExp):
            add(node.body)
            add(node.orelse)

    for node in ast.walk(tree):
        # launch(...) and the launchers' wrappers over it (_tma_launch, _gemm_launch): the kernel goes first.
        if isinstance(node, ast.Call) and getattr(node.func, "id", "").endswith("launch") and node.args:
            add(node.args[0])
    return names


def _walk() -> tuple[dict[str, tuple[str, list[str]]], set[str]]:
    """(jit function name -> (file, its flags), names launched anywhere in the package)."""
    jit: dict[str, tuple[str, list[str]]] = {}
    launched: set[str] = set()
    for path in sorted(KERNELS_DIR.glob("*.py")):
        tree = ast.parse(path.read_text())
        launched |= _launched(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and _is_jit(node):
                jit[node.name] = (path.name, _flags(node))
    return jit, launched


JIT, LAUNCHED = _walk()
KERNELS = {name: v for name, v in JIT.items() if name.endswith("_kernel") or name in LAUNCHED}


def test_the_walk_finds_the_kernels():
    # Not vacuous: the package's kernels are found, and the split ones among them.
    assert len(KERNELS) > 40, sorted(KERNELS)
    for name in ("_norm_fwd_kernel", "_rms_norm_fwd_fp8_kernel", "_layer_norm_fwd_fp8_kernel",
                 "_linear_fwd_tma_kernel", "_linear_fwd_tma_splitk_kernel", "_fp8_gemm_tma_kernel",
                 "_fp8_block_gemm_tma_kernel", "_mx_gemm_tma_kernel", "_grouped_gemm_kernel",
                 "_grouped_gemm_swiglu_kernel"):
        assert name in KERNELS, name
    # Every launched name is a jit function of the package (a launch through a variable would hide one).
    assert {n for n in LAUNCHED if n.startswith("_")} <= set(JIT), sorted(LAUNCHED - set(JIT))


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_kernel_has_at_most_eight_flags(name):
    path, flags = KERNELS[name]
    assert len(flags) <= MAX_FLAGS, (
        f"{path}:{name} takes {len(flags)} non-block constexpr flags {flags}; split it along its biggest axis "
        "over a shared @triton.jit body (docs/developing.md)")
