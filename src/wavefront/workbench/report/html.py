"""Render :class:`~wavefront.workbench.report.data.ReportData` as one self-contained HTML file.

plotly.js is inlined once (offline: no CDN, no network); every chart is a ``div.wf-chart`` with its
figure as JSON beside it, drawn by ``Plotly.newPlot``. The page records JavaScript errors and which
charts rendered in ``window.__wf`` (and ``body[data-charts-rendered]``), which the browser test reads.
"""

from __future__ import annotations

import html
import json
import math
from collections import defaultdict
from typing import Any

from wavefront.workbench.bench.records import CPU_LABEL
from wavefront.workbench.hardware import GPUS
from wavefront.workbench.report.data import ReportData
from wavefront.workbench.report.tables import Table

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0 auto;max-width:1280px;padding:0 24px 48px;
color:#1d2330}
h1{margin:24px 0 4px} h2{margin-top:40px;border-bottom:1px solid #dde1e8;padding-bottom:4px}
.note{color:#5b6475;font-size:0.92em} .warn{background:#fff6e0;border-left:4px solid #e0a000;padding:6px 10px}
table{border-collapse:collapse;font-size:0.85em;margin:8px 0} th,td{border:1px solid #dde1e8;padding:3px 6px;
text-align:left;vertical-align:top} th{background:#f3f5f9;position:sticky;top:0} td.num{text-align:right;
font-variant-numeric:tabular-nums} .pass{color:#137333} .fail{color:#c5221f;font-weight:600}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(600px,1fr));gap:16px}
.wf-chart{min-height:420px;border:1px solid #eef0f4} details{margin:8px 0} summary{cursor:pointer}
"""

_BOOT = """window.__wf={errors:[],rendered:[],expected:0};
window.addEventListener('error',function(e){window.__wf.errors.push(String(e.message||e));});
window.addEventListener('unhandledrejection',function(e){window.__wf.errors.push('unhandled: '+String(e.reason));});"""

_DRAW = """(function(){var charts=document.querySelectorAll('.wf-chart');window.__wf.expected=charts.length;
var jobs=Array.prototype.map.call(charts,function(div){
 var spec=JSON.parse(document.getElementById(div.id+'-spec').textContent);
 return Plotly.newPlot(div,spec.data,spec.layout,{responsive:true,displaylogo:false}).then(function(){
  if(div.querySelector('.main-svg')){window.__wf.rendered.push(div.id);}});});
Promise.all(jobs).then(function(){document.body.setAttribute('data-charts-rendered',String(window.__wf.rendered.length));},
 function(e){window.__wf.errors.push('plot: '+String(e));});})();"""

_PALETTE = {"wavefront": "#1a73e8", "eager": "#e8710a", "torch_compile": "#7b1fa2", "liger": "#188038"}


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

    def chart(self, data: list[dict], layout: dict, title: str) -> str:
        cid = f"chart-{self.n_charts}"
        self.n_charts += 1
        layout = {"title": {"text": title}, "margin": {"l": 70, "r": 20, "t": 50, "b": 70}, "height": 420,
                  "template": None, **layout}
        spec = json.dumps({"data": data, "layout": layout}, allow_nan=False, default=str).replace("</", "<\\/")
        return (f'<div class="wf-chart" id="{cid}" data-title="{_esc(title)}"></div>'
                f'<script type="application/json" id="{cid}-spec">{spec}</script>')

    def table(self, t: Table, *, collapsed: bool = False) -> str:
        head = "".join(f"<th>{_esc(c)}</th>" for c in t.columns)
        body = "".join("<tr>" + "".join(
            f'<td class="num">{_fmt(v)}</td>' if isinstance(v, int | float) and not isinstance(v, bool)
            else f"<td>{_fmt(v)}</td>" for v in row) + "</tr>" for row in t.rows)
        more = f'<p class="note">{t.truncated} more rows not shown.</p>' if t.truncated else ""
        inner = f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{more}"
        note = f'<p class="note">{_esc(t.note)}</p>' if t.note else ""
        if collapsed:
            return f"<details><summary>{_esc(t.title)} ({len(t.rows)} rows)</summary>{note}{inner}</details>"
        return f"<h3>{_esc(t.title)}</h3>{note}{inner}"


def _finite(x) -> float | None:
    return x if isinstance(x, int | float) and math.isfinite(x) else None


def _roofline_chart(page: _Page, data: ReportData, key: str) -> str:
    gpu = GPUS[key]
    points = data.modeled.get(key, [])
    intensities = [p.intensity for p in points if p.intensity > 0 and math.isfinite(p.intensity)]
    lo = min([0.05, *intensities]) / 2
    hi = max([gpu.ridge_bf16 * 8, *intensities]) * 2
    xs = [lo * (hi / lo) ** (i / 60) for i in range(61)]
    traces: list[dict] = [{"type": "scatter", "mode": "lines", "name": "roof (bf16 dense, HBM)",
                           "x": xs, "y": [min(gpu.bf16_tflops, x * gpu.hbm_tbps) for x in xs],
                           "line": {"color": "#444", "width": 2}}]
    by_mode: dict[str, list] = defaultdict(list)
    for p in points:
        by_mode[p.mode].append(p)
    symbols = {"fwd": "circle", "bwd": "square", "fwd_bwd": "diamond"}
    for mode, pts in by_mode.items():
        traces.append({"type": "scatter", "mode": "markers", "name": f"modeled {mode}",
                       "x": [p.intensity for p in pts], "y": [p.attainable_tflops for p in pts],
                       "text": [f"{p.op}/{p.case}/{p.mode}: attainable {p.attainable_us:.1f} us ({p.bound}-bound, "
                                f"{p.min_bytes / 1e6:.1f} MB)" for p in pts],
                       "hoverinfo": "text", "marker": {"symbol": symbols.get(mode, "circle"), "size": 8,
                                                       "color": "rgba(120,120,120,0.55)"}})
    by_prov: dict[str, list] = defaultdict(list)
    for m in data.measured.get(key, []):
        by_prov[m.provider].append(m)
    for prov, pts in by_prov.items():
        traces.append({"type": "scatter", "mode": "markers", "name": f"measured {prov}",
                       "x": [m.intensity for m in pts], "y": [m.tflops for m in pts],
                       "text": [f"{m.op}/{m.case}/{m.mode} ({prov}, run {m.run_id}): {m.median_us:.1f} us, "
                                f"{(m.gbps or 0):.0f} GB/s" for m in pts], "hoverinfo": "text",
                       "marker": {"size": 9, "color": _PALETTE.get(prov, "#000")}})
    layout = {"xaxis": {"type": "log", "title": {"text": "arithmetic intensity (FLOP/byte)"}},
              "yaxis": {"type": "log", "title": {"text": "TFLOP/s"}}, "legend": {"orientation": "h", "y": -0.25},
              "height": 460}
    kind = "modeled + measured" if by_prov else "modeled only"
    return page.chart(traces, layout, f"{gpu.key.upper()} roofline ({kind})")


def _correctness_chart(page: _Page, data: ReportData) -> str:
    rows = data.correctness_run.correctness if data.correctness_run else []
    traces = []
    for mode, color in (("fwd", "#1a73e8"), ("bwd", "#e8710a")):
        xs, ys, texts = [], [], []
        for r in rows:
            err, bound = getattr(r, f"{mode}_err_ours"), getattr(r, f"{mode}_bound")
            if err is None or not bound:
                continue
            xs.append(f"{r.op}/{r.case}/{r.dtype}")
            ys.append(max(err / bound, 1e-6))
            texts.append(f"{mode}: error {err:.2e}, bound {bound:.2e}")
        traces.append({"type": "scatter", "mode": "markers", "name": mode, "x": xs, "y": ys, "text": texts,
                       "marker": {"color": color, "size": 7}})
    layout = {"yaxis": {"type": "log", "title": {"text": "our error / allowed bound (<= 1 passes)"}},
              "xaxis": {"showticklabels": False, "title": {"text": "op / case / dtype (hover for names)"}},
              "shapes": [{"type": "line", "xref": "paper", "x0": 0, "x1": 1, "y0": 1, "y1": 1,
                          "line": {"dash": "dash", "color": "#c5221f"}}]}
    return page.chart(traces, layout, f"correctness vs the float64 reference (run {data.correctness_run.info.id})")


def _speedup_chart(page: _Page, data: ReportData) -> str:
    traces = []
    for base in sorted({s.baseline for s in data.speedups}):
        pts = [s for s in data.speedups if s.baseline == base]
        err_plus = [(s.ci_high - s.speedup) if s.ci_high else 0 for s in pts]
        err_minus = [(s.speedup - s.ci_low) if s.ci_low else 0 for s in pts]
        traces.append({"type": "bar", "name": f"vs {base}", "x": [f"{s.op}/{s.case}/{s.mode}" for s in pts],
                       "y": [s.speedup for s in pts], "marker": {"color": _PALETTE.get(base, "#777")},
                       "error_y": {"type": "data", "symmetric": False, "array": err_plus, "arrayminus": err_minus},
                       "text": [s.verdict for s in pts]})
    unity = {"type": "line", "xref": "paper", "x0": 0, "x1": 1, "y0": 1, "y1": 1,
             "line": {"dash": "dash", "color": "#444"}}
    layout = {"barmode": "group", "yaxis": {"title": {"text": "speedup of wavefront (x, 95% CI)"}},
              "xaxis": {"tickangle": -40, "automargin": True}, "height": 520, "shapes": [unity]}
    run = data.latest_gpu.info if data.latest_gpu else None
    return page.chart(traces, layout, f"wavefront speedup per baseline (run {run.id}, {run.device_name})" if run
                      else "wavefront speedup per baseline")


def _history_chart(page: _Page, data: ReportData) -> str:
    series: dict[str, list] = defaultdict(list)
    for h in data.history:
        series[f"{h.series} @ {h.device}"].append(h)
    traces = [{"type": "scatter", "mode": "lines+markers", "name": name, "x": [p.created_utc for p in pts],
               "y": [p.median_us for p in pts], "text": [f"run {p.run_id} {(p.git_sha or '')[:10]}" for p in pts]}
              for name, pts in series.items()]
    layout = {"yaxis": {"type": "log", "title": {"text": "wavefront median (us)"}},
              "xaxis": {"title": {"text": "run date (UTC)"}}, "height": 480, "showlegend": len(traces) <= 20}
    return page.chart(traces, layout, "history across stored GPU runs")


_TRAIN_COLUMNS = ("run_id", "variant", "status", "started_at", "device_name", "backend", "world_size", "parallel",
                  "model", "tokens_per_s", "tokens_per_s_per_device", "mfu", "hfu", "peak_source", "peak_mem_bytes",
                  "step_s", "cost_per_step", "cost_per_mtok", "energy_per_step_j", "energy_kind", "final_loss")


def _training_table(data: ReportData) -> Table:
    rows = [[r.get(c) for c in _TRAIN_COLUMNS] for r in data.training_runs]
    cpu = any(str(r.get("backend", "")).startswith("cpu") for r in data.training_runs)
    return Table("training runs", list(_TRAIN_COLUMNS), rows, CPU_LABEL if cpu else "")


def _training_chart(page: _Page, data: ReportData) -> str:
    traces = [{"type": "scatter", "mode": "lines+markers", "name": variant, "x": [s["step"] for s in steps],
               "y": [s["loss"] for s in steps]} for variant, steps in data.training_steps.items()]
    run_id = data.training_runs[-1]["run_id"]
    layout = {"xaxis": {"title": "step"}, "yaxis": {"title": "loss"}}
    return page.chart(traces, layout, f"training loss per step, run {run_id} (baseline vs wavefront-patched)")


def _runs_table(data: ReportData) -> Table:
    cols = ["id", "created_utc", "label", "git_sha", "git_dirty", "device_name", "arch", "backend", "timing",
            "driver", "torch", "triton", "copy_gbps"]
    rows = [[getattr(r, c) if c != "git_sha" else (r.git_sha or "")[:12] for c in cols] for r in data.runs]
    return Table("stored runs", cols, rows)


def _correctness_table(data: ReportData) -> Table:
    cols = ["op", "case", "dtype", "result", "fwd_err_ours", "fwd_err_eager", "fwd_bound", "bwd_err_ours",
            "bwd_err_eager", "bwd_bound", "error"]
    rows = [[r.op, r.case, r.dtype, "pass" if r.passed else "FAIL", r.fwd_err_ours, r.fwd_err_eager, r.fwd_bound,
             r.bwd_err_ours, r.bwd_err_eager, r.bwd_bound, r.error or ""] for r in data.correctness_run.correctness]
    return Table(f"correctness, run {data.correctness_run.info.id}", cols, rows)


def _measurement_table(run, title: str, note: str = "") -> Table:
    cols = ["op", "case", "mode", "dtype", "provider", "status", "median_us", "p10_us", "p90_us", "n_reps", "method",
            "flush", "gbps", "tflops", "pct_peak_bw", "pct_copy_bw", "pct_peak_flops", "peak_mem_bytes",
            "max_diff_vs_eager", "reason"]
    rows = [[m.op, m.case, m.mode, m.dtype, m.provider, m.status, m.median_us, m.p10_us, m.p90_us, len(m.samples_us),
             m.method, m.flush, m.gbps, m.tflops, m.pct_peak_bw, m.pct_copy_bw, m.pct_peak_flops, m.peak_mem_bytes,
             m.max_diff_vs_eager, m.reason] for m in run.measurements]
    return Table(title, cols, rows, note)


def _modeled_table(data: ReportData, key: str) -> Table:
    pts = data.modeled.get(key, [])
    cols = ["op", "case", "mode", "dtype", "flops", "min_bytes", "intensity", "attainable_us", "bound"]
    return Table(f"modeled roofline on {GPUS[key].name} (datasheet figures; nothing was run)", cols,
                 [[getattr(p, c) for c in cols] for p in pts])


def render_html(data: ReportData, *, plotly_js: str | None = None) -> str:
    """The dashboard as one HTML string (plotly.js inlined; `plotly_js` overrides it in tests)."""
    if plotly_js is None:
        from plotly.offline import get_plotlyjs

        plotly_js = get_plotlyjs()
    page = _Page()
    latest = data.latest.info if data.latest else None
    page.add(f"<h1>{_esc(data.title)}</h1>")
    page.add(f'<p class="note">{len(data.runs)} stored run(s); latest: '
             + (f"run {latest.id}, {_esc(latest.created_utc)}, git {_esc((latest.git_sha or '?')[:12])}"
                f"{' (dirty)' if latest.git_dirty else ''}, {_esc(latest.device_name)} ({_esc(latest.backend)})"
                if latest else "none") + "</p>")
    page.add('<p class="note">Modeled points come from datasheet figures and the registry\'s FLOP and byte '
             'formulas: no device was run to get them. Measured points and speedups come only from stored GPU '
             f'runs. {CPU_LABEL}: CPU wall times appear only in their own labelled table.</p>')
    for p in data.problems:
        page.add(f'<p class="warn">{_esc(p)}</p>')

    page.add("<h2>Correctness</h2>")
    checked = data.correctness_run
    if checked:
        n_pass = sum(r.passed for r in checked.correctness)
        page.add(f"<p>{n_pass}/{len(checked.correctness)} cases pass (run {checked.info.id}, "
                 f"{_esc(checked.info.backend)}).</p>")
        page.add(_correctness_chart(page, data))
        page.add(page.table(_correctness_table(data), collapsed=True))
    else:
        page.add('<p class="note">No correctness results stored yet (run <code>wavefront bench</code>).</p>')

    page.add("<h2>Roofline per device</h2><div class=\"grid\">")
    for key in data.modeled:
        page.add(_roofline_chart(page, data, key))
    page.add("</div>")
    for key in data.modeled:
        page.add(page.table(_modeled_table(data, key), collapsed=True))

    page.add("<h2>Speedups vs baselines</h2>")
    if data.speedups:
        page.add(_speedup_chart(page, data))
        page.add(page.table(_measurement_table(data.latest_gpu, f"measurements, run {data.latest_gpu.info.id}"),
                            collapsed=True))
    else:
        page.add('<p class="note">No GPU run is stored: speedups need real timings (run '
                 '<code>scripts/gpu_check.sh</code> or <code>wavefront bench</code> on a GPU).</p>')

    page.add("<h2>History</h2>")
    if data.history:
        page.add(_history_chart(page, data))
    else:
        page.add('<p class="note">No GPU runs stored yet: the history of timings starts with the first one.</p>')

    cpu_runs = [r for r in ([data.latest] if data.latest else []) if r.info.timing == "cpu-interpreter"
                and r.measurements]
    if cpu_runs or (checked and checked.info.backend.startswith("cpu")):
        page.add(f"<h2>CPU wall times ({_esc(CPU_LABEL)})</h2>")
        if checked and checked.info.backend.startswith("cpu"):
            wall = Table("correctness wall time per case", ["op", "case", "dtype", "wall_s"],
                         [[r.op, r.case, r.dtype, r.wall_s] for r in checked.correctness], CPU_LABEL)
            page.add(page.table(wall, collapsed=True))
        for r in cpu_runs:
            page.add(page.table(_measurement_table(r, f"CPU-timed measurements, run {r.info.id}", CPU_LABEL),
                                collapsed=True))

    if data.training_runs:
        page.add("<h2>Training KPIs (wavefront train)</h2>")
        page.add(_training_chart(page, data))
        page.add(page.table(_training_table(data)))

    for doc in data.documents:
        page.add(f"<h2>{_esc(doc.schema or doc.source)}</h2><p class=\"note\">from {_esc(doc.source)}</p>")
        if doc.scalars:
            page.add(page.table(Table("summary", ["field", "value"], [[k, v] for k, v in doc.scalars.items()])))
        for fig in doc.figures:
            page.add(page.chart(fig["data"], fig["layout"], str(fig.get("title", ""))))
        for t in doc.tables:
            page.add(page.table(t))
        if not doc.tables and not doc.figures:
            page.add('<p class="note">This document holds no list of records to tabulate.</p>')

    page.add("<h2>Stored runs</h2>")
    page.add(page.table(_runs_table(data)))
    body = "\n".join(page.parts)
    return ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{_esc(data.title)}</title><style>{_CSS}</style><script>{_BOOT}</script>"
            f"<script>{plotly_js}</script></head><body data-charts-expected=\"{page.n_charts}\">{body}"
            f"<script>{_DRAW}</script></body></html>\n")
