"""Render :class:`~wavefront.workbench.report.data.ReportData` as one self-contained HTML file.

plotly.js is inlined once (offline: no CDN, no network); every chart is a ``div.wf-chart`` with its
figure as JSON beside it, drawn by ``Plotly.newPlot``; a chart with views (charts.View) gets a
``select.wf-view`` above it that applies the chosen view with ``Plotly.update``. The page records
JavaScript errors and which charts rendered in ``window.__wf`` (and ``body[data-charts-rendered]``),
which the browser test reads. Raw tables are collapsed (``<details>``) under the charts they feed.
"""

from __future__ import annotations

import html
import json
import math
from dataclasses import asdict
from typing import Any

from wavefront.workbench.bench.records import CPU_LABEL
from wavefront.workbench.hardware import GPUS
from wavefront.workbench.report import charts, counters, timeline
from wavefront.workbench.report.data import ReportData
from wavefront.workbench.report.headline import headline
from wavefront.workbench.report.tables import INSPECT, LCE_MEMORY, TRACE_FIGURES, TRAFFIC, Document, Table

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0 auto;max-width:1280px;padding:0 24px 48px;
color:#1d2330}
h1{margin:24px 0 4px} h2{margin-top:40px;border-bottom:1px solid #dde1e8;padding-bottom:4px}
.note{color:#5b6475;font-size:0.92em} .warn{background:#fff6e0;border-left:4px solid #e0a000;padding:6px 10px}
table{border-collapse:collapse;font-size:0.85em;margin:8px 0} th,td{border:1px solid #dde1e8;padding:3px 6px;
text-align:left;vertical-align:top} th{background:#f3f5f9;position:sticky;top:0} td.num{text-align:right;
font-variant-numeric:tabular-nums} .pass{color:#137333} .fail{color:#c5221f;font-weight:600}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(600px,1fr));gap:16px}
.wf-chart{min-height:360px;border:1px solid #eef0f4} details{margin:8px 0} summary{cursor:pointer;color:#1a4fa0}
.wf-view-row{margin:8px 0} .wf-view-row select{font-size:1em;padding:2px 6px;margin-left:6px}
.wf-table-wrap{max-height:640px;overflow:auto} td{white-space:nowrap}
.headline{margin:16px 0;padding:10px 16px;border-left:6px solid #137333;background:#eef7f0;font-size:1.05em}
.headline.bad{border-left-color:#c5221f;background:#fdf0ef} .headline dl{display:grid;grid-template-columns:
max-content 1fr;gap:6px 16px;margin:0} .headline dt{font-weight:600} .headline dd{margin:0}
"""

_BOOT = """window.__wf={errors:[],rendered:[],expected:0};
window.addEventListener('error',function(e){window.__wf.errors.push(String(e.message||e));});
window.addEventListener('unhandledrejection',function(e){window.__wf.errors.push('unhandled: '+String(e.reason));});"""

_DRAW = """(function(){var charts=document.querySelectorAll('.wf-chart');window.__wf.expected=charts.length;
var jobs=Array.prototype.map.call(charts,function(div){
 var spec=JSON.parse(document.getElementById(div.id+'-spec').textContent);
 return Plotly.newPlot(div,spec.data,spec.layout,{responsive:true,displaylogo:false}).then(function(){
  if(div.querySelector('.main-svg')){window.__wf.rendered.push(div.id);}
  var sel=document.getElementById(div.id+'-view');
  if(sel){sel.addEventListener('change',function(){var v=spec.views[Number(sel.value)];
   Plotly.update(div,v.data,v.layout).then(function(){div.setAttribute('data-view',sel.value);},
    function(e){window.__wf.errors.push('view: '+String(e));});});}});});
Promise.all(jobs).then(function(){document.body.setAttribute('data-charts-rendered',String(window.__wf.rendered.length));},
 function(e){window.__wf.errors.push('plot: '+String(e));});})();"""


def _esc(x: Any) -> str:
    return html.escape("" if x is None else str(x))


def _fmt(x: Any) -> str:
    if isinstance(x, float):
        if not math.isfinite(x):
            return ""
        return f"{x:.4g}"
    return _esc(x)


class _Page:
    def __init__(self):
        self.parts: list[str] = []
        self.n_charts = 0

    def add(self, text: str) -> None:
        self.parts.append(text)

    def figure(self, fig: charts.Figure, *, source: str = "") -> str:
        """A chart (with its view selector when it has views) and its note; `source`: the document a
        ready-made figure came from (``data-source``), empty for the dashboard's own charts."""
        cid = f"chart-{self.n_charts}"
        self.n_charts += 1
        layout = {
            "margin": {"l": 80, "r": 20, "t": 60, "b": 80},
            "height": 420,
            "template": None,
            **fig.layout,
            "title": {"text": fig.title, **fig.layout.get("title", {})},
        }
        spec = {"data": fig.data, "layout": layout, "views": [asdict(v) for v in fig.views]}
        text = json.dumps(spec, allow_nan=False, default=str).replace("</", "<\\/")
        select = ""
        if fig.views:
            options = "".join(f'<option value="{i}">{_esc(v.label)}</option>' for i, v in enumerate(fig.views))
            select = (
                f'<div class="wf-view-row"><label for="{cid}-view">{_esc(fig.view_label)}</label>'
                f'<select class="wf-view" id="{cid}-view" data-chart="{cid}">{options}</select></div>'
            )
        note = f'<p class="note">{_esc(fig.note)}</p>' if fig.note else ""
        origin = f' data-source="{_esc(source)}"' if source else ""
        return (
            f'{select}<div class="wf-chart" id="{cid}" data-title="{_esc(fig.title)}"{origin}></div>'
            f'<script type="application/json" id="{cid}-spec">{text}</script>{note}'
        )

    def chart(self, data: list[dict], layout: dict, title: str, *, source: str = "") -> str:
        return self.figure(charts.Figure(title, data, layout), source=source)

    def table(self, t: Table, *, collapsed: bool = True) -> str:
        head = "".join(f"<th>{_esc(c)}</th>" for c in t.columns)
        body = "".join(
            "<tr>"
            + "".join(
                f'<td class="num">{_fmt(v)}</td>'
                if isinstance(v, int | float) and not isinstance(v, bool)
                else f"<td>{_fmt(v)}</td>"
                for v in row
            )
            + "</tr>"
            for row in t.rows
        )
        more = f'<p class="note">{t.truncated} more rows not shown.</p>' if t.truncated else ""
        inner = f'<div class="wf-table-wrap"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'
        note = f'<p class="note">{_esc(t.note)}</p>' if t.note else ""
        if collapsed:
            return (
                f"<details><summary>{_esc(t.title)}: table ({len(t.rows)} rows x {len(t.columns)} columns)"
                f"</summary>{note}{inner}{more}</details>"
            )
        return f"<h3>{_esc(t.title)}</h3>{note}{inner}{more}"


_TRAIN_COLUMNS = (
    "run_id",
    "variant",
    "status",
    "started_at",
    "device_name",
    "backend",
    "world_size",
    "parallel",
    "model",
    "tokens_per_s",
    "tokens_per_s_per_device",
    "mfu",
    "hfu",
    "peak_source",
    "peak_mem_bytes",
    "step_s",
    "cost_per_step",
    "cost_per_mtok",
    "energy_per_step_j",
    "energy_kind",
    "final_loss",
)


def _training_table(data: ReportData) -> Table:
    rows = [[r.get(c) for c in _TRAIN_COLUMNS] for r in data.training_runs]
    cpu = any(str(r.get("backend", "")).startswith("cpu") for r in data.training_runs)
    return Table("training runs", list(_TRAIN_COLUMNS), rows, CPU_LABEL if cpu else "")


def _runs_table(data: ReportData) -> Table:
    cols = [
        "id",
        "status",
        "created_utc",
        "label",
        "git_sha",
        "git_dirty",
        "device_name",
        "arch",
        "backend",
        "timing",
        "driver",
        "torch",
        "triton",
        "copy_gbps",
    ]
    rows = [
        [
            data.statuses.get(int(r.id), "")
            if c == "status"
            else (r.git_sha or "")[:12]
            if c == "git_sha"
            else getattr(r, c)
            for c in cols
        ]
        for r in data.runs
    ]
    return Table("stored runs", cols, rows)


def _correctness_table(data: ReportData) -> Table:
    cols = [
        "op",
        "case",
        "dtype",
        "result",
        "fwd_err_ours",
        "fwd_err_eager",
        "fwd_bound",
        "bwd_err_ours",
        "bwd_err_eager",
        "bwd_bound",
        "error",
    ]
    rows = [
        [
            r.op,
            r.case,
            r.dtype,
            "pass" if r.passed else "FAIL",
            r.fwd_err_ours,
            r.fwd_err_eager,
            r.fwd_bound,
            r.bwd_err_ours,
            r.bwd_err_eager,
            r.bwd_bound,
            r.error or "",
        ]
        for r in data.correctness_run.correctness
    ]
    failed = [r for r in rows if r[3] == "FAIL"]
    return Table(
        f"correctness, run {data.correctness_run.info.id}", cols, failed + [r for r in rows if r[3] != "FAIL"]
    )  # failures first


def _measurement_table(run, title: str, note: str = "") -> Table:
    cols = [
        "op",
        "case",
        "mode",
        "dtype",
        "provider",
        "status",
        "median_us",
        "p10_us",
        "p90_us",
        "n_reps",
        "method",
        "flush",
        "gbps",
        "tflops",
        "pct_peak_bw",
        "pct_copy_bw",
        "pct_peak_flops",
        "peak_mem_bytes",
        "max_diff_vs_eager",
        "reason",
    ]
    rows = [
        [
            m.op,
            m.case,
            m.mode,
            m.dtype,
            m.provider,
            m.status,
            m.median_us,
            m.p10_us,
            m.p90_us,
            len(m.samples_us),
            m.method,
            m.flush,
            m.gbps,
            m.tflops,
            m.pct_peak_bw,
            m.pct_copy_bw,
            m.pct_peak_flops,
            m.peak_mem_bytes,
            m.max_diff_vs_eager,
            m.reason,
        ]
        for m in run.measurements
    ]
    return Table(title, cols, rows, note)


def _modeled_table(data: ReportData) -> Table:
    cols = ["device", "op", "case", "mode", "dtype", "intensity", "attainable_us", "bound", "flops", "min_bytes"]
    rows = [[GPUS[key].name, *(getattr(p, c) for c in cols[1:])] for key, pts in data.modeled.items() for p in pts]
    return Table("modeled roofline points (datasheet figures; nothing was run)", cols, rows)


def _first(docs: list[Document], schema: str) -> Document | None:
    return next((d for d in docs if d.schema == schema), None)


def _doc_tables(page: _Page, doc: Document) -> None:
    for t in doc.tables:
        page.add(page.table(Table(f"{t.title} from {doc.source}", t.columns, t.rows, t.note, t.truncated)))


def _static_sections(page: _Page, data: ReportData) -> None:
    inspect, traffic = _first(data.documents, INSPECT), _first(data.documents, TRAFFIC)
    page.add("<h2>Machine code per target (inspect)</h2>")
    if inspect:
        body = inspect.body
        page.add(
            f'<p class="note">{_esc(inspect.source)}: {len(body.get("rows", []))} kernel x target rows, '
            f"{_esc(body.get('n_failed', 0))} failed to compile; dtype {_esc(body.get('dtype'))}. Pick the "
            "metric above the map.</p>"
        )
        page.add(page.figure(charts.inspect_heatmap(inspect)))
        _doc_tables(page, inspect)
    else:
        page.add(
            '<p class="note">No inspect document: <code>wavefront bench</code> on CPU stores one with its run; '
            "or pass <code>--doc</code> with <code>wavefront inspect --json</code> output.</p>"
        )
    page.add("<h2>Bytes moved (traffic)</h2>")
    if traffic:
        page.add(f'<p class="note">{_esc(traffic.source)}: {_esc(traffic.body.get("note", ""))}.</p>')
        page.add(page.figure(charts.traffic_bars(traffic)))
        _doc_tables(page, traffic)
    else:
        page.add(
            '<p class="note">No traffic document: <code>wavefront bench</code> on CPU stores one with its run; '
            "or pass <code>--doc</code> with <code>wavefront traffic --json</code> output.</p>"
        )


def _gpu_sections(page: _Page, data: ReportData) -> None:
    page.add("<h2>Speedups vs baselines</h2>")
    if data.speedups:
        page.add(page.figure(charts.speedups(data.speedups, data.latest_gpu.info if data.latest_gpu else None)))
        page.add(page.table(_measurement_table(data.latest_gpu, f"measurements, run {data.latest_gpu.info.id}")))
    else:
        page.add(
            '<p class="note">No GPU run is stored: speedups need real timings (run '
            "<code>scripts/gpu_check.sh</code> or <code>wavefront bench</code> on a GPU).</p>"
        )
    page.add("<h2>History</h2>")
    if data.history:
        page.add(page.figure(charts.history(data.history)))
    else:
        page.add('<p class="note">No GPU runs stored yet: the history of timings starts with the first one.</p>')


def _cpu_section(page: _Page, data: ReportData) -> None:
    checked = data.correctness_run
    cpu_runs = [
        r for r in ([data.latest] if data.latest else []) if r.info.timing == "cpu-interpreter" and r.measurements
    ]
    cpu_checked = checked is not None and checked.info.backend.startswith("cpu")
    if not (cpu_runs or cpu_checked):
        return
    page.add(f"<h2>CPU wall times ({_esc(CPU_LABEL)})</h2>")
    if cpu_checked:
        wall = Table(
            "correctness wall time per case",
            ["op", "case", "dtype", "wall_s"],
            [[r.op, r.case, r.dtype, r.wall_s] for r in checked.correctness],
            CPU_LABEL,
        )
        page.add(page.table(wall))
    for r in cpu_runs:
        page.add(page.table(_measurement_table(r, f"CPU-timed measurements, run {r.info.id}", CPU_LABEL)))


def _other_documents(page: _Page, data: ReportData) -> None:
    for doc in data.documents:
        if doc.schema in (INSPECT, TRAFFIC, LCE_MEMORY, *counters.SCHEMAS):
            continue
        page.add(f'<h2>{_esc(doc.schema or doc.source)}</h2><p class="note">from {_esc(doc.source)}</p>')
        if timeline.is_timeline(doc.body):  # a trace analysis (torch.profiler, nsys, rocprofv3): its timeline
            page.add(page.figure(timeline.timeline_figure(doc.body, doc.source)))
            page.add(page.table(timeline.kernels_table(doc.body), collapsed=False))
        if doc.scalars:
            page.add(
                page.table(
                    Table("summary", ["field", "value"], [[k, v] for k, v in doc.scalars.items()]),
                    collapsed=doc.schema == TRACE_FIGURES,
                )
            )
        for fig in doc.figures:
            page.add(page.chart(fig["data"], fig["layout"], str(fig.get("title", "")), source=doc.source))
        _doc_tables(page, doc)
        if not doc.tables and not doc.figures:
            page.add('<p class="note">This document holds no list of records to tabulate.</p>')


def _headline(data: ReportData) -> str:
    """The verdict first: what passed, what is slow, what changed since the previous run."""
    h = headline(data)
    rows = "".join(f"<dt>{label}</dt><dd>{_esc(text)}</dd>"
                   for label, text in (("passed", h.passed), ("slow", h.slow), ("changed", h.changed)))
    return f'<section id="headline" class="headline{" bad" if h.bad else ""}"><dl>{rows}</dl></section>'


def render_html(data: ReportData, *, plotly_js: str | None = None) -> str:
    """The dashboard as one HTML string (plotly.js inlined; `plotly_js` overrides it in tests)."""
    if plotly_js is None:
        from plotly.offline import get_plotlyjs  # lazy: optional plotly

        plotly_js = get_plotlyjs()
    page = _Page()
    latest = data.latest.info if data.latest else None
    page.add(f"<h1>{_esc(data.title)}</h1>")
    left_out = sum(s != "complete" for s in data.statuses.values())
    page.add(
        f'<p class="note">{len(data.runs)} stored run(s)'
        + (f" ({left_out} incomplete or failed, left out of every chart)" if left_out else "")
        + "; latest: "
        + (
            f"run {latest.id}, {_esc(latest.created_utc)}, git {_esc((latest.git_sha or '?')[:12])}"
            f"{' (dirty)' if latest.git_dirty else ''}, {_esc(latest.device_name)} ({_esc(latest.backend)})"
            if latest
            else "none"
        )
        + "</p>"
    )
    page.add(
        '<p class="note">Modeled points come from datasheet figures and the registry\'s FLOP and byte '
        "formulas: no device was run to get them. Measured points and speedups come only from stored GPU "
        f"runs. {CPU_LABEL}: CPU wall times appear only in their own labelled tables.</p>"
    )
    for p in data.problems:
        page.add(f'<p class="warn">{_esc(p)}</p>')
    page.add(_headline(data))

    _static_sections(page, data)

    page.add("<h2>Roofline</h2>")
    traffic = _first(data.documents, TRAFFIC)
    if data.modeled:
        page.add(page.figure(charts.roofline(data.modeled, data.measured, traffic, data.target_device)))
        page.add(page.table(_modeled_table(data)))
    counters.section(page, data.documents)

    lce = [d for d in data.documents if d.schema == LCE_MEMORY]
    page.add("<h2>Fused linear + cross-entropy memory</h2>")
    if lce:
        page.add(
            '<p class="note">Peak memory of one LM-head + loss forward and backward, counted by the PyTorch '
            "allocator hooks on CPU (bytes, not time: these carry over to a GPU). Files: "
            + ", ".join(f"<code>{_esc(d.source)}</code>" for d in lce)
            + ".</p>"
        )
        page.add(page.figure(charts.lce_memory(lce)))
        for d in lce:
            page.add(
                page.table(Table(f"summary of {d.source}", ["field", "value"], [[k, v] for k, v in d.scalars.items()]))
            )
    else:
        where = f"in {data.results_dir}" if data.results_dir else "(no results directory given)"
        page.add(f'<p class="note">No <code>lce_memory_*.json</code> result found {_esc(where)}.</p>')

    page.add("<h2>Correctness</h2>")
    checked = data.correctness_run
    if checked:
        n_pass = sum(r.passed for r in checked.correctness)
        page.add(
            f"<p>{n_pass}/{len(checked.correctness)} cases pass (run {checked.info.id}, "
            f"{_esc(checked.info.backend)}).</p>"
        )
        page.add(page.figure(charts.correctness(checked)))
        page.add(page.table(_correctness_table(data)))
    else:
        page.add('<p class="note">No correctness results stored yet (run <code>wavefront bench</code>).</p>')

    _gpu_sections(page, data)
    _cpu_section(page, data)

    if data.training_runs:
        page.add("<h2>Training KPIs (wavefront train)</h2>")
        page.add(page.figure(charts.training_loss(data.training_steps, data.training_runs[-1]["run_id"])))
        page.add(page.table(_training_table(data), collapsed=False))

    _other_documents(page, data)

    page.add("<h2>Stored runs</h2>")
    page.add(page.table(_runs_table(data), collapsed=len(data.runs) > 10))
    body = "\n".join(page.parts)
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{_esc(data.title)}</title><style>{_CSS}</style><script>{_BOOT}</script>"
        f'<script>{plotly_js}</script></head><body data-charts-expected="{page.n_charts}">{body}'
        f"<script>{_DRAW}</script></body></html>\n"
    )
