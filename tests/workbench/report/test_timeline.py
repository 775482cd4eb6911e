"""The dashboard's timeline view of trace-analysis documents (torch.profiler JSON, Nsight Systems and
rocprofv3 timelines): the segments are the steps' exact breakdowns, and the view renders in Chromium."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from wavefront.workbench.report import write_report
from wavefront.workbench.report.timeline import is_timeline, kernels_table, segments, timeline_figure
from wavefront.workbench.trace import analyze
from wavefront.workbench.trace.breakdown import CATEGORIES
from wavefront.workbench.trace.testing import (
    PLANTED_STEP1_US,
    PLANTED_STEP2_US,
    planted_gpu_trace,
    planted_ranks,
    write_nsys_sqlite,
    write_rocprof_csv,
)

ARTIFACTS = Path(__file__).resolve().parents[3] / "artifacts"


def _docs(tmp_path: Path) -> tuple[Path, Path]:
    nsys = analyze([write_nsys_sqlite(planted_gpu_trace(), tmp_path / "p.sqlite")]).as_dict()
    ranks = planted_ranks([0.0, 0.0], late_rank=1, late_us=100.0, same_host=True, vendor="amd")
    roc = analyze([write_rocprof_csv(t, tmp_path / "roc", prefix=f"{i}_") for i, t in enumerate(ranks)]).as_dict()
    paths = tmp_path / "nsys.trace.json", tmp_path / "rocprof.trace.json"
    for path, doc in zip(paths, (nsys, roc), strict=True):
        path.write_text(json.dumps(doc))
    return paths


def test_segments_are_the_exact_breakdown(tmp_path):
    doc = json.loads(_docs(tmp_path)[0].read_text())
    assert is_timeline(doc) and not is_timeline({"ranks": [{"steps": [{"start_ns": 0}]}]})
    segs = segments(doc)
    for step, planted in ((1, PLANTED_STEP1_US), (2, PLANTED_STEP2_US)):
        widths = {c: sum(w for _, _, w, s in segs[c] if s == step) for c in CATEGORIES}
        assert widths == {c: planted[c] * 1000 for c in CATEGORIES}
    # laid end to end from the step's start: step 2 begins 1 ms after step 1, its first segment there
    assert min(at for c in CATEGORIES for _, at, _, s in segs[c] if s == 2) == 1_000_000
    ends = [at + w for c in CATEGORIES for _, at, w, s in segs[c] if s == 1]
    assert max(ends) == 1_000_000  # the segments of a step fill exactly its duration
    labels = {label for c in CATEGORIES for label, *_ in segs[c]}
    assert labels == {"file 0 (Nsight Systems export)"}
    fig = timeline_figure(doc, "nsys.trace.json")
    assert [t["name"] for t in fig.data][0] == "compute" and fig.layout["barmode"] == "overlay"
    compute = fig.data[0]
    assert compute["x"] == [0.4, 0.34] and compute["base"][1] == 1.0  # ms, for the chart only


def test_kernel_table_names_the_source(tmp_path):
    doc = json.loads(_docs(tmp_path)[1].read_text())
    table = kernels_table(doc)
    assert {row[0] for row in table.rows} == {"file 0 (rocprofv3 trace)", "file 1 (rocprofv3 trace)"}
    assert any(row[1].startswith("ncclKernel_AllReduce") and row[2] == "comm" for row in table.rows)


def _chromium() -> str | None:
    chosen = os.environ.get("WAVEFRONT_CHROMIUM")
    if chosen is not None:
        return chosen if os.access(chosen, os.X_OK) else None
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.browser
@pytest.mark.skipif(_chromium() is None or shutil.which("chromedriver") is None,
                    reason="headless Chromium or chromedriver is not installed")
def test_timeline_renders_in_chromium(tmp_path):
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is a dev dependency")
    from selenium.webdriver.chrome.service import Service

    path = write_report(tmp_path / "index.html", None, list(_docs(tmp_path)), results_dir=None)
    opts = webdriver.ChromeOptions()
    opts.binary_location = _chromium()
    profile = tempfile.mkdtemp(prefix="wavefront-chromium-")
    for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--window-size=1400,1000",
                f"--user-data-dir={profile}"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=opts)
    try:
        driver.get(path.resolve().as_uri())
        deadline = time.monotonic() + 60
        while not driver.execute_script("return document.body && document.body.getAttribute('data-charts-rendered')"):
            assert time.monotonic() < deadline, "the charts did not render"
            time.sleep(0.2)
        state = driver.execute_script("return window.__wf")
        assert state["errors"] == [] and sorted(state["rendered"]) == sorted(
            driver.execute_script("return Array.from(document.querySelectorAll('.wf-chart')).map(d => d.id)"))
        ids = driver.execute_script("return Array.from(document.querySelectorAll('.wf-chart')).filter("
                                    "d => d.dataset.title.startsWith('timeline:')).map(d => d.id)")
        assert len(ids) == 2
        for cid in ids:
            rows = driver.execute_script(f"return Array.from(document.querySelectorAll('#{cid} .ytick text'))"
                                         ".map(e => e.textContent)")
            bars = driver.execute_script(f"return document.querySelectorAll('#{cid} .bars .point').length")
            titles = driver.execute_script(f"return Array.from(document.querySelectorAll('#{cid} .xtitle, "
                                           f"#{cid} .ytitle')).map(e => e.textContent)")
            assert bars >= 10 and len(titles) == 2 and all(titles)
            assert all("(" in r for r in rows) and len(rows) in (1, 2)
        legend = driver.execute_script(f"return Array.from(document.querySelectorAll('#{ids[0]} .legendtext'))"
                                       ".map(e => e.textContent)")
        assert {"compute", "exposed comm", "idle: host-bound"} <= set(legend)
        ARTIFACTS.mkdir(exist_ok=True)
        driver.execute_script(f"document.getElementById('{ids[1]}').scrollIntoView()")
        assert driver.save_screenshot(str(ARTIFACTS / "dashboard-timeline.png"))
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
