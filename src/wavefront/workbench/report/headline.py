"""The dashboard's first lines: what passed, what is slow, what changed since the previous run.

Each is one sentence built from the stored runs and the documents, so a reader gets the verdict before the
charts (the correctness summary used to sit 4,600 px down, under an 87-row heat map)."""

from __future__ import annotations

from dataclasses import dataclass

from wavefront.workbench.report.data import ReportData
from wavefront.workbench.report.tables import INSPECT, TRAFFIC

#: A stored GPU timing that moved by less than this between two runs is not called a change.
CHANGE_THRESHOLD = 0.03


@dataclass(frozen=True)
class Headline:
    passed: str
    slow: str
    changed: str
    bad: bool  # something failed (a correctness case, a compile)


def _few(items: list[str], n: int = 3) -> str:
    return ", ".join(items[:n]) + (f" and {len(items) - n} more" if len(items) > n else "")


def _passed(data: ReportData) -> tuple[str, bool]:
    run = data.correctness_run
    if run is None:
        return "no correctness results stored yet (run wavefront bench)", False
    rows = run.correctness
    failed = [f"{r.op}/{r.case}/{r.dtype}" for r in rows if not r.passed]
    where = f"run {run.info.id}, {run.info.backend}"
    if not failed:
        return f"{len(rows)}/{len(rows)} correctness cases pass against the float64 reference ({where})", False
    return f"{len(rows) - len(failed)}/{len(rows)} correctness cases pass; failing: {_few(failed)} ({where})", True


def _doc(data: ReportData, schema: str):
    return next((d for d in data.documents if d.schema == schema), None)


def _slow(data: ReportData) -> tuple[str, bool]:
    parts, bad = [], False
    if data.latest_gpu is not None:
        slower = sorted((s for s in data.speedups if s.verdict == "slower"), key=lambda s: s.speedup)
        run = data.latest_gpu.info.id
        if slower:
            parts.append(f"wavefront is slower than a baseline in {len(slower)} case(s) (run {run}): "
                         + _few([f"{s.op}/{s.case}/{s.mode} {s.speedup:.2f}x vs {s.baseline}" for s in slower]))
        else:
            parts.append(f"wavefront is not slower than any baseline in run {run} ({len(data.speedups)} comparisons)")
    else:
        parts.append("no GPU timings stored (CPU runs check correctness, not speed)")
    inspect = _doc(data, INSPECT)
    if inspect is not None:
        rows = inspect.body.get("rows", [])
        spills = sorted({f"{r['op']} {r['mode']}" for r in rows if r.get("spills")})
        failed = sorted({f"{r['op']} {r['mode']}@{r['target']}" for r in rows if not r.get("ok", True)})
        bad = bad or bool(failed)
        parts.append(f"machine code: {len(failed)} failed to compile, {len(spills)} op/mode(s) spill"
                     + (f" ({_few(spills)})" if spills else ""))
    traffic = _doc(data, TRAFFIC)
    if traffic is not None:
        counted = [r for r in traffic.body.get("rows", []) if not r.get("error") and r.get("ratio_min")]
        above = sorted((r for r in counted if r["ratio_min"] > 1.01), key=lambda r: -r["ratio_min"])
        worst: dict[str, float] = {}  # op and mode -> its worst case
        for r in above:
            worst.setdefault(f"{r['op']} {r['mode']}", r["ratio_min"])
        most = _few([f"{name} {ratio:.1f}x" for name, ratio in worst.items()])
        parts.append(f"bytes: {len(counted) - len(above)}/{len(counted)} cases within 1% of the minimum"
                     + (f"; most above: {most}" if above else ""))
    return "; ".join(parts), bad


def _changed(data: ReportData) -> str:
    parts = []
    now, before = data.correctness_run, data.previous_correctness
    if now is not None and before is not None:
        old = {(r.op, r.case, r.dtype): r.passed for r in before.correctness}
        new = {(r.op, r.case, r.dtype): r.passed for r in now.correctness}
        broke = [f"{'/'.join(k)}" for k, ok in new.items() if not ok and old.get(k)]
        fixed = [f"{'/'.join(k)}" for k, ok in new.items() if ok and old.get(k) is False]
        added = [k for k in new if k not in old]
        parts.append(f"correctness vs run {before.info.id}: {len(broke)} newly failing"
                     + (f" ({_few(broke)})" if broke else "") + f", {len(fixed)} newly passing"
                     + (f", {len(added)} new case(s)" if added else ""))
    elif now is not None:
        parts.append("correctness: no earlier run to compare with")
    gpu, prev = data.latest_gpu, data.previous_gpu
    if gpu is not None and prev is not None:
        def medians(run):
            return {m.case_key: m.median_us for m in run.measurements
                    if m.ok and m.provider == "wavefront" and m.median_us}

        a, b = medians(prev), medians(gpu)
        moved = sorted(((b[k] / a[k] - 1, k) for k in a.keys() & b.keys() if abs(b[k] / a[k] - 1) >= CHANGE_THRESHOLD),
                       key=lambda x: -abs(x[0]))
        text = (f"wavefront timings vs GPU run {prev.info.id}: {len(moved)} of {len(a.keys() & b.keys())} cases "
                f"moved by {CHANGE_THRESHOLD:.0%} or more")
        if moved:
            text += " (" + _few([f"{k[0]}/{k[1]}/{k[2]} {abs(d):.0%} {'slower' if d > 0 else 'faster'}"
                                 for d, k in moved]) + ")"
        parts.append(text)
    return "; ".join(parts) or "nothing to compare: a single run is stored"


def headline(data: ReportData) -> Headline:
    passed, bad_pass = _passed(data)
    slow, bad_slow = _slow(data)
    return Headline(passed, slow, _changed(data), bad_pass or bad_slow)
