"""The dashboard opens on its verdict (what passed, what is slow, what changed since the previous run), and
its roofline opens on the device the newest run targeted, not the first row of the device table."""

from __future__ import annotations

import re

from wavefront.workbench.bench.records import CorrectnessRow, RunInfo, StoredRun
from wavefront.workbench.bench.store import ResultStore
from wavefront.workbench.report import charts
from wavefront.workbench.report.data import build_report_data
from wavefront.workbench.report.headline import headline
from wavefront.workbench.report.html import render_html


def _cpu_run(day: int, softmax_passes: bool, device_model: str | None = "h100") -> StoredRun:
    info = RunInfo(f"2026-02-0{day}T00:00:00Z", "", "0" * 40, False, "cpu", "cpu", "cpu-interpreter", "2.13.0",
                   "3.9.0", "3.11", "fixture", "none", device_model=device_model)
    return StoredRun(info, correctness=[
        CorrectnessRow("rms_norm", "npow2", "bf16", True),
        CorrectnessRow("softmax", "wide", "fp32", softmax_passes),
    ])


def test_headline_on_the_fixture_store(store_path, inspect_doc, traffic_doc):
    h = headline(build_report_data(store_path, [inspect_doc, traffic_doc], results_dir=None))
    assert h.passed == "1/2 correctness cases pass; failing: softmax/wide/fp32 (run 1, cpu-interpreter)"
    assert h.bad
    assert h.slow.startswith("wavefront is not slower than any baseline in run 3 (8 comparisons)")
    assert "machine code: 1 failed to compile" in h.slow and "most above: rms_norm fwd 1.5x" in h.slow
    # Run 3's synthetic timings are 0.9x run 2's: every stored wavefront case is 10% faster.
    assert "wavefront timings vs GPU run 2: 4 of 4 cases moved by 3% or more" in h.changed
    assert "rms_norm/llama3-8b_hidden/fwd 10% faster" in h.changed


def test_headline_names_what_broke_since_the_previous_run(tmp_path):
    path = tmp_path / "store.sqlite"
    with ResultStore(path) as st:
        st.save(_cpu_run(1, softmax_passes=True))
        st.save(_cpu_run(2, softmax_passes=False))
    h = headline(build_report_data(path, results_dir=None))
    assert h.passed.startswith("1/2 correctness cases pass; failing: softmax/wide/fp32 (run 2")
    assert h.changed == "correctness vs run 1: 1 newly failing (softmax/wide/fp32), 0 newly passing"
    assert h.slow.startswith("no GPU timings stored")


def test_the_page_opens_on_the_headline(store_path, inspect_doc, traffic_doc):
    html = render_html(build_report_data(store_path, [inspect_doc, traffic_doc], results_dir=None), plotly_js="")
    body = html[html.index("<body"):]
    top = body.index('id="headline"')
    assert top < body.index("<h2>") and top < body.index("wf-chart")
    section = re.search(r'<section id="headline".*?</section>', body, re.S).group(0)
    assert [m for m in re.findall(r"<dt>(.*?)</dt>", section)] == ["passed", "slow", "changed"]
    assert "1/2 correctness cases pass" in section and 'class="headline bad"' in section


def test_roofline_opens_on_the_run_target(tmp_path):
    path = tmp_path / "store.sqlite"
    with ResultStore(path) as st:
        st.save(_cpu_run(1, True, device_model="b200"))
    data = build_report_data(path, results_dir=None)
    assert data.target_device == "b200"
    fig = charts.roofline(data.modeled, data.measured, None, data.target_device)
    from wavefront.workbench.hardware import GPUS

    name = GPUS["b200"].name
    assert fig.title.startswith(f"roofline on {name} (") and fig.views[0].label == name
    assert len(fig.views) == len(data.modeled)  # every device still selectable
    html = render_html(data, plotly_js="")
    assert f"roofline on {name} (" in html
    # No run names a target: the table's order, as before.
    none = build_report_data(None, results_dir=None)
    assert none.target_device is None
    assert charts.roofline(none.modeled, {}, None, None).views[0].label == GPUS[next(iter(none.modeled))].name
