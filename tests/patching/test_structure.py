"""The patching package's shape: no import circle, one table of patchable ops that patch() follows."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import wavefront
from wavefront.patching import OPS, PATCHABLE

PKG = Path(wavefront.__file__).parent / "patching"


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


@pytest.mark.parametrize("name", ["patcher", "table", "norm", "mlp", "rope", "loss", "attention", "report",
                                  "rule_types"])
def test_no_module_below_apply_imports_it(name):
    imported = _imports(PKG / f"{name}.py")
    assert "wavefront.patching.apply" not in imported, f"{name}.py imports apply.py: an import circle"
    assert not any(i in ("wavefront.patching", "wavefront.patching.apply") or i.startswith("wavefront.patching.apply.")
                   for i in imported)


def test_appliers_see_only_the_patcher():
    for row in PATCHABLE:
        module = row.apply.__module__.rsplit(".", 1)[-1]
        imported = {i for i in _imports(PKG / f"{module}.py") if i.startswith("wavefront.patching.")}
        assert imported <= {"wavefront.patching.patcher", "wavefront.patching.patcher.Patcher",
                             "wavefront.patching.patcher.Hooks", "wavefront.patching.report",
                             "wavefront.patching.report.Replacement", "wavefront.patching.report.qualname"}, module


def test_patch_takes_exactly_the_table_ops(tiny):
    assert tuple(row.name for row in PATCHABLE) == OPS and len(set(OPS)) == len(OPS)
    model = tiny("llama")
    off = {op: False for op in OPS}
    report = wavefront.patch(model, **off)
    assert report.requested == () and report.replacements == []
    wavefront.unpatch(model)
    with pytest.raises(TypeError, match="unknown option"):
        wavefront.patch(model, fused_everything=True)


def test_llama_like_families_come_from_one_constructor():
    from wavefront.patching.rules import FAMILIES
    from wavefront.patching.rules.llama_like import llama_like

    by_name = {f.name: f for f in FAMILIES}
    for model_type, prefix in (("llama", "Llama"), ("qwen2", "Qwen2"), ("qwen3", "Qwen3")):
        assert by_name[model_type] == llama_like(model_type, prefix)
    assert by_name["mistral"].attention.unsupported and by_name["mistral"].mlp.classes == ("MistralMLP",)
