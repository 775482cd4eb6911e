"""The verbs' shared vocabulary agrees with the library, and the bench-family CLI modules stay thin."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from wavefront import runtime
from wavefront.cli import _common

CLI = Path(_common.__file__).parent
OWNED = ("bench", "compare", "bisect", "gate", "inspect", "report", "plan", "trace", "train", "comm", "counters",
         "_common",
         "_output", "_tables")


def test_choices_mirror_the_library():
    from wavefront.workbench.bench.providers import PROVIDERS
    from wavefront.workbench.bench.runnable import MODES
    from wavefront.workbench.jobs.request import DTYPES

    assert tuple(m.value for m in _common.Mode) == tuple(MODES)
    assert tuple(p.value for p in _common.Provider) == tuple(PROVIDERS)
    assert tuple(d.value for d in _common.DType) == DTYPES
    assert tuple(_common.ALL_TARGETS.split(",")) == runtime.DEFAULT_TARGETS


@pytest.mark.parametrize("name", OWNED)
def test_cli_module_is_thin(name):
    """At most 200 lines per module and 60 per function; verbs import only the shared modules."""
    source = (CLI / f"{name}.py").read_text()
    assert len(source.splitlines()) <= 200
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            assert node.end_lineno - node.lineno + 1 <= 60, node.name
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("wavefront.cli."):
            assert node.module in ("wavefront.cli._common", "wavefront.cli._output", "wavefront.cli._help",
                                   "wavefront.cli._tables"), node.module


def test_schemas_live_beside_their_producers():
    from wavefront.workbench.bench import bisect, compare
    from wavefront.workbench.jobs import bench as job
    from wavefront.workbench.static import gate, inspect, roofline, traffic

    schemas = {job.SCHEMA, compare.SCHEMA, bisect.SCHEMA, gate.SCHEMA, inspect.SCHEMA, traffic.SCHEMA,
               roofline.SCHEMA}
    assert schemas == {f"wavefront.{v}/1" for v in ("bench", "compare", "bisect", "gate", "inspect", "traffic",
                                                    "roofline")}
    for name in OWNED:
        assert "SCHEMA =" not in (CLI / f"{name}.py").read_text(), name


def test_bench_help_states_the_full_sweep_cost_and_the_choices():
    from typer.testing import CliRunner

    from wavefront.cli import build_app

    r = CliRunner().invoke(build_app(), ["bench", "--help"], env={"COLUMNS": "200"})
    text = " ".join(r.output.split())
    assert r.exit_code == 0
    assert "--full" in text and "about 17 min and 7.5 GiB" in text
    assert "fwd|bwd|fwd_bwd" in text.replace(" ", "") or "[fwd|bwd|fwd_bwd]" in text


def test_json_document_equals_the_library_call(tmp_path):
    """`wavefront roofline --json -` is exactly what the documented Python call returns (docs/json/roofline.md)."""
    import json

    from typer.testing import CliRunner

    from wavefront.cli import build_app
    from wavefront.workbench.document import encode
    from wavefront.workbench.jobs import roofline

    inspect_doc = tmp_path / "inspect.json"
    inspect_doc.write_text(json.dumps({"rows": [{"op": "softmax", "matrix_families": []}]}))
    r = CliRunner().invoke(build_app(), ["roofline", "--device", "mi300x", "--op", "softmax", "--inspect",
                                         str(inspect_doc), "--json", "-"])
    assert r.exit_code == 0, r.output
    doc = roofline.roofline(roofline.RooflineRequest(device="mi300x", ops=("softmax",), inspect=str(inspect_doc)))
    assert json.loads(r.stdout) == json.loads(json.dumps(encode(doc.as_dict())))
