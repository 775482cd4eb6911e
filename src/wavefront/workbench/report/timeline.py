"""The dashboard's timeline view of a trace-analysis document (``wavefront trace analyze --json``, read from a
torch.profiler or jax.profiler JSON trace, an Nsight Systems SQLite export or a rocprofv3 CSV trace;
``wavefront bench --profile`` writes one beside its profile).

Per rank, one row: its steps laid out on the trace's clock (milliseconds from the earliest step start of
any rank), each step's bar split into the six breakdown categories. The segments inside a step are the
categories' sums in a fixed order (a breakdown, not the order the events ran in), so a step's bar is
exactly its duration and the row shows where the steps fall and what filled them. Beside it, the rank's
top kernels by total time (names as the trace gives them, demangled where the tool demangles).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from wavefront.workbench.report.charts import Figure
from wavefront.workbench.report.tables import Table
from wavefront.workbench.trace.breakdown import CATEGORIES
from wavefront.workbench.trace.figures import COLORS, LABELS

SOURCES = {"json": "torch.profiler / JAX trace", "nsys": "Nsight Systems export", "rocprofv3": "rocprofv3 trace"}
TOP_KERNELS = 15


def rank_label(index: int, rank: dict[str, Any]) -> str:
    who = f"rank {rank['rank']}" if rank.get("rank") is not None else f"file {index}"
    return f"{who} ({SOURCES.get(rank.get('source', 'json'), rank.get('source'))})"


def segments(doc: dict[str, Any]) -> dict[str, list[tuple[str, int, int, Any]]]:
    """Per category, its (row label, start ns from the origin, width ns, step) segments."""
    ranks = doc["ranks"]
    starts = [s["start_ns"] for r in ranks for s in r["steps"]]
    origin = min(starts) if starts else 0
    out: dict[str, list[tuple[str, int, int, Any]]] = {c: [] for c in CATEGORIES}
    for i, r in enumerate(ranks):
        label = rank_label(i, r)
        for s in r["steps"]:
            at = s["start_ns"] - origin
            for c in CATEGORIES:
                width = s[f"{c}_ns"]
                if width:
                    out[c].append((label, at, width, s["step"]))
                at += width
    return out


def timeline_figure(doc: dict[str, Any], source: str) -> Figure:
    """The steps of every rank on one time axis, split by category (see the module docstring)."""
    data = []
    for c, segs in segments(doc).items():
        data.append({
            "type": "bar", "orientation": "h", "name": LABELS[c], "marker": {"color": COLORS[c]},
            "y": [label for label, *_ in segs], "base": [at / 1e6 for _, at, _, _ in segs],
            "x": [width / 1e6 for _, _, width, _ in segs],
            "hovertext": [f"step {step}: {LABELS[c]} {width / 1e6:.3f} ms" for _, _, width, step in segs],
            "hoverinfo": "text"})
    n_rows = len(doc["ranks"])
    layout = {"barmode": "overlay", "height": 220 + 60 * n_rows, "legend": {"orientation": "h"},
              "xaxis": {"title": {"text": "ms from the first step's start"}, "automargin": True},
              "yaxis": {"title": {"text": "rank (what wrote the trace)"}, "automargin": True, "autorange": "reversed"}}
    n_steps = sum(len(r["steps"]) for r in doc["ranks"])
    note = (f"{n_steps} step(s) of {n_rows} rank(s) from {source}; inside a step the categories are summed in a "
            "fixed order (compute, hidden comm, exposed comm, memcpy/memset, idle host-bound, idle other), not "
            "drawn in the order the events ran.")
    return Figure(f"timeline: steps and their breakdown per rank ({Path(source).name})", data, layout, note=note)


def kernels_table(doc: dict[str, Any], top: int = TOP_KERNELS) -> Table:
    rows = []
    for i, r in enumerate(doc["ranks"]):
        for k in (r.get("kernels") or {}).get("kernels", [])[:top]:
            rows.append([rank_label(i, r), k["name"], k["cls"], k["count"], k["total_ns"] / 1e6,
                         k["median_ns"] / 1e3, round(100 * k["share"], 2)])
    return Table(f"top kernels per rank (at most {top})", ["rank", "kernel", "class", "count", "total_ms", "median_us",
                                                            "share_pct"], rows)


def is_timeline(doc: Any) -> bool:
    """A trace-analysis document with the per-step integer-ns fields the view needs."""
    ranks = doc.get("ranks") if isinstance(doc, dict) else None
    return isinstance(ranks, list) and bool(ranks) and all(
        isinstance(r, dict) and isinstance(r.get("steps"), list)
        and all(isinstance(s, dict) and "start_ns" in s and all(f"{c}_ns" in s for c in CATEGORIES)
                for s in r["steps"]) for r in ranks)
