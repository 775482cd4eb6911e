"""What both loaders share: which events are kept, and how the kept columns become a :class:`Trace`.

The fast loader (:mod:`wavefront.workbench.trace.decode`, typed msgspec decoding in byte ranges) and the
streaming fallback (:mod:`wavefront.workbench.trace.load`, for damaged files and installs without
msgspec) each produce :class:`Parts`: the kept fields of the events as numpy columns, times already in
integer nanoseconds (:mod:`wavefront.workbench.trace.clock`), names interned. Parts of one file read in
pieces are concatenated with :meth:`Parts.merge`; :func:`finish` sorts them by time and links flows.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from wavefront.workbench.trace.clock import ns_to_us_text
from wavefront.workbench.trace.model import (
    CAT_CPU_OP,
    CAT_USER_ANNOTATION,
    KIND_KERNEL,
    KIND_MEMCPY,
    KIND_MEMSET,
    NO_ID,
    Columns,
    OpShapes,
    Trace,
)

DEVICE_CATS = {"kernel": KIND_KERNEL, "Kernel": KIND_KERNEL, "gpu_memcpy": KIND_MEMCPY, "Memcpy": KIND_MEMCPY,
               "gpu_memset": KIND_MEMSET, "Memset": KIND_MEMSET}
RUNTIME_CATS = frozenset({"cuda_runtime", "cuda_driver", "Runtime", "hip_runtime", "hip_driver",
                          "privateuse1_runtime", "privateuse1_driver"})
CPU_CATS = {"cpu_op": CAT_CPU_OP, "Operator": CAT_CPU_OP, "user_annotation": CAT_USER_ANNOTATION}
SYNC_CATS = frozenset({"cuda_sync"})
# The collective metadata torch.profiler writes on record_param_comms ops (and on newer NCCL kernels).
COMM_ARG_KEYS = ("Collective name", "Process Group Name", "Process Group Description", "Process Group Ranks",
                 "pg_id", "In msg nelems", "Out msg nelems", "Group size", "dtype", "Seq", "Rank")
META_NAMES = frozenset({"process_name", "process_labels", "thread_name"})
# jax.profiler (XLA) traces have no categories: an event whose args name an HLO op ("hlo_op") is device work
# (a kernel of the XLA backend's executor: a GPU stream, or the CPU client's threads), and an event with a
# "step_num" arg (jax.profiler.StepTraceAnnotation) marks step N, read as ProfilerStep#N.
XLA_STEP_CAT = "user_annotation"


def xla_step_name(step_num: int | str) -> str:
    return f"ProfilerStep#{int(step_num)}"

COLUMNS = {
    "dev": ("ts_ns", "dur_ns", "kind", "name", "device", "stream", "correlation", "external_id", "has_coll", "run_id",
            "pid", "tid"),
    "rt": ("ts_ns", "dur_ns", "name", "tid", "correlation", "external_id"),
    "cpu": ("ts_ns", "dur_ns", "name", "tid", "cat", "external_id", "shape"),
    "flow": ("pid", "tid", "ts_ns", "id"),
}
DTYPES = {"kind": np.int8, "has_coll": np.int8, "cat": np.int8, "name": np.int32, "shape": np.int32}


def int_id(value: object) -> int:
    """Ids are usually ints; strings ("stream 7", "Spans") become their digits, or a stable hash."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if value is None:
        return NO_ID
    text = str(value)
    digits = re.sub(r"\D", "", text)
    return int(digits) if digits and len(digits) < 18 else zlib.crc32(text.encode()) + (1 << 40)


def int_ids(values: list[Any]) -> np.ndarray:
    """int_id of each value; a list of plain ints (the usual case) converts in one numpy call."""
    try:
        out = np.array(values)
    except (TypeError, ValueError, OverflowError):
        out = None
    if out is not None and out.dtype == np.int64 and out.ndim == 1:
        return out
    return np.array([v if type(v) is int else int_id(v) for v in values], dtype=np.int64)


def empty_table(table: str) -> dict[str, np.ndarray]:
    return {k: np.zeros(0, dtype=DTYPES.get(k, np.int64)) for k in COLUMNS[table]}


@dataclass
class Parts:
    """The kept events of a trace (or of a byte range of it), as columns."""

    names: list[str] = field(default_factory=list)
    tables: dict[str, dict[str, np.ndarray]] = field(default_factory=lambda: {t: empty_table(t) for t in COLUMNS})
    shapes: list[OpShapes] = field(default_factory=list)
    op_comm: dict[int, dict[str, Any]] = field(default_factory=dict)  # External id -> collective args
    kernel_comm: dict[int, dict[str, Any]] = field(default_factory=dict)  # correlation -> collective args
    meta_events: dict[str, dict[str, Any]] = field(default_factory=dict)
    n_sync: int = 0
    n_events: int = 0
    n_malformed: int = 0
    n_flows_skipped: int = 0  # ac2g flows counted but not kept (no device event needed them)

    @staticmethod
    def merge(parts: list[Parts]) -> Parts:
        """One Parts from pieces read separately: names and shapes re-interned, columns concatenated."""
        if len(parts) == 1:
            return parts[0]
        out = Parts()
        name_ids: dict[str, int] = {}
        shape_ids: dict[str, int] = {}
        pieces: dict[str, dict[str, list[np.ndarray]]] = {t: {k: [] for k in COLUMNS[t]} for t in COLUMNS}
        for p in parts:
            remap = np.array([name_ids.setdefault(n, len(name_ids)) for n in p.names] or [0], dtype=np.int32)
            shape_map = []
            for s in p.shapes:
                key = f"{s.dims}{s.types}{s.concrete}"
                if key not in shape_ids:
                    shape_ids[key] = len(out.shapes)
                    out.shapes.append(s)
                shape_map.append(shape_ids[key])
            smap = np.array(shape_map or [0], dtype=np.int32)
            for t, cols in p.tables.items():
                for k, v in cols.items():
                    if k == "name":
                        v = remap[v]
                    elif k == "shape":
                        v = np.where(v >= 0, smap[np.maximum(v, 0)], v).astype(np.int32)
                    pieces[t][k].append(v)
            out.op_comm.update(p.op_comm)
            out.kernel_comm.update(p.kernel_comm)
            out.meta_events.update(p.meta_events)
            out.n_sync += p.n_sync
            out.n_events += p.n_events
            out.n_malformed += p.n_malformed
            out.n_flows_skipped += p.n_flows_skipped
        out.names = list(name_ids)
        out.tables = {t: {k: np.concatenate(v) for k, v in cols.items()} for t, cols in pieces.items()}
        return out


def finish(parts: Parts, path: Path, meta: dict[str, Any], warnings: list[str], complete: bool, nbytes: int) -> Trace:
    """The loaded trace: every table sorted by start time (stable), flows linked, warnings noted."""

    def cols(table: dict[str, np.ndarray]) -> Columns:
        ts = table["ts_ns"]
        if len(ts) < 2 or bool(np.all(ts[1:] >= ts[:-1])):  # already in time order: nothing to move
            out = dict(table)
        else:
            order = np.argsort(ts, kind="stable")
            out = {k: v[order] for k, v in table.items()}
        return Columns(out)

    t = dict(parts.tables)
    negative = _drop_negative_durations(t, parts.names)
    if negative:
        parts.n_malformed += negative[0]
    device, runtime, cpu, flow = cols(t["dev"]), cols(t["rt"]), cols(t["cpu"]), cols(t["flow"])
    _link_flows(device, flow)
    device.cols.pop("pid")
    device.cols.pop("tid")
    if negative:
        n, name, ts, dur = negative
        warnings.append(f"{path}: {n} event(s) with a negative duration skipped, the first {name!r} at ts "
                        f"{ns_to_us_text(ts)} us with dur {ns_to_us_text(dur)} us: the profiler's clock or the "
                        "file's writer is broken, and steps or kernels among them are missing from the analysis")
    if parts.n_malformed > (negative[0] if negative else 0):
        warnings.append(f"{parts.n_malformed - (negative[0] if negative else 0)} malformed event(s) skipped")
    meta = dict(meta)
    meta["n_flow_links"] = len(flow) + parts.n_flows_skipped
    meta["thread_labels"] = parts.meta_events
    return Trace(path=str(path), names=parts.names, device=device, runtime=runtime, cpu=cpu, shapes=parts.shapes,
                 op_comm_args=parts.op_comm, kernel_comm_args=parts.kernel_comm, n_sync_events=parts.n_sync,
                 n_events=parts.n_events, n_malformed=parts.n_malformed, meta=meta, warnings=warnings,
                 complete=complete, bytes_read=nbytes)


def _drop_negative_durations(tables: dict[str, dict[str, np.ndarray]],
                             names: list[str]) -> tuple[int, str, int, int] | None:
    """Remove the events whose ``dur`` is negative (in place); their count and the earliest of them (name,
    ts_ns, dur_ns), or None when there is none. Such an event has no meaning: counting it as zero long
    would report zero-length steps and kernels without a word."""
    count, first = 0, None
    for key in ("dev", "rt", "cpu"):
        table = tables[key]
        bad = table["dur_ns"] < 0
        if not np.any(bad):
            continue
        rows = np.flatnonzero(bad)
        count += len(rows)
        row = int(rows[np.argmin(table["ts_ns"][rows])])
        candidate = (int(table["ts_ns"][row]), names[int(table["name"][row])], int(table["dur_ns"][row]))
        first = candidate if first is None or candidate[0] < first[0] else first
        tables[key] = {k: v[~bad] for k, v in table.items()}
    if first is None:
        return None
    return count, first[1], first[0], first[2]


def _link_flows(device: Columns, flow: Columns) -> None:
    """Device events written without a correlation arg take it from the ac2g flow that ends on them
    (same pid, tid and start time): Kineto's ac2g flow id is the correlation id."""
    missing = np.flatnonzero(device.correlation == NO_ID)
    if len(missing) == 0 or len(flow) == 0:
        return
    index = {(p, t, ts): i for p, t, ts, i in zip(flow.pid.tolist(), flow.tid.tolist(), flow.ts_ns.tolist(),
                                                  flow.id.tolist(), strict=True)}
    pid, tid, ts = device.pid[missing].tolist(), device.tid[missing].tolist(), device.ts_ns[missing].tolist()
    for row, key in zip(missing.tolist(), zip(pid, tid, ts, strict=True), strict=True):
        corr = index.get(key)
        if corr is not None:
            device.correlation[row] = corr
