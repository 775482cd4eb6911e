"""An annotated copy of a trace that Perfetto (ui.perfetto.dev) and chrome://tracing open: every original
event, plus a process "wavefront analysis" whose tracks show the steps with their breakdown and the
intervals behind each category (exposed communication, communication hidden by compute, host-bound and
other idle), so a number in the report can be found on the timeline.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

from wavefront.workbench.trace.breakdown import CATEGORIES, build_timeline, find_steps
from wavefront.workbench.trace.clock import ns_to_us_text
from wavefront.workbench.trace.intervals import IntervalSet, Segments, gaps, union
from wavefront.workbench.trace.load import load_trace
from wavefront.workbench.trace.model import Trace

PID = "wavefront analysis"
TRACKS = ("steps", "comm exposed", "comm hidden by compute", "idle: host-bound", "idle: other")


def _events(track: str, name: str, s: IntervalSet, args: dict[str, Any] | None = None) -> list[str]:
    """The events' JSON texts, times written as exact decimal microseconds (a float would move them by up
    to 128 ns at Unix-epoch clocks)."""
    head = json.dumps({"ph": "X", "cat": "wavefront", "name": name, "pid": PID, "tid": track})[:-1]
    tail = f', "args": {json.dumps(args)}}}' if args else "}"
    return [f'{head}, "ts": {ns_to_us_text(a)}, "dur": {ns_to_us_text(b - a)}{tail}'
            for a, b in zip(s.starts.tolist(), s.ends.tolist(), strict=True)]


def write_annotated(src: str | Path, dst: str | Path) -> dict[str, Any]:
    """Copy ``src`` to ``dst`` (gzip when it ends in .gz) with the analysis tracks added. Returns the
    number of events copied and added."""
    return load_annotated(src, dst)[1]


def load_annotated(src: str | Path, dst: str | Path) -> tuple[Trace, dict[str, Any]]:
    """:func:`write_annotated`, returning the loaded trace too (so the caller's analysis parses once)."""
    dst = Path(dst)
    tmp = dst.with_name(dst.name + ".events.tmp")
    n_copied = 0
    try:
        with open(tmp, "w", encoding="utf-8") as events_out:
            def sink(text: str) -> None:
                nonlocal n_copied
                events_out.write(("," if n_copied else "") + text + "\n")
                n_copied += 1

            trace = load_trace(src, raw_sink=sink)
    except BaseException:
        tmp.unlink(missing_ok=True)  # an unreadable trace (an nsys export, a foreign file) leaves nothing behind
        raise
    timeline = build_timeline(trace)
    steps, _ = find_steps(trace)
    added = [json.dumps({"ph": "M", "name": "process_name", "pid": PID, "tid": 0, "args": {"name": PID}})]
    added += [json.dumps({"ph": "M", "name": "thread_sort_index", "pid": PID, "tid": t, "args": {"sort_index": i}})
              for i, t in enumerate(TRACKS)]
    for step in steps:
        b = timeline.breakdown(step)
        added += _events("steps", f"step {step.step if step.step is not None else 'all'}",
                         IntervalSet.union_of([step.start_ns], [step.end_ns]),
                         {**{f"{c}_us": b.ns(c) / 1000 for c in CATEGORIES},
                          **{f"{c}_ns": b.ns(c) for c in CATEGORIES}})
    if steps:
        lo, hi = min(s.start_ns for s in steps), max(s.end_ns for s in steps)
        seg = Segments.of([timeline.compute.clip(lo, hi), timeline.comm.clip(lo, hi)], lo, hi)
        added += _events("comm exposed", "comm exposed", seg.select(lambda c, x: x & ~c))
        added += _events("comm hidden by compute", "comm hidden", seg.select(lambda c, x: x & c))
        idle = gaps(union(timeline.compute, timeline.comm, timeline.memory), lo, hi)
        host = timeline.host_bound.clip(lo, hi)
        added += _events("idle: host-bound", "idle: host-bound", host)
        other = Segments.of([idle, host], lo, hi).select(lambda i, h: i & ~h)
        added += _events("idle: other", "idle: other", other)
    opener = gzip.open if dst.suffix == ".gz" else open
    meta = {k: v for k, v in trace.meta.items() if k not in ("n_flow_links", "thread_labels")}
    with opener(dst, "wt", encoding="utf-8") as out, open(tmp, encoding="utf-8") as events_in:
        out.write("{\n" + "".join(f"{json.dumps(k)}: {json.dumps(v)},\n" for k, v in meta.items()))
        out.write('"traceEvents": [\n')
        for line in events_in:
            out.write(line)
        for i, e in enumerate(added):
            out.write(("," if n_copied or i else "") + e + "\n")
        out.write("]\n}\n")
    tmp.unlink()
    return trace, {"path": str(dst), "copied": n_copied, "added": len(added), "complete": trace.complete}
