"""The dashboard's counters view: measured launches on the roofline, predicted-vs-measured bars and the A/B
chart, as figure specs and in headless Chromium (a screenshot lands in artifacts/dashboard-counters.png)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_browser import ARTIFACTS, CHROMIUM, DRIVER, _axis_titles, _chart_id, _load, _select, browser  # noqa: F401

from wavefront.workbench.jobs import counters as job
from wavefront.workbench.report import counters as view
from wavefront.workbench.report import write_report
from wavefront.workbench.report.tables import DocumentError, load_document_tables

DATA = Path(__file__).resolve().parents[2] / "data" / "counters"


def _docs(tmp_path: Path) -> tuple[Path, Path]:
    one = job.counters(job.CountersRequest(DATA / "ncu_raw_h100_a.csv", None, DATA / "inspect_rms_norm.json",
                                           DATA / "traffic_rms_norm.json")).as_dict()
    ab = job.compare(job.CompareRequest(DATA / "ncu_raw_h100_a.csv", DATA / "ncu_raw_h100_b.csv")).as_dict()
    (tmp_path / "counters.json").write_text(json.dumps(one))
    (tmp_path / "ab.json").write_text(json.dumps(ab))
    return tmp_path / "counters.json", tmp_path / "ab.json"


def test_roofline_points_are_the_documents_measurements(tmp_path):
    doc = json.loads(_docs(tmp_path)[0].read_text())
    fig = view.roofline(doc)
    attn = next(t for t in fig.data if t["name"] == "_attn_fwd_kernel [4096 x 256]")
    k = doc["kernels"][6]
    assert attn["x"] == [k["intensity_dram"]] and attn["y"] == [k["achieved_tflops"]]
    l2 = next(t for t in fig.data if t["name"] == "_attn_fwd_kernel [4096 x 256] (L2)")
    assert l2["x"] == [k["intensity_l2"]] and l2["y"] == attn["y"]
    roof = fig.data[0]
    assert max(roof["y"]) == doc["matrix_peak_tflops"]
    assert roof["y"][0] == pytest.approx(roof["x"][0] * doc["hbm_tbps"])  # the bandwidth slope at the left


def test_predicted_vs_measured_bars(tmp_path):
    doc = json.loads(_docs(tmp_path)[0].read_text())
    fig = view.predicted_vs_measured(doc)
    assert fig is not None and [v.label for v in fig.views] == [b[0] for b in view._BARS]
    pred, meas = fig.data[0], fig.data[1]
    i = pred["x"].index("_norm_bwd_kernel [521 x 512]")
    assert pred["y"][i] == doc["kernels"][5]["predicted"]["bytes"] and meas["y"][i] == doc["kernels"][5]["dram_bytes"]
    occupancy = [t for t, shown in zip(fig.data, fig.views[1].data["visible"], strict=True) if shown]
    assert [t["name"] for t in occupancy] == ["predicted", "theoretical (profiler)", "achieved"]
    assert [t["y"][i] for t in occupancy] == [0.5, pytest.approx(0.25), pytest.approx(0.238)]
    assert "_attn_fwd_kernel [4096 x 256]" not in pred["x"]  # matched nothing: no bar
    doc["kernels"] = [doc["kernels"][6]]
    assert view.predicted_vs_measured(doc) is None


def test_counters_documents_are_checked(tmp_path):
    f = tmp_path / "bad.json"
    f.write_text(json.dumps({"schema": "wavefront.counters/1", "kernels": 3}))
    with pytest.raises(DocumentError, match='without a list of objects in "kernels"'):
        load_document_tables(f)


@pytest.mark.browser
@pytest.mark.skipif(CHROMIUM is None or DRIVER is None, reason="headless Chromium or chromedriver is not installed")
def test_counters_view_renders_in_chromium(browser, tmp_path):  # noqa: F811
    one, ab = _docs(tmp_path)
    path = write_report(tmp_path / "index.html", None, [one, ab], results_dir=None)
    state = _load(browser, path)
    assert state is not None and state["errors"] == []
    assert sorted(state["rendered"]) == sorted(
        browser.execute_script("return Array.from(document.querySelectorAll('.wf-chart')).map(d => d.id)"))
    roof = _chart_id(browser, "measured counters on the NVIDIA H100 SXM roofline")
    bars = _chart_id(browser, "predicted vs measured")
    abc = _chart_id(browser, "counter A/B")
    for cid in (roof, bars, abc):
        assert all(_axis_titles(browser, cid)) and len(_axis_titles(browser, cid)) >= 2, cid
    legend = browser.execute_script(
        f"return Array.from(document.querySelectorAll('#{roof} .legendtext')).map(e => e.textContent)")
    assert "_norm_fwd_kernel [32768 x 256]" in legend and "_attn_fwd_kernel [4096 x 256]" in legend
    n_points = browser.execute_script(f"return document.querySelectorAll('#{roof} .scatterlayer .point').length")
    assert n_points == 3 * 7  # each launch at its DRAM, L2 and L1 intensity
    _select(browser, bars, "occupancy vs inspect")
    assert browser.execute_script(f"return document.querySelector('#{bars} .gtitle').textContent") == \
        "predicted vs measured: occupancy vs inspect"
    assert [e for e in browser.get_log("browser") if e.get("level") == "SEVERE"] == []
    ARTIFACTS.mkdir(exist_ok=True)
    browser.execute_script(f"document.getElementById('{roof}').scrollIntoView()")
    assert browser.save_screenshot(str(ARTIFACTS / "dashboard-counters.png"))
    browser.execute_script(f"document.getElementById('{bars}').scrollIntoView()")
    assert browser.save_screenshot(str(ARTIFACTS / "dashboard-counters-bars.png"))
