"""The dashboard in a real browser: headless Chromium loads the file, no JavaScript errors, every chart
rendered; a screenshot is kept under artifacts/ (gitignored)."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import pytest

from wavefront.workbench.report import write_report

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
ARTIFACTS = Path(__file__).resolve().parents[3] / "artifacts"

pytestmark = pytest.mark.skipif(CHROMIUM is None or DRIVER is None,
                                reason="headless Chromium is not installed (CI installs the Debian packages "
                                       "chromium and chromium-driver; see .ci/run)")


@pytest.fixture
def browser():
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is a dev dependency")
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="wavefront-chromium-")
    for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--no-first-run", "--window-size=1400,1000",
                f"--user-data-dir={profile}"):
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


@pytest.mark.parametrize("with_runs", [True, False], ids=["gpu-fixture-runs", "cpu-only"])
def test_dashboard_renders_in_chromium(browser, store_path, inspect_doc, traffic_doc, tmp_path, with_runs):
    docs = [inspect_doc, traffic_doc, _trace_figures_doc(tmp_path)] if with_runs else []
    path = write_report(tmp_path / "index.html", store_path if with_runs else None, docs)
    state = _load(browser, path)
    assert state is not None, "the page's bootstrap script did not run"
    assert state["errors"] == []
    chart_ids = browser.execute_script("return Array.from(document.querySelectorAll('.wf-chart')).map(d => d.id)")
    assert state["expected"] == len(chart_ids) > 0
    if with_runs:
        titles = browser.execute_script(
            "return Array.from(document.querySelectorAll('.wf-chart')).map(d => d.dataset.title)")
        assert any("step" in t.lower() for t in titles), titles  # the trace's per-step breakdown chart
    assert sorted(state["rendered"]) == sorted(chart_ids), "some chart did not render"
    for cid in chart_ids:  # each chart drew its SVG with at least one trace
        n = browser.execute_script(f"return document.querySelectorAll('#{cid} .main-svg .trace').length")
        assert n >= 1, f"{cid} has no trace"
    severe = [e for e in browser.get_log("browser") if e.get("level") == "SEVERE"]
    assert severe == []
    ARTIFACTS.mkdir(exist_ok=True)
    assert browser.save_screenshot(str(ARTIFACTS / f"dashboard-{'runs' if with_runs else 'cpu'}.png"))
