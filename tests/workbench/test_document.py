"""The one document protocol: every job result carries SCHEMA and as_dict(), and the one encoder
(wavefront.workbench.document) turns what lies beneath into JSON values."""

from __future__ import annotations

import ast
import dataclasses
import enum
import importlib
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from wavefront.workbench.document import decode, dumps, encode
from wavefront.workbench.hardware import get_gpu

SRC = Path(__file__).parents[2] / "src" / "wavefront"
DATA = Path(__file__).parents[1] / "data"

#: (module, class) of every result a job returns; the schema is wavefront.<verb>[.<what>]/<n>.
RESULTS = [
    ("wavefront.workbench.static.inspect", "InspectReport"),
    ("wavefront.workbench.static.traffic", "TrafficReport"),
    ("wavefront.workbench.static.roofline", "RooflineReport"),
    ("wavefront.workbench.static.configs", "GpuConfigs"),
    ("wavefront.workbench.jobs.bench", "BenchResult"),
    ("wavefront.workbench.jobs.gate", "GateResult"),
    ("wavefront.workbench.jobs.profile", "ProfileResult"),
    ("wavefront.workbench.jobs.compare", "CompareResult"),
    ("wavefront.workbench.jobs.compare", "CalibrationReport"),
    ("wavefront.workbench.jobs.bisect", "BisectResult"),
    ("wavefront.workbench.jobs.report", "ReportResult"),
    ("wavefront.workbench.jobs.trace", "DiffResult"),
    ("wavefront.workbench.trace.analysis", "TraceAnalysis"),
    ("wavefront.workbench.trace.diff", "TraceDiff"),
    ("wavefront.workbench.jobs.plan", "SearchResult"),
    ("wavefront.workbench.jobs.plan", "ValidationReport"),
    ("wavefront.workbench.jobs.counters", "CountersResult"),
    ("wavefront.workbench.jobs.counters", "CompareResult"),
    ("wavefront.workbench.jobs.comm", "CommJobResult"),
    ("wavefront.workbench.jobs.comm", "OverlapJobResult"),
    ("wavefront.workbench.jobs.train", "TrainResult"),
    ("wavefront.workbench.static.predict", "PredictReport"),
]


@pytest.mark.parametrize(("module", "name"), RESULTS, ids=[f"{m.rsplit('.', 1)[1]}.{n}" for m, n in RESULTS])
def test_every_result_type_carries_its_schema_and_one_document_method(module, name):
    cls = getattr(importlib.import_module(module), name)
    assert isinstance(cls.__dict__.get("SCHEMA"), str) and cls.SCHEMA.startswith("wavefront."), name
    assert cls.SCHEMA.rsplit("/", 1)[1].isdigit(), cls.SCHEMA
    assert callable(cls.__dict__.get("as_dict")), f"{name}: the document method is as_dict()"
    for other in ("document", "to_json", "to_dict"):
        assert not hasattr(cls, other), f"{name}.{other}: one document method, as_dict()"
    if dataclasses.is_dataclass(cls):
        assert "SCHEMA" not in {f.name for f in dataclasses.fields(cls)}, "SCHEMA is a class constant, not a field"


def test_every_job_module_returns_a_listed_result():
    """Each job module's public functions that return a document return a type of RESULTS (a new verb
    adds its result above)."""
    listed = {n for _, n in RESULTS}
    for path in sorted((SRC / "workbench" / "jobs").glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_") and node.returns is not None:
                ret = ast.unparse(node.returns).split(".")[-1].replace(" | None", "")
                if ret[:1].isupper() and ret.endswith(("Result", "Report", "Analysis", "Configs")):
                    assert ret in listed, f"{path.name}:{node.name} returns {ret}, not in RESULTS"


def _check(result) -> dict:
    """The result's document through the encoder: JSON values only, its schema first-class, and the bytes
    the CLI writes parse back to the same document."""
    doc = encode(result)
    assert doc == encode(result.as_dict())
    assert doc["schema"] == type(result).SCHEMA
    assert json.loads(dumps(result)) == doc == json.loads(json.dumps(doc))
    return doc


def test_documents_of_cheap_results_serialize_through_the_encoder():
    from wavefront.workbench.jobs import comm, compare, counters, gate, plan, report, trace
    from wavefront.workbench.static.gate import Finding, HalfResult
    from wavefront.workbench.static.inspect import InspectReport
    from wavefront.workbench.static.roofline import RooflineReport
    from wavefront.workbench.static.traffic import TrafficReport

    _check(InspectReport([], ["sm_90"], "bf16", {"torch": torch.__version__}))  # a str subclass inside
    _check(TrafficReport([], "bf16"))
    assert _check(RooflineReport(get_gpu("h100"), "bf16", []))["device"]["ridge_bf16"] > 0
    _check(gate.GateResult([HalfResult("static", [Finding("static", "k", "spills", "why")])], "md"))
    _check(report.ReportResult(Path("r.html"), None, 0, 0, ["h100"], []))
    cal = _check(compare.calibrate(compare.CalibrateRequest(trials=3)))
    assert cal["calibration"][0]["scenario"]["name"]  # a nested dataclass, no method of its own
    _check(counters.counters(counters.CountersRequest(DATA / "counters" / "ncu_raw_h100_a.csv")))
    _check(plan.plan(plan.PlanRequest(model="llama3-8b", gpus=("8xh100",), top=2)))
    _check(plan.validate(plan.ValidateRequest((DATA / "published" / "narayanan2021_table1.json",))))
    traces = (DATA / "traces" / "cpu_train_h64.json.gz",)
    _check(trace.analyze(trace.AnalyzeRequest(traces, workers=1)))
    d = _check(trace.diff(trace.DiffRequest(traces, traces)))
    assert d["a"] == d["b"] == [str(traces[0])], "the diff names both sides' files itself"
    empty = comm.CommJobResult({}, {}, comm.collectives.BenchReport([], [], {}, []), None, [])
    _check(empty)


class _Color(str, enum.Enum):
    red = "r"


@dataclasses.dataclass
class _Leaf:
    path: Path
    color: _Color
    shape: tuple[int, ...]
    value: float


@dataclasses.dataclass
class _Computed:
    x: int

    def as_dict(self) -> dict:
        return {"x": self.x, "twice": 2 * self.x}


@dataclasses.dataclass
class _Node:
    leaves: list[_Leaf]
    computed: _Computed
    by_rank: dict[int, np.float32]


def test_encoder_handles_what_documents_hold():
    node = _Node([_Leaf(Path("/a/b"), _Color.red, (1, 2), math.nan)], _Computed(3), {0: np.float32(0.5)})
    assert encode(node) == {"leaves": [{"path": "/a/b", "color": "r", "shape": [1, 2], "value": None}],
                            "computed": {"x": 3, "twice": 6}, "by_rank": {"0": 0.5}}
    assert encode(np.int64(7)) == 7 and type(encode(np.int64(7))) is int
    assert encode(np.arange(3)) == [0, 1, 2]
    assert type(encode(torch.__version__)) is str
    with pytest.raises(TypeError, match="cannot encode object"):
        encode(object())


def test_decode_reads_a_flat_record_back_ignoring_derived_fields():
    leaf = _Computed(4)
    assert decode(_Computed, {"x": 4, "twice": 8}) == leaf
