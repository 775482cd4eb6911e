"""The dashboard's charts as plotly figure specs: data in, ``Figure`` out (no HTML here).

A chart may carry *views*: alternative restyles of the same figure chosen with a selector above it (the
roofline's device, the inspect heat map's metric). Each view is the argument pair of ``Plotly.update``;
the figure as built shows the first view. Unitless axes (ratios, fractions, counts) use powers of ten
rather than SI prefixes (``1e-6`` reads ``10^-6``, never ``1µ``).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wavefront.workbench.hardware import GPUS
from wavefront.workbench.report.tables import Document

# One colour per op, stable across devices and charts (Tableau 10 + two).
OP_COLORS = (
    "#4e79a7",
    "#f28e2b",
    "#e15759",
    "#76b7b2",
    "#59a14f",
    "#edc948",
    "#b07aa1",
    "#ff9da7",
    "#9c755f",
    "#bab0ac",
    "#17becf",
    "#7f7f7f",
)
PROVIDER_COLORS = {
    "wavefront": "#1a73e8",
    "eager": "#e8710a",
    "torch_compile": "#7b1fa2",
    "liger": "#188038",
    "minimum": "#9aa0a6",
}
MODE_SYMBOLS = {"fwd": "circle", "bwd": "square", "fwd_bwd": "diamond"}
UNITLESS = {"exponentformat": "power"}  # no SI prefixes on ratios and counts
LOG = {"type": "log", "dtick": 1, "exponentformat": "power"}  # a label per power of ten, none between
GOOD_HIGH = [[0.0, "#d73027"], [0.5, "#fee08b"], [1.0, "#1a9850"]]  # red (low) .. green (high)
GOOD_LOW = [[0.0, "#f7fbff"], [1.0, "#c0392b"]]  # white (none) .. red (many)
COUNT = [[0.0, "#f7fbff"], [1.0, "#08519c"]]  # white (none) .. blue (many)
MIB = float(1 << 20)
GIB = float(1 << 30)


@dataclass
class View:
    label: str
    data: dict[str, Any]  # Plotly.update's restyle argument
    layout: dict[str, Any] = field(default_factory=dict)


@dataclass
class Figure:
    title: str
    data: list[dict[str, Any]]
    layout: dict[str, Any]
    views: list[View] = field(default_factory=list)
    view_label: str = ""  # what the selector picks ("device", "metric")
    note: str = ""  # one line printed under the chart


def _axis(title: str, **kw) -> dict[str, Any]:
    return {"title": {"text": title}, "automargin": True, **kw}


def op_colors(ops) -> dict[str, str]:
    return {op: OP_COLORS[i % len(OP_COLORS)] for i, op in enumerate(sorted(set(ops)))}


# -- roofline ----------------------------------------------------------------------------------------------


def _traffic_points(traffic: Document | None) -> dict[tuple[str, str, str], tuple[float, float]]:
    """(op, case, mode) -> (counted bytes / minimum, eager bytes / minimum) from a traffic document."""
    out = {}
    for r in traffic.body.get("rows", []) if traffic else []:
        ratio = r.get("marginal_ratio") or r.get("ratio_min")
        eager = r.get("eager_bytes")
        if r.get("error") or not ratio or not r.get("min_bytes"):
            continue
        out[(r.get("op"), r.get("case"), r.get("mode"))] = (float(ratio), (eager or 0) / r["min_bytes"])
    return out


def _roof(gpu, points) -> dict[str, Any]:
    xs_all = [p.intensity for p in points if p.intensity > 0 and math.isfinite(p.intensity)]
    lo = min([0.05, *xs_all]) / 2
    hi = max([gpu.ridge_bf16 * 8, *xs_all]) * 2
    xs = [lo * (hi / lo) ** (i / 80) for i in range(81)]
    return {
        "type": "scatter",
        "mode": "lines",
        "name": f"roof: {gpu.bf16_tflops:g} TFLOP/s bf16, {gpu.hbm_tbps:g} TB/s",
        "x": xs,
        "y": [min(gpu.bf16_tflops, x * gpu.hbm_tbps) for x in xs],
        "line": {"color": "#3c4043", "width": 2},
        "hoverinfo": "skip",
    }


def _modeled_op(op: str, pts: list, color: str) -> dict[str, Any]:
    text = [
        f"{p.op} {p.case} {p.mode}: modeled {p.attainable_us:.1f} us, {p.bound}-bound, "
        f"{p.min_bytes / MIB:.1f} MiB minimum"
        for p in pts
    ]
    return {
        "type": "scatter",
        "mode": "markers",
        "name": op,
        "legendgroup": op,
        "x": [p.intensity for p in pts],
        "y": [p.attainable_tflops for p in pts],
        "text": text,
        "hoverinfo": "text",
        "marker": {
            "color": color,
            "size": 9,
            "symbol": [MODE_SYMBOLS.get(p.mode, "circle") for p in pts],
            "line": {"width": 1, "color": "#ffffff"},
        },
    }


def _counted_op(gpu, op: str, pts: list, color: str, counted: dict) -> list[dict[str, Any]]:
    """The op's cases again at the same intensity, timed with the counted bytes (wavefront, then eager)."""
    out = []
    for which, idx, symbol in (("wavefront, counted bytes", 0, "circle-open"), ("eager, counted bytes", 1, "x-thin")):
        pairs = [(p, counted[(p.op, p.case, p.mode)][idx]) for p in pts if (p.op, p.case, p.mode) in counted]
        pairs = [(p, r) for p, r in pairs if r > 0]
        if not pairs:
            continue
        seconds = [max(p.flops / (gpu.bf16_tflops * 1e12), p.min_bytes * r / (gpu.hbm_tbps * 1e12)) for p, r in pairs]
        out.append(
            {
                "type": "scatter",
                "mode": "markers",
                "name": f"{op} ({which})",
                "legendgroup": op,
                "showlegend": False,
                "x": [p.intensity for p, _ in pairs],
                "y": [p.flops / t / 1e12 for (p, _), t in zip(pairs, seconds, strict=True)],
                "text": [f"{p.op} {p.case} {p.mode}, {which}: {r:.2f}x the minimal bytes" for p, r in pairs],
                "hoverinfo": "text",
                "marker": {"color": color, "size": 8, "symbol": symbol, "line": {"width": 2, "color": color}},
            }
        )
    return out


def _measured(pts: list) -> list[dict[str, Any]]:
    by_prov: dict[str, list] = defaultdict(list)
    for m in pts:
        by_prov[m.provider].append(m)
    return [
        {
            "type": "scatter",
            "mode": "markers",
            "name": f"measured: {prov}",
            "x": [m.intensity for m in ms],
            "y": [m.tflops for m in ms],
            "hoverinfo": "text",
            "text": [f"{m.op} {m.case} {m.mode} ({prov}, run {m.run_id}): {m.median_us:.1f} us" for m in ms],
            "marker": {
                "size": 11,
                "symbol": "star",
                "color": PROVIDER_COLORS.get(prov, "#000"),
                "line": {"width": 1, "color": "#202124"},
            },
        }
        for prov, ms in sorted(by_prov.items())
    ]


def roofline(modeled: dict[str, list], measured: dict[str, list], traffic: Document | None = None,
             first: str | None = None) -> Figure:
    """One roofline for every device: a selector picks the device, `first` (the run's own target) shown
    first and selected when the page opens; points coloured by op, shaped by mode.

    Modeled points sit on the roof by construction (datasheet peaks and the registry's minimal bytes).
    With a traffic document, each case is drawn again at its algorithmic intensity with the bytes the
    kernels were counted moving (and those eager PyTorch moves): the distance below the roof is the
    traffic above the minimum. Measured points come only from stored GPU runs.
    """
    keys = sorted(modeled, key=lambda k: k != first)  # stable: the table's order after `first`
    colors = op_colors(p.op for k in keys for p in modeled[k])
    counted = _traffic_points(traffic)
    traces: list[dict[str, Any]] = []
    owner: list[str] = []  # device key of each trace
    for key in keys:
        gpu = GPUS[key]
        by_op: dict[str, list] = defaultdict(list)
        for p in modeled[key]:
            by_op[p.op].append(p)
        device_traces = [_roof(gpu, modeled[key])]
        for op, pts in sorted(by_op.items()):
            device_traces += [_modeled_op(op, pts, colors[op]), *_counted_op(gpu, op, pts, colors[op], counted)]
        device_traces += _measured(measured.get(key, []))
        traces += device_traces
        owner += [key] * len(device_traces)
    views = []
    for key in keys:
        kind = "modeled + measured" if measured.get(key) else "modeled"
        views.append(
            View(
                GPUS[key].name,
                {"visible": [o == key for o in owner]},
                {"title.text": f"roofline on {GPUS[key].name} ({kind}, bf16)"},
            )
        )
    for t, o in zip(traces, owner, strict=True):
        t["visible"] = o == keys[0]
    layout = {
        "xaxis": _axis("arithmetic intensity (FLOP/byte, minimal bytes)", **LOG),
        "yaxis": _axis("TFLOP/s", **LOG),
        "height": 560,
        "legend": {"title": {"text": "op (shape: fwd ● bwd ■ fwd_bwd ◆)"}},
    }
    note = (
        "Filled: modeled with the minimal bytes (on the roof by construction). Open circles: wavefront with "
        "the bytes `wavefront traffic` counted; crosses: eager PyTorch with its counted bytes."
        if counted
        else "Modeled with the minimal bytes, so every point sits on the roof; a traffic document adds the counted "
        "bytes, GPU runs add measured points."
    )
    title = views[0].layout["title.text"] if views else "roofline"
    return Figure(title, traces, layout, views, "device", note)


# -- inspect heat map --------------------------------------------------------------------------------------

_METRICS = (  # (label, value of a row, colour scale, fixed range or None)
    ("occupancy", lambda r: r.get("occupancy"), GOOD_HIGH, (0.0, 1.0)),
    ("registers per thread", lambda r: r.get("regs"), GOOD_LOW, None),
    ("widest global load (bits)", lambda r: r.get("widest_load_bits"), GOOD_HIGH, (0, 128)),
    ("spill bytes per thread", lambda r: r.get("spill_bytes"), GOOD_LOW, None),
    ("matrix instructions", lambda r: sum((r.get("matrix_ops") or {}).values()) if r.get("ok") else None, COUNT, None),
)


def _metric_text(label: str, value) -> str:
    if value is None:
        return ""
    if label == "occupancy":
        return f"{value:.0%}"
    return f"{value:g}" if isinstance(value, float) else str(value)


def inspect_heatmap(doc: Document) -> Figure:
    """Kernel (op, mode, case, kernel) x target, one metric at a time (a selector switches metrics)."""
    rows = doc.body.get("rows", [])
    targets = list(doc.body.get("targets") or dict.fromkeys(r.get("target") for r in rows))
    kernels = list(
        dict.fromkeys(f"{r.get('op')} {r.get('mode')} {r.get('case')} \u00b7 {r.get('kernel')}" for r in rows)
    )
    cell = {
        (f"{r.get('op')} {r.get('mode')} {r.get('case')} \u00b7 {r.get('kernel')}", r.get("target")): r for r in rows
    }
    views = []
    for label, value, scale, fixed in _METRICS:
        z, text = [], []
        for k in kernels:
            zr, tr = [], []
            for t in targets:
                r = cell.get((k, t))
                v = value(r) if r is not None and r.get("ok", True) else None
                zr.append(v)
                tr.append("failed" if r is not None and not r.get("ok", True) else _metric_text(label, v))
            z.append(zr)
            text.append(tr)
        values = [v for zr in z for v in zr if v is not None]
        lo, hi = fixed or (min(values, default=0), max(values, default=1))
        views.append(
            View(
                label,
                {
                    "z": [z],
                    "text": [text],
                    "colorscale": [scale],
                    "zmin": [lo],
                    "zmax": [hi if hi > lo else lo + 1],
                    "colorbar.title.text": [label],
                },
                {"title.text": f"inspect: {label} per kernel and target"},
            )
        )
    first = views[0].data
    height = max(360, 26 * len(kernels) + 150)
    trace = {
        "type": "heatmap",
        "x": targets,
        "y": kernels,
        "z": first["z"][0],
        "text": first["text"][0],
        "texttemplate": "%{text}",
        "colorscale": first["colorscale"][0],
        "zmin": first["zmin"][0],
        "zmax": first["zmax"][0],
        "xgap": 2,
        "ygap": 2,
        "colorbar": {"title": {"text": _METRICS[0][0]}},
        "hovertemplate": "%{y}<br>%{x}: %{text}<extra></extra>",
    }
    layout = {
        "xaxis": _axis("compile target", side="top"),
        "yaxis": _axis("op, mode, bench case \u00b7 kernel", autorange="reversed", tickfont={"size": 11}),
        "height": height,
        "margin": {"l": 320, "r": 20, "t": 120, "b": 30},
        **_top_title(height),
    }
    return Figure(views[0].layout["title.text"], [trace], layout, views, "metric")


def _top_title(height: int) -> dict[str, Any]:
    """The title pinned to the top edge, clear of an axis drawn at the top."""
    return {"title": {"y": 1 - 12 / height, "yanchor": "top"}}


# -- traffic -----------------------------------------------------------------------------------------------


def traffic_bars(doc: Document) -> Figure:
    """Bytes moved per op, mode and case: wavefront's kernels, the registry's minimum, eager PyTorch."""
    rows = [r for r in doc.body.get("rows", []) if not r.get("error") and r.get("min_bytes")]
    labels = [f"{r.get('op')} {r.get('mode')} {r.get('case')}" for r in rows]
    series = (("wavefront", "bytes_moved"), ("minimum", "min_bytes"), ("eager", "eager_bytes"))
    traces = []
    for name, key in series:
        xs = [(r.get(key) or 0) / MIB for r in rows]
        traces.append(
            {
                "type": "bar",
                "orientation": "h",
                "name": name,
                "y": labels,
                "x": xs,
                "marker": {"color": PROVIDER_COLORS[name]},
                "text": [f"{(r.get(key) or 0) / r['min_bytes']:.2f}x minimum" for r in rows],
                "textposition": "none",
                "hovertemplate": "%{y}<br>" + name + ": %{x:.3f} MiB (%{text})<extra></extra>",
            }
        )
    height = max(360, 34 * len(rows) + 170)
    layout = {
        "barmode": "group",
        "bargap": 0.25,
        "height": height,
        "xaxis": _axis("bytes moved (MiB, at the traffic case's shape)", side="top", **LOG),
        "yaxis": _axis("op, mode, case", autorange="reversed", tickfont={"size": 11}),
        "margin": {"l": 260, "r": 20, "t": 130, "b": 30},
        **_top_title(height),
        "legend": {"orientation": "h", "y": 1 - 40 / height, "yref": "container", "yanchor": "top", "x": 0},
    }
    return Figure("traffic: bytes moved by wavefront, the minimum, and eager PyTorch", traces, layout)


# -- fused-loss memory -------------------------------------------------------------------------------------

_LCE_VARIANTS = (
    ("eager_meta", "eager PyTorch (full logits)", "#e8710a"),
    ("wavefront", "wavefront fused loss", "#1a73e8"),
    ("wavefront_accumulate", "wavefront, dW accumulated", "#8ab4f8"),
)


def lce_memory(docs: list[Document]) -> Figure:
    """Peak memory of the LM-head + cross-entropy step, in units of one full logits tensor."""
    configs = []
    for d in docs:
        b = d.body
        configs.append(
            f"{b.get('tokens')} tok x {b.get('vocab')} vocab, hidden {b.get('hidden')}, "
            f"{b.get('dtype')}<br>{Path(d.source).name}"
        )
    traces = []
    for key, name, color in _LCE_VARIANTS:
        ys, texts = [], []
        for d in docs:
            b = d.body
            v = b.get(key)
            peak = v.get("peak_bytes") if isinstance(v, dict) else None
            ys.append(peak / b["full_logits_bytes"] if peak else None)
            texts.append(f"{peak / b['full_logits_bytes']:.2f}x ({peak / GIB:.2f} GiB)" if peak else "")
        if any(y is not None for y in ys):
            traces.append(
                {
                    "type": "bar",
                    "name": name,
                    "x": configs,
                    "y": ys,
                    "text": texts,
                    "marker": {"color": color},
                    "textposition": "outside",
                    "cliponaxis": False,
                    "hovertemplate": "%{x}<br>" + name + ": %{text} peak<extra></extra>",
                }
            )
    one = {
        "type": "line",
        "xref": "paper",
        "x0": 0,
        "x1": 1,
        "y0": 1,
        "y1": 1,
        "line": {"dash": "dash", "color": "#3c4043"},
    }
    layout = {
        "barmode": "group",
        "height": 460,
        "shapes": [one],
        "yaxis": _axis("peak memory / one full logits tensor", **UNITLESS),
        "xaxis": _axis("configuration (tokens x vocab, hidden, dtype)"),
        "annotations": [
            {
                "xref": "paper",
                "x": 1,
                "y": 1,
                "yref": "y",
                "text": "one full logits tensor",
                "showarrow": False,
                "xanchor": "right",
                "yanchor": "bottom",
            }
        ],
    }
    return Figure("fused linear + cross-entropy: peak memory (committed CPU results)", traces, layout)


# -- correctness, speedups, history, training --------------------------------------------------------------


def correctness(run) -> Figure:
    """Our error over the allowed bound per case, grouped by op on the x axis."""
    traces = []
    for mode, color in (("fwd", "#1a73e8"), ("bwd", "#e8710a")):
        xs, ys, texts = [], [], []
        for r in run.correctness:
            err, bound = getattr(r, f"{mode}_err_ours"), getattr(r, f"{mode}_bound")
            if err is None or not bound:
                continue
            xs.append(r.op)
            ys.append(max(err / bound, 1e-6))
            texts.append(f"{r.op} {r.case} {r.dtype} {mode}: error {err:.2e}, bound {bound:.2e}")
        traces.append(
            {
                "type": "box",
                "name": mode,
                "x": xs,
                "y": ys,
                "text": texts,
                "boxpoints": "all",
                "jitter": 0.5,
                "pointpos": 0,
                "line": {"width": 1, "color": color},
                "fillcolor": color + "22",
                "marker": {"color": color, "size": 6, "opacity": 0.8},
                "hoveron": "points",
                "hovertemplate": "%{text}<extra></extra>",
            }
        )
    layout = {
        "boxmode": "group",
        "yaxis": _axis("our error / allowed bound (\u2264 1 passes)", **LOG),
        "xaxis": _axis("op (each point: one case and dtype)", tickangle=-30),
        "shapes": [
            {
                "type": "line",
                "xref": "paper",
                "x0": 0,
                "x1": 1,
                "y0": 1,
                "y1": 1,
                "line": {"dash": "dash", "color": "#c5221f"},
            }
        ],
        "height": 440,
    }
    return Figure(f"correctness vs the float64 reference (run {run.info.id})", traces, layout)


def speedups(speedups_: list, run_info) -> Figure:
    traces = []
    for base in sorted({s.baseline for s in speedups_}):
        pts = [s for s in speedups_ if s.baseline == base]
        traces.append(
            {
                "type": "bar",
                "name": f"vs {base}",
                "x": [f"{s.op} {s.case} {s.mode}" for s in pts],
                "y": [s.speedup for s in pts],
                "marker": {"color": PROVIDER_COLORS.get(base, "#777")},
                "error_y": {
                    "type": "data",
                    "symmetric": False,
                    "array": [(s.ci_high - s.speedup) if s.ci_high else 0 for s in pts],
                    "arrayminus": [(s.speedup - s.ci_low) if s.ci_low else 0 for s in pts],
                },
                "text": [s.verdict for s in pts],
            }
        )
    unity = {
        "type": "line",
        "xref": "paper",
        "x0": 0,
        "x1": 1,
        "y0": 1,
        "y1": 1,
        "line": {"dash": "dash", "color": "#444"},
    }
    layout = {
        "barmode": "group",
        "yaxis": _axis("speedup of wavefront (x, 95% CI)", **UNITLESS),
        "xaxis": _axis("op, case, mode", tickangle=-40),
        "height": 520,
        "shapes": [unity],
    }
    title = (
        f"wavefront speedup per baseline (run {run_info.id}, {run_info.device_name})"
        if run_info
        else "wavefront speedup per baseline"
    )
    return Figure(title, traces, layout)


def history(points: list) -> Figure:
    series: dict[str, list] = defaultdict(list)
    for h in points:
        series[f"{h.series} @ {h.device}"].append(h)
    traces = [
        {
            "type": "scatter",
            "mode": "lines+markers",
            "name": name,
            "x": [p.created_utc for p in pts],
            "y": [p.median_us for p in pts],
            "text": [f"run {p.run_id} {(p.git_sha or '')[:10]}" for p in pts],
        }
        for name, pts in series.items()
    ]
    layout = {
        "yaxis": _axis("wavefront median (us)", **LOG),
        "xaxis": _axis("run date (UTC)"),
        "height": 480,
        "showlegend": len(traces) <= 20,
    }
    return Figure("history across stored GPU runs", traces, layout)


def training_loss(steps: dict[str, list[dict]], run_id) -> Figure:
    traces = [
        {
            "type": "scatter",
            "mode": "lines+markers",
            "name": variant,
            "x": [s["step"] for s in rows],
            "y": [s["loss"] for s in rows],
        }
        for variant, rows in steps.items()
    ]
    layout = {"xaxis": _axis("step", tickformat="d"), "yaxis": _axis("loss")}
    return Figure(f"training loss per step, run {run_id} (baseline vs wavefront-patched)", traces, layout)
