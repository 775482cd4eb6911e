"""The dashboard's counters view: ``wavefront counters --json`` documents (measured launches on the device
roofline, predicted vs measured bars) and ``wavefront counters A B --json`` documents (B/A per metric).

Figures are built from the documents alone (their device figures travel in them), so the view shows what
the verb computed; the section writer takes the page's ``add``/``figure``/``table`` so html.py keeps one
hook line.
"""

from __future__ import annotations

import html
import math
from collections import defaultdict
from typing import Any

from wavefront.workbench.report.charts import LOG, OP_COLORS, UNITLESS, Figure, View, _axis
from wavefront.workbench.report.tables import COUNTERS, COUNTERS_COMPARE, Document

SCHEMAS = (COUNTERS, COUNTERS_COMPARE)
_LEVELS = (("intensity_dram", "DRAM", "circle"), ("intensity_l2", "L2", "diamond-open"),
           ("intensity_l1", "L1", "square-open"))


def _finite(x) -> bool:
    return isinstance(x, int | float) and math.isfinite(x) and x > 0


def _label(k: dict) -> str:
    return f"{k['kernel']} [{k['n_blocks']} x {k['threads_per_block']}]"


def roofline(doc: dict) -> Figure:
    """Each measured launch at its FLOP per DRAM, L2 and L1 byte (one colour per kernel shape), under the
    device's HBM and compute roofs. L2/L1 points share the launch's FLOP/s: the hierarchical intensities."""
    kernels = [k for k in doc["kernels"] if _finite(k.get("achieved_tflops"))]
    xs = [k[f] for k in kernels for f, _, _ in _LEVELS if _finite(k.get(f))]
    bw, matrix, vector = doc["hbm_tbps"], doc["matrix_peak_tflops"], doc["vector_peak_tflops"]
    lo, hi = min([0.05, *xs]) / 2, max([matrix / bw * 8, *xs]) * 2
    grid = [lo * (hi / lo) ** (i / 80) for i in range(81)]
    traces: list[dict[str, Any]] = [
        {"type": "scatter", "mode": "lines", "name": f"roof: {matrix:g} TFLOP/s matrix, {bw:g} TB/s HBM",
         "x": grid, "y": [min(matrix, x * bw) for x in grid], "line": {"color": "#3c4043", "width": 2},
         "hoverinfo": "skip"},
        {"type": "scatter", "mode": "lines", "name": f"roof: {vector:g} TFLOP/s vector (FP32)", "x": grid,
         "y": [min(vector, x * bw) for x in grid], "line": {"color": "#9aa0a6", "width": 2, "dash": "dash"},
         "hoverinfo": "skip"},
    ]
    by_shape: dict[str, list[dict]] = defaultdict(list)
    for k in kernels:
        by_shape[_label(k)].append(k)
    for i, (label, ks) in enumerate(sorted(by_shape.items())):
        color = OP_COLORS[i % len(OP_COLORS)]
        for field, level, symbol in _LEVELS:
            pts = [k for k in ks if _finite(k.get(field))]
            if not pts:
                continue
            traces.append({
                "type": "scatter", "mode": "markers", "name": label if level == "DRAM" else f"{label} ({level})",
                "legendgroup": label, "showlegend": level == "DRAM", "x": [k[field] for k in pts],
                "y": [k["achieved_tflops"] for k in pts], "hoverinfo": "text",
                "text": [f"{label} launch {k['launch_id']}: {k['achieved_tflops']:.3g} TFLOP/s at "
                         f"{k[field]:.3g} FLOP/{level} byte, {k['duration_us']:.1f} us"
                         + (f", {k['pct_of_roof']:.0f}% of roof" if level == "DRAM" and k["pct_of_roof"] else "")
                         for k in pts],
                "marker": {"color": color, "size": 10, "symbol": symbol, "line": {"width": 2, "color": color}}})
    layout = {"xaxis": _axis("arithmetic intensity (FLOP/byte)", **LOG), "yaxis": _axis("achieved TFLOP/s", **LOG),
              "height": 520, "legend": {"title": {"text": "kernel [blocks x threads]"}}}
    note = ("Measured by the profiler (not modeled). Filled: FLOP per DRAM byte; open diamonds and squares: the "
            "same launch per L2 and per L1 byte (no L2/L1 roof is drawn: the device table has no sourced figure).")
    return Figure(f"measured counters on the {doc['device_name']} roofline ({doc['profile']})", traces, layout,
                  note=note)


_BARS = (  # (view label, predicted field, measured fields with their legend names, axis title, log axis)
    ("DRAM bytes vs traffic", "bytes", (("dram_bytes", "measured"),), "bytes", True),
    ("occupancy vs inspect", "occupancy", (("theoretical_occupancy", "theoretical (profiler)"),
                                           ("achieved_occupancy", "achieved")), "occupancy (fraction)", False),
    ("registers vs inspect", "regs", (("registers", "measured"),), "registers per thread", False),
)
_MEASURED_COLORS = ("#1a73e8", "#0b3d91")


def predicted_vs_measured(doc: dict) -> Figure | None:
    """Grouped bars per matched kernel shape (the first launch of each): predicted beside measured; a
    selector picks the quantity. None when no launch matched a prediction."""
    seen: dict[str, dict] = {}
    for k in doc["kernels"]:
        if k["predicted"]["inspect_match"] != "none" or k["predicted"]["traffic_match"] != "none":
            seen.setdefault(_label(k), k)
    if not seen:
        return None
    labels = list(seen)
    traces: list[dict[str, Any]] = []
    owner: list[int] = []  # the view of each trace
    for v, (_, pred, measured, _, _) in enumerate(_BARS):
        series = [("predicted", [seen[lb]["predicted"][pred] for lb in labels], "#9aa0a6")]
        series += [(name, [seen[lb].get(f) for lb in labels], _MEASURED_COLORS[i])
                   for i, (f, name) in enumerate(measured)]
        for name, ys, color in series:
            traces.append({"type": "bar", "name": name, "x": labels, "y": ys, "marker": {"color": color},
                           "visible": v == 0})
            owner.append(v)
    views = [View(title, {"visible": [o == v for o in owner]},
                  {"yaxis.title.text": axis, "yaxis.type": "log" if log else "linear",
                   "title.text": f"predicted vs measured: {title}"})
             for v, (title, _, _, axis, log) in enumerate(_BARS)]
    layout = {"barmode": "group", "xaxis": _axis("kernel [blocks x threads]"),
              "yaxis": _axis(_BARS[0][3], type="log", **UNITLESS), "height": 460}
    gaps = sum(bool(k["gaps"]) for k in doc["kernels"])
    note = (f"{gaps} launch(es) with a gap called out (DRAM bytes outside [1/2, 2]x the traffic prediction, "
            "occupancy below half the predicted, other registers, or a theoretical occupancy off the model). Traffic "
            "bytes are CPU-interpreter counts, "
            "scaled per block where the shapes differ.")
    return Figure(views[0].layout["title.text"], traces, layout, views, "quantity", note)


def compare_bars(doc: dict) -> Figure:
    """B/A per kernel shape and metric: the statistics' 95% interval where launches repeat, a bare ratio (a
    plain delta) where they do not."""
    traces = []
    for method, color, name in (("stats", "#1a73e8", "B/A, 95% CI (repeats)"), ("delta", "#e8710a",
                                                                                 "B/A, plain delta (no repeats)")):
        ds = [d for d in doc["deltas"] if d["method"] == method and _finite(d.get("ratio"))]
        if not ds:
            continue
        trace: dict[str, Any] = {
            "type": "scatter", "mode": "markers", "name": name, "x": [d["ratio"] for d in ds],
            "y": [f"{d['kernel']} [{d['n_blocks']} x {d['threads_per_block']}] {d['metric']}" for d in ds],
            "marker": {"color": color, "size": 9}, "hoverinfo": "text",
            "text": [f"{d['metric']}: {d['median_a']:.4g} -> {d['median_b']:.4g} ({d['verdict'] or 'delta only'})"
                     for d in ds]}
        if method == "stats":
            trace["error_x"] = {"type": "data", "symmetric": False,
                                "array": [d["ci_high"] - d["ratio"] for d in ds],
                                "arrayminus": [d["ratio"] - d["ci_low"] for d in ds]}
        traces.append(trace)
    layout = {"xaxis": _axis("median B / median A", **UNITLESS), "yaxis": _axis("kernel [blocks x threads] metric"),
              "height": max(360, 22 * len(doc["deltas"]) + 120), "margin": {"l": 360}}
    return Figure(f"counter A/B: {doc['b']} vs {doc['a']}", traces, layout)


def section(page, documents: list[Document]) -> None:
    """The counters section of the dashboard (nothing when no counters document was given)."""
    docs = [d for d in documents if d.schema in SCHEMAS]
    if not docs:
        return
    page.add("<h2>Hardware counters</h2>")
    for d in docs:
        what = f'{d.body.get("format") or "counter A/B"}. {" ".join(d.body.get("notes", []))}'
        page.add(f'<p class="note">from {html.escape(d.source)}: {html.escape(what)}</p>')
        if d.schema == COUNTERS:
            page.add(page.figure(roofline(d.body)))
            bars = predicted_vs_measured(d.body)
            if bars:
                page.add(page.figure(bars))
        else:
            page.add(page.figure(compare_bars(d.body)))
        for t in d.tables:
            page.add(page.table(t))
