"""The dashboard's content: self-contained, every section present, other tools' JSON charted and tabulated,
documents kept with their run, incomplete runs left out, wrong documents refused."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from _report_docs import inspect_document, traffic_document

from wavefront.workbench.bench.store import ResultStore, StoreError
from wavefront.workbench.hardware import GPUS
from wavefront.workbench.report import write_report
from wavefront.workbench.report.data import build_report_data
from wavefront.workbench.report.html import render_html
from wavefront.workbench.report.tables import DocumentError, document_tables, load_document_tables

RESULTS = Path(__file__).resolve().parents[3] / "benchmarks" / "results"


def _charts(html: str) -> list[str]:
    return re.findall(r'<div class="wf-chart" id="(chart-\d+)" data-title="([^"]*)"', html)


def _specs(html: str) -> dict[str, dict]:
    """Each chart's figure spec by chart title."""
    out = {}
    for cid, title in _charts(html):
        m = re.search(rf'<script type="application/json" id="{cid}-spec">(.*?)</script>', html, re.S)
        out[title] = json.loads(m.group(1).replace("<\\/", "</"))
    return out


def test_full_report_sections(store_path, inspect_doc, traffic_doc):
    data = build_report_data(store_path, [inspect_doc, traffic_doc], results_dir=RESULTS)
    assert data.latest_gpu is not None and data.latest_gpu.info.created_utc.startswith("2026-01-03")
    assert data.statuses[4] == "incomplete" and len(data.runs) == 4  # the interrupted run is listed...
    assert data.latest.info.id == 3  # ...and left out of the charts
    assert {s.baseline for s in data.speedups} == {"eager", "torch_compile"}
    by = {(s.case, s.mode, s.baseline): s for s in data.speedups}
    assert by[("wide_65536", "fwd", "eager")].speedup == pytest.approx(2.5, rel=0.03)
    assert by[("wide_65536", "fwd", "eager")].verdict == "faster"
    assert len({h.run_id for h in data.history}) == 2
    assert len(data.measured["h100"]) == 2 * 12  # two GPU runs x (2 cases x 2 modes x 3 timed providers)
    html = render_html(data, plotly_js="/* plotly stub */")
    specs = _specs(html)
    titles = list(specs)
    rooflines = [t for t in titles if "roofline" in t]
    # ONE chart, opened on the device the newest run targeted (the fixture GPU runs: h100), not the table's first
    assert rooflines == ["roofline on NVIDIA H100 SXM (modeled + measured, bf16)"]
    roof = specs[rooflines[0]]
    order = ["h100", *(k for k in GPUS if k != "h100")]
    assert [v["label"] for v in roof["views"]] == [GPUS[k].name for k in order]  # the device selector
    h100 = next(v for v in roof["views"] if v["label"] == GPUS["h100"].name)
    assert h100["layout"]["title.text"].endswith("(modeled + measured, bf16)")
    visible = [t["name"] for t, shown in zip(roof["data"], h100["data"]["visible"], strict=True) if shown]
    assert "rms_norm" in visible and "measured: wavefront" in visible and "softmax" in visible
    assert any(n.startswith("roof: ") for n in visible)
    assert {t["marker"]["color"] for t in roof["data"] if t["name"] == "rms_norm"} == {
        next(t["marker"]["color"] for t in roof["data"] if t["name"] == "rms_norm")
    }  # one colour per op
    assert any(t["name"] == "rms_norm (wavefront, counted bytes)" for t in roof["data"])  # from the traffic doc
    heat = specs["inspect: occupancy per kernel and target"]
    assert heat["data"][0]["type"] == "heatmap" and heat["data"][0]["x"] == inspect_document()["targets"]
    assert len(heat["data"][0]["y"]) == 12  # 3 ops x 2 modes x 2 cases
    assert [v["label"] for v in heat["views"]] == [
        "occupancy",
        "registers per thread",
        "widest global load (bits)",
        "spill bytes per thread",
        "matrix instructions",
    ]
    assert "failed" in heat["data"][0]["text"][-1]  # the one target that did not compile
    traffic = specs["traffic: bytes moved by wavefront, the minimum, and eager PyTorch"]
    assert [t["name"] for t in traffic["data"]] == ["wavefront", "minimum", "eager"]
    assert len(traffic["data"][0]["y"]) == len(traffic_document()["rows"])
    lce = specs["fused linear + cross-entropy: peak memory (committed CPU results)"]
    assert {t["name"] for t in lce["data"]} >= {"eager PyTorch (full logits)", "wavefront fused loss"}
    assert any("correctness" in t for t in titles) and any("speedup" in t for t in titles)
    for title, spec in specs.items():  # every axis of every chart is labelled
        layout = spec["layout"]
        for axis in ("xaxis", "yaxis"):
            assert layout.get(axis, {}).get("title", {}).get("text"), f"{title}: {axis} has no label"
    for title in ("correctness vs the float64 reference (run 1)", rooflines[0]):
        assert specs[title]["layout"]["yaxis"]["exponentformat"] == "power"  # no SI prefix on a ratio
    assert "1/2 cases pass" in html
    assert "CPU interpreter: not a performance figure" in html
    assert "1 incomplete or failed, left out of every chart" in html
    assert html.count("<details>") >= 5  # raw tables collapsed
    inspect_table = re.search(r"<summary>rows from [^<]*inspect.json.*?<thead><tr>(.*?)</tr>", html, re.S).group(1)
    assert re.findall(r"<th>(.*?)</th>", inspect_table)[:6] == ["key", "op", "mode", "case", "kernel", "target"]
    assert re.findall(r"<th>(.*?)</th>", inspect_table)[-4:] == ["signature", "load_widths", "matrix_ops", "error"]


def test_cpu_only_report_explains_missing_sections(tmp_path):
    html = render_html(build_report_data(None, [], results_dir=tmp_path), plotly_js="")
    assert "No GPU run is stored" in html and "No correctness results stored yet" in html
    assert "No inspect document" in html and "No traffic document" in html
    assert "No <code>lce_memory_*.json</code> result found" in html
    assert [t for _, t in _charts(html)] == ["roofline on NVIDIA A100 80GB SXM (modeled, bf16)"]


def test_documents_stored_with_a_run_are_shown_without_arguments(store_path, tmp_path):
    """`wavefront report` with no --doc keeps the inspect and traffic sections that bench stored."""
    with ResultStore(store_path) as st:
        st.add_document(1, "inspect", inspect_document())
        st.add_document(1, "traffic", traffic_document())
    html = write_report(tmp_path / "r.html", store_path, results_dir=None).read_text()
    titles = [t for _, t in _charts(html)]
    assert "inspect: occupancy per kernel and target" in titles
    assert "traffic: bytes moved by wavefront, the minimum, and eager PyTorch" in titles
    assert "inspect (stored with run 1)" in html
    with ResultStore(store_path) as st:
        st.add_document(2, "plan", {"schema": "wavefront.plan/0"})  # from another version of its tool
    assert "not shown: plan (stored with run 2): schema 'wavefront.plan/0'" in " ".join(
        build_report_data(store_path, results_dir=None).problems
    )
    given = dict(inspect_document(), rows=inspect_document()["rows"][:6])  # a given document wins over a stored one
    (tmp_path / "given.json").write_text(json.dumps(given))
    data = build_report_data(store_path, [tmp_path / "given.json"], results_dir=None)
    assert [d.source for d in data.documents if d.schema == "wavefront.inspect/1"] == [str(tmp_path / "given.json")]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ({"schema": "wavefront.results/1", "runs": []}, "schema 'wavefront.results/1': not a document the dashboard"),
        ([{"a": 1}], 'no "schema" field'),
        ({"schema": "wavefront.inspect/1", "rows": {"a": 1}}, "without a list of row objects"),
        ({"schema": "wavefront.traffic/1"}, "without a list of row objects"),
        ("not json", "cannot read JSON document"),
    ],
)
def test_wrong_documents_are_refused_in_one_line(tmp_path, content, message):
    path = tmp_path / "doc.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    with pytest.raises(DocumentError, match=re.escape(message)) as err:
        load_document_tables(path)
    assert "\n" not in str(err.value)


def test_missing_store_or_directory_is_an_error_not_an_empty_page(tmp_path):
    with pytest.raises(StoreError, match="no results store at"):
        build_report_data(tmp_path / "absent.sqlite")
    with pytest.raises(StoreError, match="is a directory"):
        build_report_data(tmp_path)


def test_report_is_self_contained(store_path, tmp_path):
    path = write_report(tmp_path / "r" / "index.html", store_path, results_dir=None)
    html = path.read_text()
    assert "Plotly" in html and len(html) > 1_000_000  # plotly.js is inlined
    assert not re.search(r"<script[^>]+src=", html)
    assert not re.search(r'<link[^>]+href=["\']https?:', html)


def test_generic_tables_tolerate_unknown_shapes():
    doc = document_tables(
        {
            "schema": "x/1",
            "summary": {"n": 2},
            "rows": [{"a": 1}, {"b": [1, 2]}],
            "nested": {"kernels": [{"k": "f"}]},
            "empty": [],
            "long": [{"kernels": [{"kernel": "_a"}, {"kernel": "_b"}], "blob": list(range(100))}],
        },
        "x.json",
    )
    assert [t.title for t in doc.tables] == ["rows", "nested.kernels", "long"]
    assert doc.tables[0].columns == ["a", "b"] and doc.tables[0].rows == [[1, None], [None, "[1,2]"]]
    assert doc.scalars["summary"] == '{"n":2}'
    kernels, blob = doc.tables[2].rows[0]
    assert kernels == "_a, _b" and len(blob) == 120 and blob.endswith("\u2026")  # no raw JSON walls
    with pytest.raises(ValueError, match="expected a JSON object"):
        document_tables(3, "bad.json")


def test_training_kpis_from_the_shared_store(store_path, tmp_path):
    html = write_report(tmp_path / "t.html", store_path, results_dir=None).read_text()
    assert "Training KPIs (wavefront train)" in html
    assert "training loss per step, run fixture-train" in html
    assert html.count("tiny-llama") >= 2  # one table row per variant
