"""Kernel table (top kernels and families by total time) and the roofline placement of the ops behind them.

Device domain: one row per kernel name and per family (:func:`classify.family`), over every device event
(kernels, memcpy, memset). Durations are summed per event, not unioned: overlapping kernels on two
streams both count. CPU domain (CPU-only traces): the same table over the top-level CPU operators of each
thread (operators not nested in another operator), so nothing is counted twice.

Roofline: each launch of an op with known FLOPs and bytes (:mod:`flops`, needs ``record_shapes``) is one
instance whose device time is the sum of the kernels it launched. Instances are grouped by (op, shapes,
dtype); the median instance time gives achieved FLOP/s and bytes/s, placed against the device's dense
peak for the dtype and its HBM bandwidth from :mod:`wavefront.workbench.hardware`:
``attainable = min(peak, intensity * bandwidth)``; ``bound`` says which roof is lower at that intensity.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from wavefront.workbench import hardware
from wavefront.workbench.trace.breakdown import Step
from wavefront.workbench.trace.classify import CLASS_NAMES, DeviceClasses, family
from wavefront.workbench.trace.flops import DTYPE_PEAK, op_cost
from wavefront.workbench.trace.model import CAT_CPU_OP, KIND_KERNEL, Trace


@dataclass(frozen=True)
class KernelStats:
    name: str
    cls: str  # compute | comm | memcpy | memset | cpu-op
    count: int
    total_us: float
    mean_us: float
    median_us: float
    p90_us: float
    max_us: float
    share: float  # of the summed duration of all rows
    # the same in nanoseconds: total and max exact integers; mean, median, p90 statistics of integers
    total_ns: int = 0
    mean_ns: float = 0.0
    median_ns: float = 0.0
    p90_ns: float = 0.0
    max_ns: int = 0


@dataclass(frozen=True)
class RooflinePoint:
    op: str
    shapes: str
    dtype: str
    kernels: tuple[str, ...]  # families of the kernels the op launched
    count: int
    median_us: float
    flops: float
    bytes_moved: float
    intensity: float  # FLOP/byte
    achieved_tflops: float
    achieved_tbps: float
    attainable_tflops: float | None
    pct_of_roof: float | None
    bound: str | None  # "memory" | "compute"
    median_ns: float = 0.0  # median_us in nanoseconds (the median of integer-nanosecond call times)


@dataclass
class KernelReport:
    domain: str
    kernels: list[KernelStats]
    families: list[KernelStats]
    roofline: list[RooflinePoint] = field(default_factory=list)
    gpu: str | None = None  # device-table key used for the roofline
    notes: list[str] = field(default_factory=list)


def top_level_cpu_ops(trace: Trace) -> np.ndarray:
    """Rows of CPU operators not nested inside another operator on the same thread."""
    cpu = trace.cpu
    rows = np.flatnonzero(cpu.cat == CAT_CPU_OP)
    if len(rows) == 0:
        return rows
    order = rows[np.lexsort((cpu.ts_ns[rows], cpu.tid[rows]))]
    tid, ts, end = cpu.tid[order], cpu.ts_ns[order], cpu.end_ns[order]
    keep = np.ones(len(order), dtype=bool)
    bounds = np.flatnonzero(np.diff(tid)) + 1
    for a, b in zip(np.r_[0, bounds], np.r_[bounds, len(order)], strict=True):
        reach = np.maximum.accumulate(end[a:b])
        keep[a + 1:b] = ts[a + 1:b] >= reach[:-1]
    return np.sort(order[keep])


def _stats_table(labels: list[str], cls_of: dict[str, str], keys: np.ndarray, durs_ns: np.ndarray,
                 top: int) -> list[KernelStats]:
    """Per label (``keys`` index ``labels``), count and duration statistics (from integer nanoseconds) of
    the ``top`` by total."""
    if len(keys) == 0:
        return []
    keys = np.asarray(keys, dtype=np.int64)
    durs_ns = np.asarray(durs_ns, dtype=np.int64)
    totals = np.bincount(keys, weights=durs_ns, minlength=len(labels))
    counts = np.bincount(keys, minlength=len(labels))
    present = np.flatnonzero(counts)
    grand = int(durs_ns.sum()) or 1
    order = present[np.argsort(-totals[present], kind="stable")[:top]]
    sort_idx = np.argsort(keys, kind="stable")
    bounds = np.concatenate([[0], np.cumsum(counts)])
    rows = []
    for g in order.tolist():
        d = durs_ns[sort_idx[bounds[g]:bounds[g + 1]]]
        label = labels[g]
        total, peak = int(d.sum()), int(d.max())
        mean, median, p90 = float(d.mean()), float(np.median(d)), float(np.percentile(d, 90))
        rows.append(KernelStats(label, cls_of.get(label, "compute"), int(len(d)), total / 1000, mean / 1e3,
                                median / 1e3, p90 / 1e3, peak / 1000, total / grand, total, mean, median, p90, peak))
    return rows


def kernel_table(trace: Trace, classes: DeviceClasses | None, top: int = 20) -> KernelReport:
    if len(trace.device) == 0:
        rows = top_level_cpu_ops(trace)
        names = trace.cpu.name[rows]
        labels = trace.names
        cpu_cls = {trace.names[i]: "cpu-op" for i in np.unique(names).tolist()}
        durs = trace.cpu.dur_ns[rows]
        table = _stats_table(labels, cpu_cls, names, durs, top)
        fam_labels, fam_ids = _family_ids(trace.names, names)
        cls_fam = {f: "cpu-op" for f in fam_labels}
        return KernelReport("cpu", table, _stats_table(fam_labels, cls_fam, fam_ids, durs, top),
                            notes=["no device events: the table lists top-level CPU operators"])
    dev = trace.device
    if classes is None:
        raise ValueError("classes: a trace with device events needs its classification")
    # a name's class: that of its first event
    name_ids, first = np.unique(dev.name, return_index=True)
    cls_of = {trace.names[n]: CLASS_NAMES[c] for n, c in zip(name_ids.tolist(), classes.cls[first].tolist(),
                                                              strict=True)}
    fam_labels, fam_ids = _family_ids(trace.names, dev.name)
    fam_cls = {family(n): c for n, c in cls_of.items()}
    durs = dev.dur_ns
    return KernelReport("device", _stats_table(trace.names, cls_of, dev.name, durs, top),
                        _stats_table(fam_labels, fam_cls, fam_ids, durs, top))


def _family_ids(names: list[str], name_ids: np.ndarray) -> tuple[list[str], np.ndarray]:
    """Family label list and, per event, the index of its family."""
    uniq = np.flatnonzero(np.bincount(name_ids)) if len(name_ids) else np.zeros(0, dtype=np.int64)  # ids are small
    labels: list[str] = []
    index: dict[str, int] = {}
    lut = np.zeros(int(uniq.max()) + 1 if len(uniq) else 1, dtype=np.int64)
    for nid in uniq.tolist():
        fam = family(names[nid])
        lut[nid] = index.setdefault(fam, len(index))
        if lut[nid] == len(labels):
            labels.append(fam)
    return labels, lut[name_ids] if len(name_ids) else np.zeros(0, dtype=np.int64)


def family_time_by_step(trace: Trace, steps: list[Step], top_level_rows: np.ndarray | None = None) -> dict[str, Any]:
    """Per family, the summed duration of its events that start inside each step window."""
    if len(trace.device):
        ts, dur, name_ids = trace.device.ts_ns, trace.device.dur_ns / 1e3, trace.device.name
    else:
        rows = top_level_rows if top_level_rows is not None else top_level_cpu_ops(trace)
        ts, dur, name_ids = trace.cpu.ts_ns[rows], trace.cpu.dur_ns[rows] / 1e3, trace.cpu.name[rows]
    if not steps or len(ts) == 0:
        return {}
    labels, fam = _family_ids(trace.names, name_ids)
    starts = np.array([s.start_ns for s in steps], dtype=np.int64)
    ends = np.array([s.end_ns for s in steps], dtype=np.int64)
    k = np.searchsorted(starts, ts, side="right") - 1
    inside = (k >= 0) & (ts < ends[np.maximum(k, 0)])
    grid = np.zeros((len(labels), len(steps)))
    np.add.at(grid, (fam[inside], k[inside]), dur[inside])
    return {labels[i]: grid[i].tolist() for i in range(len(labels))}


def resolve_gpu(trace: Trace, device: str | None) -> tuple[hardware.GPU | None, str | None]:
    """The device-table row for the roofline, or (None, reason)."""
    try:
        if device:
            return hardware.get_gpu(device), None
        if trace.device_name:
            return hardware.gpu_from_device_name(trace.device_name), None
    except ValueError as exc:
        return None, f"{exc}; the kernel roofline is skipped (pass --device to choose a row)"
    return None, "the trace names no GPU (deviceProperties is empty); the kernel roofline is skipped"


def roofline(trace: Trace, classes: DeviceClasses, device: str | None = None, top: int = 30) -> tuple[
        list[RooflinePoint], str | None, list[str]]:
    """Roofline points, the device-table key used (None when unknown), and notes."""
    notes: list[str] = []
    gpu, why = resolve_gpu(trace, device)
    if why:
        notes.append(why)
    dev, cpu = trace.device, trace.cpu
    sel = (dev.kind == KIND_KERNEL) & (classes.op_row >= 0)
    sel[sel] = cpu.shape[classes.op_row[sel]] >= 0
    if not np.any(sel):
        notes.append("no kernel links to an op with recorded input shapes (profile with record_shapes=True)")
        return [], gpu.key if gpu else None, notes
    op_rows = classes.op_row[sel]
    # One instance per launching op call (its kernels' times summed), grouped by (op name, shapes).
    uniq_ops, inv = np.unique(op_rows, return_inverse=True)
    inst_dur = np.bincount(inv, weights=dev.dur_ns[sel])  # ns, exact below 2**53
    inst_key = cpu.name[uniq_ops].astype(np.int64) * (len(trace.shapes) + 1) + cpu.shape[uniq_ops]
    keys, group_of_inst = np.unique(inst_key, return_inverse=True)
    n_names = len(trace.names)
    kernel_pairs = np.divmod(np.unique(group_of_inst[inv].astype(np.int64) * n_names + dev.name[sel]), n_names)
    groups: dict[tuple[Any, ...], dict[str, Any]] = {}
    for g, key in enumerate(keys.tolist()):
        name_id, shape_id = divmod(key, len(trace.shapes) + 1)
        name, shapes = trace.names[name_id], trace.shapes[shape_id]
        cost = op_cost(name, shapes.dims, shapes.types)
        if cost is None or cost.bytes_moved <= 0:
            continue
        durs = inst_dur[group_of_inst == g]
        kernels = {family(trace.names[n]) for n in kernel_pairs[1][kernel_pairs[0] == g].tolist()}
        groups[(name, json.dumps(shapes.dims), cost.dtype)] = {"cost": cost, "durs": durs, "kernels": kernels}
    points = []
    for (name, shapes_text, dtype), grp in groups.items():
        cost, med_ns = grp["cost"], float(np.median(grp["durs"]))
        med = med_ns / 1e3
        if med <= 0:
            continue
        achieved_tflops = cost.flops / med / 1e6
        achieved_tbps = cost.bytes_moved / med / 1e6
        attainable = pct = bound = None
        if gpu is not None and dtype in DTYPE_PEAK:
            try:
                peak = gpu.peak_tflops(DTYPE_PEAK[dtype])
            except ValueError as exc:
                notes.append(str(exc))
            else:
                memory_roof = cost.intensity * gpu.hbm_tbps
                attainable = min(peak, memory_roof)
                bound = "memory" if memory_roof < peak else "compute"
                pct = 100.0 * achieved_tflops / attainable
        points.append(RooflinePoint(name, shapes_text, dtype, tuple(sorted(grp["kernels"])), len(grp["durs"]), med,
                                    cost.flops, cost.bytes_moved, cost.intensity, achieved_tflops, achieved_tbps,
                                    attainable, pct, bound, med_ns))
    points.sort(key=lambda p: -p.median_us * p.count)
    return points[:top], gpu.key if gpu else None, notes
