"""The dashboard in a real browser: headless Chromium loads the file, no JavaScript errors, every chart
rendered with labelled axes, the inspect heat map and the roofline's device selector work; screenshots are
kept under artifacts/ (gitignored)."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from wavefront.workbench.report import write_report


def _chromium() -> str | None:
    """The browser: $WAVEFRONT_CHROMIUM when set (a path that does not exist means none), else chromium on PATH."""
    chosen = os.environ.get("WAVEFRONT_CHROMIUM")
    if chosen is not None:
        return chosen if os.access(chosen, os.X_OK) else None
    return shutil.which("chromium") or shutil.which("chromium-browser")


CHROMIUM = _chromium()
DRIVER = shutil.which("chromedriver")
ARTIFACTS = Path(__file__).resolve().parents[3] / "artifacts"
RESULTS = Path(__file__).resolve().parents[3] / "benchmarks" / "results"

# tests/conftest.py counts the tests marked `browser` that were skipped: one line at the end, a failure in CI.
pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(CHROMIUM is None or DRIVER is None,
                       reason="headless Chromium or chromedriver is not installed"),
]


@pytest.fixture
def browser():
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is a dev dependency")
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="wavefront-chromium-")
    for arg in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--window-size=1400,1000",
        f"--user-data-dir={profile}",
    ):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(DRIVER), options=opts)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def _load(driver, path: Path, timeout_s: float = 60.0) -> dict:
    driver.get(path.resolve().as_uri())
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if driver.execute_script("return document.body && document.body.getAttribute('data-charts-rendered')"):
            break
        time.sleep(0.2)
    return driver.execute_script("return window.__wf")


def _trace_figures_doc(tmp_path: Path) -> Path:
    """Dashboard figures of a planted (synthetic) GPU trace, as `wavefront trace analyze --figures` writes."""
    import json

    from wavefront.workbench.trace import analyze
    from wavefront.workbench.trace.figures import figures
    from wavefront.workbench.trace.testing import planted_gpu_trace

    trace = planted_gpu_trace().write(tmp_path / "planted.json")
    doc = {"schema": "wavefront.trace.figures/1", "figures": figures(analyze([trace], device="h100"))}
    out = tmp_path / "trace-figures.json"
    out.write_text(json.dumps(doc))
    return out


def _axis_titles(driver, cid: str) -> list[str]:
    return driver.execute_script(
        f"return Array.from(document.querySelectorAll('#{cid} .xtitle, #{cid} .ytitle')).map(e => e.textContent)"
    )


def _select(driver, cid: str, label: str) -> None:
    """Pick `label` in the chart's view selector as a user would, and wait for the chart to redraw."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    sel = driver.find_element(By.ID, f"{cid}-view")
    driver.execute_script("arguments[0].scrollIntoView()", sel)
    Select(sel).select_by_visible_text(label)
    wanted = str([o.text for o in Select(sel).options].index(label))
    deadline = time.monotonic() + 10
    while driver.execute_script(f"return document.getElementById('{cid}').getAttribute('data-view')") != wanted:
        assert time.monotonic() < deadline, f"{cid} did not switch to {label}"
        time.sleep(0.1)


def _chart_id(driver, title_start: str) -> str:
    return driver.execute_script(
        "return Array.from(document.querySelectorAll('.wf-chart')).find(d => d.dataset.title.startsWith("
        f"{title_start!r})).id"
    )


@pytest.mark.parametrize("with_runs", [True, False], ids=["gpu-fixture-runs", "cpu-only"])
def test_dashboard_renders_in_chromium(browser, store_path, inspect_doc, traffic_doc, tmp_path, with_runs):
    docs = [inspect_doc, traffic_doc, _trace_figures_doc(tmp_path)] if with_runs else []
    path = write_report(
        tmp_path / "index.html", store_path if with_runs else None, docs, results_dir=RESULTS if with_runs else None
    )
    state = _load(browser, path)
    assert state is not None, "the page's bootstrap script did not run"
    assert state["errors"] == []
    chart_ids = browser.execute_script("return Array.from(document.querySelectorAll('.wf-chart')).map(d => d.id)")
    assert state["expected"] == len(chart_ids) > 0
    titles = browser.execute_script(
        "return Array.from(document.querySelectorAll('.wf-chart')).map(d => d.dataset.title)"
    )
    if with_runs:
        assert any("step" in t.lower() for t in titles), titles  # the trace's per-step breakdown chart
    assert sorted(state["rendered"]) == sorted(chart_ids), "some chart did not render"
    for cid in chart_ids:  # each chart drew its SVG with at least one trace
        n = browser.execute_script(
            f"return document.querySelectorAll('#{cid} .main-svg .trace, #{cid} .main-svg .hm').length"
        )
        assert n >= 1, f"{cid} has no trace"
    ours = browser.execute_script(
        "return Array.from(document.querySelectorAll('.wf-chart:not([data-source])')).map(d => d.id)"
    )
    assert len(ours) >= (6 if with_runs else 1)
    for cid in ours:  # our charts label both axes (ready-made figures from other tools' documents aside)
        assert all(_axis_titles(browser, cid)) and len(_axis_titles(browser, cid)) >= 2, (
            cid,
            _axis_titles(browser, cid),
        )
    assert sum(t.startswith("roofline on") for t in titles) == 1  # one roofline, not one per device
    roof = _chart_id(browser, "roofline on")
    if not with_runs:  # the fixture runs targeted the H100: the roofline opens on it, no selection needed
        _select(browser, roof, "NVIDIA H100 SXM")
    title = browser.execute_script(f"return document.querySelector('#{roof} .gtitle').textContent")
    assert title == (
        "roofline on NVIDIA H100 SXM (modeled + measured, bf16)"
        if with_runs
        else "roofline on NVIDIA H100 SXM (modeled, bf16)"
    )
    legend = browser.execute_script(
        f"return Array.from(document.querySelectorAll('#{roof} .legendtext')).map(e => e.textContent)"
    )
    assert "rms_norm" in legend and "softmax" in legend  # points coloured by op, named in the legend
    assert ("measured: wavefront" in legend) == with_runs
    if with_runs:
        heat = _chart_id(browser, "inspect:")
        cells = browser.execute_script(f"return document.querySelectorAll('#{heat} .hm image').length")
        assert cells == 1, "the heat map drew no image"
        _select(browser, heat, "registers per thread")
        assert browser.execute_script(f"return document.querySelector('#{heat} .gtitle').textContent") == (
            "inspect: registers per thread per kernel and target"
        )
        assert "traffic: bytes moved by wavefront, the minimum, and eager PyTorch" in titles
        assert any(t.startswith("fused linear + cross-entropy") for t in titles)
    # The page opens on its verdict: the headline is whole in the first screen, above every section.
    browser.execute_script("window.scrollTo(0, 0)")
    box = browser.execute_script(
        "var r=document.getElementById('headline').getBoundingClientRect();"
        "return [r.top, r.bottom, window.innerHeight, document.querySelector('h2').getBoundingClientRect().top]"
    )
    assert 0 <= box[0] < box[1] <= box[2] and box[1] <= box[3], box
    text = browser.execute_script("return document.getElementById('headline').innerText")
    assert ("1/2 correctness cases pass" in text) == with_runs and "changed" in text
    severe = [e for e in browser.get_log("browser") if e.get("level") == "SEVERE"]
    assert severe == []
    ARTIFACTS.mkdir(exist_ok=True)
    browser.execute_script("window.scrollTo(0, 0)")
    name = "runs" if with_runs else "cpu"
    assert browser.save_screenshot(str(ARTIFACTS / f"dashboard-{name}.png"))
    if with_runs:
        browser.execute_script(f"document.getElementById('{roof}').scrollIntoView()")
        assert browser.save_screenshot(str(ARTIFACTS / "dashboard-roofline.png"))
