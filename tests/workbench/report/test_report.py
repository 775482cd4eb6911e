"""The dashboard's content: self-contained, every section present, other tools' JSON tabulated."""

from __future__ import annotations

import re

import pytest

from wavefront.workbench.hardware import GPUS
from wavefront.workbench.report import write_report
from wavefront.workbench.report.data import build_report_data
from wavefront.workbench.report.html import render_html
from wavefront.workbench.report.tables import document_tables


def _charts(html: str) -> list[str]:
    return re.findall(r'<div class="wf-chart" id="(chart-\d+)" data-title="([^"]*)"', html)


def test_full_report_sections(store_path, inspect_doc, traffic_doc):
    data = build_report_data(store_path, [inspect_doc, traffic_doc])
    assert data.latest_gpu is not None and data.latest_gpu.info.created_utc.startswith("2026-01-03")
    assert {s.baseline for s in data.speedups} == {"eager", "torch_compile"}
    by = {(s.case, s.mode, s.baseline): s for s in data.speedups}
    assert by[("wide_65536", "fwd", "eager")].speedup == pytest.approx(2.5, rel=0.03)
    assert by[("wide_65536", "fwd", "eager")].verdict == "faster"
    assert len({h.run_id for h in data.history}) == 2
    assert len(data.measured["h100"]) == 2 * 12  # two GPU runs x (2 cases x 2 modes x 3 timed providers)
    html = render_html(data, plotly_js="/* plotly stub */")
    titles = [t for _, t in _charts(html)]
    assert sum("roofline" in t for t in titles) == len(GPUS)
    assert any("H100 roofline (modeled + measured)" in t for t in titles)
    assert any("A100 roofline (modeled only)" in t for t in titles)
    assert any("speedup" in t for t in titles) and any("history" in t for t in titles)
    assert any("correctness" in t for t in titles)
    assert "1/2 cases pass" in html
    assert "global_load_dwordx4" in html and "new_column" in html and "bytes_loaded" in html
    assert "CPU interpreter: not a performance figure" in html


def test_cpu_only_report_explains_missing_gpu_sections(tmp_path):
    html = render_html(build_report_data(None, []), plotly_js="")
    assert "No GPU run is stored" in html and "No correctness results stored yet" in html
    assert len(_charts(html)) == len(GPUS)  # the modeled rooflines need no run


def test_report_is_self_contained(store_path, tmp_path):
    path = write_report(tmp_path / "r" / "index.html", store_path)
    html = path.read_text()
    assert "Plotly" in html and len(html) > 1_000_000  # plotly.js is inlined
    assert not re.search(r'<script[^>]+src=', html)
    assert not re.search(r'<link[^>]+href=["\']https?:', html)


def test_generic_tables_tolerate_unknown_shapes():
    doc = document_tables({"schema": "x/1", "summary": {"n": 2}, "rows": [{"a": 1}, {"b": [1, 2]}],
                           "nested": {"kernels": [{"k": "f"}]}, "empty": []}, "x.json")
    assert [t.title for t in doc.tables] == ["rows", "nested.kernels"]
    assert doc.tables[0].columns == ["a", "b"] and doc.tables[0].rows == [[1, None], [None, "[1,2]"]]
    assert doc.scalars["summary"] == '{"n":2}'
    with pytest.raises(ValueError, match="expected a JSON object"):
        document_tables(3, "bad.json")


def test_training_kpis_from_the_shared_store(store_path, tmp_path):
    html = write_report(tmp_path / "t.html", store_path).read_text()
    assert "Training KPIs (wavefront train)" in html
    assert "training loss per step, run fixture-train" in html
    assert html.count("tiny-llama") >= 2  # one table row per variant
