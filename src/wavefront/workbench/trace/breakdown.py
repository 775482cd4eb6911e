"""Per-step breakdown of wall-clock time that sums to the step's duration exactly.

Steps are the ``ProfilerStep#N`` spans the profiler writes on the host; the window of step N is that
span, ``[ts, ts + dur)``, in wall-clock time. Without step markers the whole trace is one step whose
window runs from the first to the last device event (CPU event on a CPU-only trace). Device work is
counted in the window in which it ran, whichever step launched it.

Device domain (the trace has GPU events). On the timeline, take the unions across all streams and
devices of the rank:

- ``C``: compute kernels, ``X``: communication kernels, ``M``: memcpy and memset;
- ``compute``          = |C \\ X|      compute with no communication running;
- ``comm_overlapped``  = |C ∩ X|      communication hidden behind compute on some stream;
- ``comm_exposed``     = |X \\ C|      communication with no compute kernel on any stream;
- ``memory``           = |M \\ (C ∪ X)| copies and sets with no kernel running;
- ``idle_host_bound`` + ``idle_other`` = |W \\ (C ∪ X ∪ M)|, the device idle.

These five pieces are disjoint and cover the window W, so they sum to the step time. Idle is split per
maximal gap ``[g0, g1)`` of the device (no work on any stream): the gap is *host-bound* when the work that
ends it (the device events starting at g1) had not been handed to the device when the gap began: the
runtime call that launched it ended after g0 (for every event starting at g1). The device drained its
queue and waited for the CPU. Otherwise (the work was already queued, it waited on a dependency, an
event, a sync or the launch latency; or there is no later device work; or its launch is unknown) the gap
is *other*. Per-stream idle is never summed: a stream idling while another runs is not idle time.

CPU domain (no device events): ``C`` is every CPU operator that is not a collective (any thread), ``X``
the collective ops (``gloo:*``, ``c10d::*``, ``record_param_comms`` ...), ``M`` is empty, and idle is time
when no profiled operator runs on any thread (Python, data loading, unprofiled code): all
``idle_other``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from wavefront.workbench.trace.classify import (
    COMM,
    COMPUTE,
    DeviceClasses,
    classify_device,
    is_comm_op_name,
    name_flags,
)
from wavefront.workbench.trace.intervals import IntervalSet, Segments, gaps, sorted_unique, union
from wavefront.workbench.trace.model import CAT_CPU_OP, Trace

_STEP = re.compile(r"^ProfilerStep#(\d+)$")
CATEGORIES = ("compute", "comm_overlapped", "comm_exposed", "memory", "idle_host_bound", "idle_other")


@dataclass(frozen=True)
class Step:
    step: int | None  # the N of ProfilerStep#N; None for "the whole trace"
    start_ns: int
    end_ns: int

    @property
    def dur_ns(self) -> int:
        return self.end_ns - self.start_ns

    @property
    def start_us(self) -> float:
        return self.start_ns / 1000  # int / int: the nearest float (/ 1e3 would round the int first)

    @property
    def dur_us(self) -> float:
        return self.dur_ns / 1e3


@dataclass(frozen=True)
class StepBreakdown:
    """One step's pieces in integer nanoseconds (they sum to ``dur_ns`` exactly); ``us(category)`` and
    ``as_dict()`` give microseconds."""

    step: int | None
    start_ns: int
    dur_ns: int
    compute_ns: int
    comm_overlapped_ns: int
    comm_exposed_ns: int
    memory_ns: int
    idle_host_bound_ns: int
    idle_other_ns: int
    domain: str  # "device" | "cpu"

    def ns(self, category: str) -> int:
        return cast(int, getattr(self, f"{category}_ns"))

    def us(self, category: str) -> float:
        return self.ns(category) / 1e3

    @property
    def dur_us(self) -> float:
        return self.dur_ns / 1e3

    @property
    def compute_busy_ns(self) -> int:
        return self.compute_ns + self.comm_overlapped_ns

    @property
    def comm_busy_ns(self) -> int:
        return self.comm_overlapped_ns + self.comm_exposed_ns

    @property
    def idle_ns(self) -> int:
        return self.idle_host_bound_ns + self.idle_other_ns

    def total_ns(self) -> int:
        return sum(self.ns(c) for c in CATEGORIES)

    def as_dict(self) -> dict[str, Any]:
        """Every time twice: ``<name>_us`` (float microseconds, the nearest float: at Unix-epoch clocks a
        start is within 125 ns) and ``<name>_ns`` (exact integer nanoseconds)."""
        ns = {"start": self.start_ns, "dur": self.dur_ns, **{c: self.ns(c) for c in CATEGORIES},
              "compute_busy": self.compute_busy_ns, "comm_busy": self.comm_busy_ns, "idle": self.idle_ns}
        return {"step": self.step, "domain": self.domain, **{f"{k}_us": int(v) / 1000 for k, v in ns.items()},
                **{f"{k}_ns": int(v) for k, v in ns.items()}}


@dataclass
class Timeline:
    """The unions a breakdown is measured on, for one rank."""

    domain: str
    compute: IntervalSet
    comm: IntervalSet
    memory: IntervalSet
    host_bound: IntervalSet  # idle gaps classified host-bound (device domain only)
    extent_ns: tuple[int, int]  # first start, last end of the work counted

    def breakdown(self, step: Step) -> StepBreakdown:
        """Integer-nanosecond pieces, so they sum to the window exactly; reported in microseconds."""
        lo, hi = step.start_ns, step.end_ns
        seg = Segments.of([self.compute.clip(lo, hi), self.comm.clip(lo, hi), self.memory.clip(lo, hi)], lo, hi)
        compute = seg.measure(lambda c, x, m: c & ~x)
        overlapped = seg.measure(lambda c, x, m: c & x)
        exposed = seg.measure(lambda c, x, m: x & ~c)
        memory = seg.measure(lambda c, x, m: m & ~c & ~x)
        idle = seg.measure(lambda c, x, m: ~c & ~x & ~m)
        host = self.host_bound.clip(lo, hi).measure()
        return StepBreakdown(step.step, lo, hi - lo, compute, overlapped, exposed, memory, host, idle - host,
                             self.domain)


    def breakdowns(self, steps: list[Step]) -> list[StepBreakdown]:
        """:meth:`breakdown` of every step at once: the elementary segments of the whole timeline (cut at
        every interval and step boundary) are classified once, and each step sums its segments through
        prefix sums, so the cost does not grow with steps x intervals. Same integers as per step."""
        if not steps:
            return []
        sets = (self.compute, self.comm, self.memory, self.host_bound)
        edges = np.array([b for s in steps for b in (s.start_ns, s.end_ns)], dtype=np.int64)
        bounds = sorted_unique(np.concatenate([edges] + [a for t in sets for a in (t.starts, t.ends)]))
        left, length = bounds[:-1], np.diff(bounds)
        c, x, m, h = (t.contains(left) for t in sets)
        masks = {"compute": c & ~x, "comm_overlapped": c & x, "comm_exposed": x & ~c, "memory": m & ~c & ~x,
                 "idle": ~c & ~x & ~m, "idle_host_bound": h}
        prefix = {k: np.concatenate([[0], np.cumsum(np.where(v, length, 0))]) for k, v in masks.items()}
        lo = np.searchsorted(bounds, edges[0::2])
        hi = np.searchsorted(bounds, edges[1::2])
        out = []
        for k, step in enumerate(steps):
            if step.end_ns <= step.start_ns:
                out.append(self.breakdown(step))
                continue
            part = {name: int(p[hi[k]] - p[lo[k]]) for name, p in prefix.items()}
            out.append(StepBreakdown(step.step, step.start_ns, step.dur_ns, part["compute"], part["comm_overlapped"],
                                     part["comm_exposed"], part["memory"], part["idle_host_bound"],
                                     part["idle"] - part["idle_host_bound"], self.domain))
        return out


def find_steps(trace: Trace) -> tuple[list[Step], str | None]:
    """ProfilerStep#N windows, sorted by N; or one whole-trace step and a note saying so."""
    cpu = trace.cpu
    step_name = {i: int(m.group(1)) for i, n in enumerate(trace.names) if (m := _STEP.match(n))}
    best: dict[int, Step] = {}
    if step_name and len(cpu):
        rows = np.flatnonzero(np.isin(cpu.name, np.fromiter(step_name, dtype=np.int64)))
        for r in rows.tolist():
            n = step_name[int(cpu.name[r])]
            s = Step(n, int(cpu.ts_ns[r]), int(cpu.ts_ns[r] + cpu.dur_ns[r]))
            if n not in best or s.dur_ns > best[n].dur_ns:
                best[n] = s
    if best:
        return [best[n] for n in sorted(best)], None
    if len(trace.device):
        lo, hi = int(trace.device.ts_ns.min()), int(trace.device.end_ns.max())
    elif len(cpu):
        lo, hi = int(cpu.ts_ns.min()), int(cpu.end_ns.max())
    else:
        return [], "the trace has no events to analyze"
    return [Step(None, lo, hi)], "no ProfilerStep markers: the whole trace is analyzed as one step"


def cpu_comm_rows(trace: Trace) -> np.ndarray:
    """Boolean per CPU event: a collective op or annotation (gloo:all_reduce, c10d::allreduce_, ...)."""
    flags = name_flags(trace.names, is_comm_op_name)[trace.cpu.name]
    if trace.op_comm_args:
        flags |= np.isin(trace.cpu.external_id, np.fromiter(trace.op_comm_args, dtype=np.int64))
    return cast(np.ndarray, flags)


def build_timeline(trace: Trace, classes: DeviceClasses | None = None) -> Timeline:
    if len(trace.device):
        classes = classes if classes is not None else classify_device(trace)
        return _device_timeline(trace, classes)
    cpu = trace.cpu
    comm = cpu_comm_rows(trace)
    ops = (cpu.cat == CAT_CPU_OP) & ~comm
    compute = IntervalSet.union_of(cpu.ts_ns[ops], cpu.end_ns[ops])
    comm_set = IntervalSet.union_of(cpu.ts_ns[comm], cpu.end_ns[comm])
    extent = (int(cpu.ts_ns.min()), int(cpu.end_ns.max())) if len(cpu) else (0, 0)
    return Timeline("cpu", compute, comm_set, IntervalSet.empty(), IntervalSet.empty(), extent)


def _device_timeline(trace: Trace, classes: DeviceClasses) -> Timeline:
    dev = trace.device
    start, end = dev.ts_ns, dev.end_ns
    sets = {}
    for name, sel in (("compute", classes.cls == COMPUTE), ("comm", classes.cls == COMM),
                      ("memory", classes.cls >= 2)):
        sets[name] = IntervalSet.union_of(start[sel], end[sel])
    busy = union(*sets.values())
    steps, _ = find_steps(trace)
    lo = min([int(start.min())] + [s.start_ns for s in steps])
    hi = max([int(end.max())] + [s.end_ns for s in steps])
    host = _host_bound_gaps(trace, classes, busy, lo, hi)
    return Timeline("device", sets["compute"], sets["comm"], sets["memory"], host,
                    (int(start.min()), int(end.max())))


def _host_bound_gaps(trace: Trace, classes: DeviceClasses, busy: IntervalSet, lo: int, hi: int) -> IntervalSet:
    dev, rt = trace.device, trace.runtime
    idle = gaps(busy, lo, hi)
    if len(idle) == 0:
        return IntervalSet.empty()
    launch_end = np.full(len(dev), np.iinfo(np.int64).min)  # unknown launch: never host-bound
    linked = classes.runtime_row >= 0
    launch_end[linked] = rt.end_ns[classes.runtime_row[linked]]
    order = np.argsort(dev.ts_ns, kind="stable")
    ts_sorted, le_sorted = dev.ts_ns[order], launch_end[order]
    uniq, first = np.unique(ts_sorted, return_index=True)
    earliest_launch_end = np.minimum.reduceat(le_sorted, first)
    k = np.searchsorted(uniq, idle.ends, side="left")
    has_next = k < len(uniq)
    k_c = np.minimum(k, len(uniq) - 1)
    ends_at_work = has_next & (uniq[k_c] == idle.ends)
    host = ends_at_work & (earliest_launch_end[k_c] > idle.starts)
    return IntervalSet(idle.starts[host], idle.ends[host])


def step_breakdowns(trace: Trace, timeline: Timeline | None = None) -> tuple[list[StepBreakdown], list[str]]:
    """The breakdown of every step, and notes (whole-trace step, CPU-only trace)."""
    timeline = timeline if timeline is not None else build_timeline(trace)
    steps, note = find_steps(trace)
    notes = [note] if note else []
    if timeline.domain == "cpu":
        notes.append("no device events (CPU-only trace): the breakdown is of CPU operators across threads")
    return timeline.breakdowns(steps), notes
