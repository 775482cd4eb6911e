"""Plotly figure specs for the dashboard: plain dicts ``{"title", "data", "layout"}`` (no plotly import),
ready for ``Plotly.newPlot(div, data, layout)`` or the report's chart helper.

- :func:`step_breakdown_figure`: a stacked bar per (rank, step) of the six breakdown categories; the bar
  height is the step time.
- :func:`roofline_figure`: achieved TFLOP/s against arithmetic intensity (log-log) for the ops placed
  on the roofline, with the device's memory and compute roofs.
- :func:`step_skew_figure`: step time per rank, one line per rank (multi-rank traces).
"""

from __future__ import annotations

from typing import Any

from wavefront.workbench.hardware import GPUS
from wavefront.workbench.trace.analysis import TraceAnalysis
from wavefront.workbench.trace.breakdown import CATEGORIES
from wavefront.workbench.trace.flops import DTYPE_PEAK

FIGURES_SCHEMA = "wavefront.trace.figures/1"
COLORS = {"compute": "#2b8a3e", "comm_overlapped": "#74c0fc", "comm_exposed": "#e03131", "memory": "#f08c00",
          "idle_host_bound": "#862e9c", "idle_other": "#adb5bd"}
LABELS = {"compute": "compute", "comm_overlapped": "comm hidden by compute", "comm_exposed": "exposed comm",
          "memory": "memcpy/memset", "idle_host_bound": "idle: host-bound", "idle_other": "idle: other"}


def _step_label(rank: int | None, step: int | str | None) -> str:
    return f"r{rank if rank is not None else '?'} s{step if step is not None else 'all'}"


def step_breakdown_figure(analysis: TraceAnalysis) -> dict[str, Any]:
    x = [_step_label(r.rank, s.step) for r in analysis.ranks for s in r.steps]
    domains = {r.domain for r in analysis.ranks}
    data = [{"type": "bar", "name": LABELS[c], "x": x, "marker": {"color": COLORS[c]},
             "y": [s.us(c) / 1e3 for r in analysis.ranks for s in r.steps]} for c in CATEGORIES]
    title = "Step time breakdown" + (" (CPU-only trace: CPU operators)" if domains == {"cpu"} else "")
    return {"title": title, "data": data,
            "layout": {"barmode": "stack", "xaxis": {"title": "rank / step"}, "yaxis": {"title": "ms"},
                       "legend": {"orientation": "h"}}}


def roofline_figure(analysis: TraceAnalysis, rank_index: int = 0) -> dict[str, Any] | None:
    """None when the rank has no placed op or no known device."""
    r = analysis.ranks[rank_index]
    points = [p for p in r.kernels.roofline if p.attainable_tflops is not None]
    if not points or r.kernels.gpu not in GPUS:
        return None
    gpu = GPUS[r.kernels.gpu]
    peaks = {p.dtype for p in points}
    lo = min(p.intensity for p in points) / 4
    hi = max(max(p.intensity for p in points) * 4, gpu.ridge_bf16 * 4)
    data = []
    for peak_name in sorted(peaks):
        peak = gpu.peak_tflops(DTYPE_PEAK[peak_name])
        ridge = peak / gpu.hbm_tbps
        data.append({"type": "scatter", "mode": "lines", "name": f"roof {DTYPE_PEAK[peak_name]}",
                     "x": [lo, ridge, hi], "y": [lo * gpu.hbm_tbps, peak, peak], "line": {"dash": "dot"}})
    data.append({"type": "scatter", "mode": "markers", "name": "ops",
                 "x": [p.intensity for p in points], "y": [p.achieved_tflops for p in points],
                 "text": [f"{p.op} {p.shapes} ({p.count}x, {p.median_us:.1f} us, {p.pct_of_roof:.1f}% of roof)"
                          for p in points],
                 "marker": {"size": 9}})
    title = f"Kernel roofline on {gpu.name}" + (f" (rank {r.rank})" if r.rank is not None else "")
    return {"title": title, "data": data,
            "layout": {"xaxis": {"type": "log", "title": "FLOP / byte"},
                       "yaxis": {"type": "log", "title": "TFLOP/s"}}}


def step_skew_figure(analysis: TraceAnalysis) -> dict[str, Any] | None:
    mr = analysis.multirank
    if mr is None or not mr.steps:
        return None
    x = [str(s.step) for s in mr.steps]
    data = [{"type": "scatter", "mode": "lines+markers", "name": f"rank {rank}", "x": x,
             "y": [s.dur_us_by_rank[rank] / 1e3 for s in mr.steps]} for rank in mr.ranks]
    return {"title": "Step time per rank", "data": data,
            "layout": {"xaxis": {"title": "step"}, "yaxis": {"title": "ms"}}}


def figures(analysis: TraceAnalysis) -> list[dict[str, Any]]:
    """Every figure that applies to this analysis."""
    out = [step_breakdown_figure(analysis)]
    for i in range(len(analysis.ranks)):
        fig = roofline_figure(analysis, i)
        if fig:
            out.append(fig)
    skew = step_skew_figure(analysis)
    if skew:
        out.append(skew)
    return out
