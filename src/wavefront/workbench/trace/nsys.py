"""Nsight Systems SQLite exports (``nsys export --type sqlite``) read into the same :class:`Trace` columns as
a torch.profiler trace, so the breakdown, kernel table, launch statistics and multi-rank analyses apply.

Schema followed: the export schema Nsight Systems documents for its 2024.x and 2025.x releases (the
"SQLite Schema Reference" of the user guide). Read (stdlib ``sqlite3``, times as the integers stored):

- ``CUPTI_ACTIVITY_KIND_KERNEL``: ``start``, ``end``, ``deviceId``, ``streamId``, ``correlationId`` and the
  kernel name through ``StringIds`` (``demangledName``, else ``shortName``) -> device kernels;
- ``CUPTI_ACTIVITY_KIND_MEMCPY`` / ``CUPTI_ACTIVITY_KIND_MEMSET`` (optional): ``start``, ``end``,
  ``deviceId``, ``streamId``, ``correlationId``, ``copyKind`` -> memcpy / memset, named as torch.profiler
  names them ("Memcpy HtoD", "Memset (Device)");
- ``CUPTI_ACTIVITY_KIND_RUNTIME`` (optional): CUDA runtime/driver calls, ``start``, ``end``, ``globalTid``,
  ``correlationId``, ``nameId`` -> runtime calls (a device event links to its launch by ``correlationId``);
- ``NVTX_EVENTS`` (optional): push/pop (``eventType`` 59) and start/end (60) ranges with ``text`` or
  ``textId`` -> host ranges. A range whose name is a step (``ProfilerStep#N`` by default) becomes a step
  annotation; every other range is read as a host operator, and each runtime call takes the innermost
  non-step range enclosing it on its thread as its launching op (the role torch.profiler's External id
  plays), so a kernel launched inside an ``nccl:*`` range classifies as communication.
- ``StringIds`` (``id``, ``value``): the string table.

An export without ``CUPTI_ACTIVITY_KIND_KERNEL``, ``StringIds`` or one of the columns above is refused with
:class:`~wavefront.workbench.trace.load.TraceLoadError` naming the file and what is missing; nothing is guessed.
Not read yet: OS runtime, CUDA graph node ids, GPU metrics, NVTX payloads, ``TARGET_INFO_*`` device names.
"""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import numpy as np

from wavefront.workbench.trace.events import COLUMNS, DTYPES, Parts, finish
from wavefront.workbench.trace.load import TraceLoadError
from wavefront.workbench.trace.model import (
    CAT_CPU_OP,
    CAT_USER_ANNOTATION,
    KIND_KERNEL,
    KIND_MEMCPY,
    KIND_MEMSET,
    NO_ID,
    Trace,
)

SQLITE_MAGIC = b"SQLite format 3\x00"
_API_VERSION = re.compile(r"_v\d{4,}$")
SCHEMA = "Nsight Systems SQLite export (2024.x/2025.x schema)"
NVTX_PUSH_POP, NVTX_START_END = 59, 60
DEFAULT_STEP_PATTERN = r"^ProfilerStep#(\d+)$"
# CUPTI_ActivityMemcpyKind, as stored in copyKind.
COPY_KINDS = {1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA", 8: "DtoD", 9: "HtoH",
              10: "PtoP"}
REQUIRED = {
    "CUPTI_ACTIVITY_KIND_KERNEL": ("start", "end", "deviceId", "streamId", "correlationId"),
    "StringIds": ("id", "value"),
}
OPTIONAL = {
    "CUPTI_ACTIVITY_KIND_MEMCPY": ("start", "end", "deviceId", "streamId", "correlationId", "copyKind"),
    "CUPTI_ACTIVITY_KIND_MEMSET": ("start", "end", "deviceId", "streamId", "correlationId"),
    "CUPTI_ACTIVITY_KIND_RUNTIME": ("start", "end", "globalTid", "correlationId", "nameId"),
    "NVTX_EVENTS": ("start", "end", "eventType", "globalTid"),
}


def is_sqlite(path: Path) -> bool:
    """The file starts with SQLite's 16-byte header (the kind is read from the content, not the name)."""
    with open(path, "rb") as f:
        return f.read(len(SQLITE_MAGIC)) == SQLITE_MAGIC


def _columns(db: sqlite3.Connection) -> dict[str, set[str]]:
    tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")]
    return {t: {r[1] for r in db.execute(f'PRAGMA table_info("{t}")')} for t in tables}


def _check_schema(path: Path, have: dict[str, set[str]]) -> None:
    problems = []
    for table, cols in REQUIRED.items():
        if table not in have:
            problems.append(f"table {table}")
            continue
        problems += [f"{table}.{c}" for c in cols if c not in have[table]]
    if "CUPTI_ACTIVITY_KIND_KERNEL" in have and not have["CUPTI_ACTIVITY_KIND_KERNEL"] & {"demangledName",
                                                                                           "shortName"}:
        problems.append("CUPTI_ACTIVITY_KIND_KERNEL.demangledName or .shortName")
    for table, cols in OPTIONAL.items():
        if table in have:
            problems += [f"{table}.{c}" for c in cols if c not in have[table]]
    if "NVTX_EVENTS" in have and not have["NVTX_EVENTS"] & {"text", "textId"}:
        problems.append("NVTX_EVENTS.text or .textId")
    if problems:
        raise TraceLoadError(f"{path}: not a {SCHEMA}: missing " + ", ".join(problems))


def load_nsys(path: str | Path, *, step_pattern: str = DEFAULT_STEP_PATTERN) -> Trace:
    """One rank's Nsight Systems SQLite export as a :class:`Trace` (times: the export's integer ns)."""
    path = Path(path)
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        raise TraceLoadError(f"{path}: cannot open the SQLite file ({exc})") from None
    try:
        have = _columns(db)
        _check_schema(path, have)
        parts = _read(db, have, re.compile(step_pattern))
    except (sqlite3.Error, TypeError) as exc:  # TypeError: a NULL where the schema stores a time
        raise TraceLoadError(f"{path}: not a readable {SCHEMA} ({exc})") from None
    finally:
        db.close()
    meta = {"source": "nsys", "schema": SCHEMA}
    return finish(parts, path, meta, [], True, path.stat().st_size)


class _Names:
    def __init__(self, strings: dict[int, str]):
        self.strings = strings
        self.names: list[str] = []
        self.ids: dict[str, int] = {}

    def intern(self, name: str) -> int:
        nid = self.ids.get(name)
        if nid is None:
            nid = self.ids[name] = len(self.names)
            self.names.append(name)
        return nid


def _col(values: list, key: str) -> np.ndarray:
    return np.array(values, dtype=DTYPES.get(key, np.int64)).reshape(-1)


def _read(db: sqlite3.Connection, have: dict[str, set[str]], step: re.Pattern) -> Parts:
    strings = dict(db.execute("SELECT id, value FROM StringIds"))
    names = _Names(strings)
    dev: dict[str, list] = {k: [] for k in COLUMNS["dev"]}
    n_events = 0

    kernel_cols = have["CUPTI_ACTIVITY_KIND_KERNEL"]
    name_col = "demangledName" if "demangledName" in kernel_cols else "shortName"
    sources = [(KIND_KERNEL, f'SELECT start, "end", deviceId, streamId, correlationId, {name_col} '
                             "FROM CUPTI_ACTIVITY_KIND_KERNEL")]
    if "CUPTI_ACTIVITY_KIND_MEMCPY" in have:
        sources.append((KIND_MEMCPY, 'SELECT start, "end", deviceId, streamId, correlationId, copyKind '
                                     "FROM CUPTI_ACTIVITY_KIND_MEMCPY"))
    if "CUPTI_ACTIVITY_KIND_MEMSET" in have:
        sources.append((KIND_MEMSET, 'SELECT start, "end", deviceId, streamId, correlationId, NULL '
                                     "FROM CUPTI_ACTIVITY_KIND_MEMSET"))
    for kind, sql in sources:
        for start, end, device, stream, corr, extra in db.execute(sql):
            n_events += 1
            if kind == KIND_KERNEL:
                name = strings.get(extra, f"<string {extra}>")
            elif kind == KIND_MEMCPY:
                name = f"Memcpy {COPY_KINDS.get(extra, 'Unknown')}"
            else:
                name = "Memset (Device)"
            row = {"ts_ns": start, "dur_ns": end - start, "kind": kind, "name": names.intern(name),
                   "device": device, "stream": stream, "correlation": corr, "external_id": NO_ID, "has_coll": 0,
                   "run_id": NO_ID, "pid": NO_ID, "tid": NO_ID}
            for k, v in row.items():
                dev[k].append(v)

    cpu: dict[str, list] = {k: [] for k in COLUMNS["cpu"]}
    op_ranges: dict[int, list[tuple[int, int, int]]] = {}  # thread -> (start, end, external id) of operators
    n_steps = 0
    if "NVTX_EVENTS" in have:
        nvtx_cols = have["NVTX_EVENTS"]
        text = "text" if "text" in nvtx_cols else "NULL"
        text_id = "textId" if "textId" in nvtx_cols else "NULL"
        sql = (f'SELECT start, "end", globalTid, {text}, {text_id} FROM NVTX_EVENTS '
               f'WHERE eventType IN ({NVTX_PUSH_POP}, {NVTX_START_END}) AND "end" IS NOT NULL ORDER BY start')
        for start, end, tid, label, label_id in db.execute(sql):
            n_events += 1
            name = label if label is not None else strings.get(label_id, f"<string {label_id}>")
            m = step.search(name)
            ext = len(cpu["ts_ns"]) + 1
            if m:
                # the step number: the pattern's first group, else the order of appearance
                number = m.group(1) if m.groups() and m.group(1) and m.group(1).isdigit() else None
                n_steps += 1
                name = f"ProfilerStep#{number if number is not None else n_steps}"
                cat = CAT_USER_ANNOTATION
            else:
                cat = CAT_CPU_OP
                op_ranges.setdefault(tid or 0, []).append((start, end, ext))
            row = {"ts_ns": start, "dur_ns": end - start, "name": names.intern(name), "tid": tid or 0, "cat": cat,
                   "external_id": ext, "shape": NO_ID}
            for k, v in row.items():
                cpu[k].append(v)

    rt: dict[str, list] = {k: [] for k in COLUMNS["rt"]}
    if "CUPTI_ACTIVITY_KIND_RUNTIME" in have:
        sql = 'SELECT start, "end", globalTid, correlationId, nameId FROM CUPTI_ACTIVITY_KIND_RUNTIME ORDER BY start'
        for start, end, tid, corr, name_id in db.execute(sql):
            n_events += 1
            name = strings.get(name_id, f"<string {name_id}>")
            # nsys appends the API's version to its name (cudaLaunchKernel_v7000); torch.profiler does not
            name = _API_VERSION.sub("", name)
            row = {"ts_ns": start, "dur_ns": end - start, "name": names.intern(name), "tid": tid or 0,
                   "correlation": corr, "external_id": NO_ID}
            for k, v in row.items():
                rt[k].append(v)
        rt["external_id"] = _enclosing(op_ranges, rt)

    parts = Parts()
    parts.names = names.names
    parts.tables = {"dev": {k: _col(v, k) for k, v in dev.items()},
                    "rt": {k: _col(v, k) for k, v in rt.items()},
                    "cpu": {k: _col(v, k) for k, v in cpu.items()},
                    "flow": {k: _col([], k) for k in COLUMNS["flow"]}}
    parts.n_events = n_events
    return parts


def _enclosing(op_ranges: dict[int, list[tuple[int, int, int]]], rt: dict[str, list]) -> list[int]:
    """External id of the innermost operator range on the same thread holding each runtime call (rows in
    start order), NO_ID where none does: one sweep per thread with a stack of the open ranges."""
    out = [NO_ID] * len(rt["ts_ns"])
    by_thread: dict[int, list[int]] = {}
    for row, tid in enumerate(rt["tid"]):
        by_thread.setdefault(tid, []).append(row)
    for tid, rows in by_thread.items():
        ranges = op_ranges.get(tid, [])
        stack: list[tuple[int, int, int]] = []
        i = 0
        for row in rows:
            start, end = rt["ts_ns"][row], rt["ts_ns"][row] + rt["dur_ns"][row]
            while i < len(ranges) and ranges[i][0] <= start:
                stack.append(ranges[i])
                i += 1
            stack = [r for r in stack if r[1] > start]
            for r0, r1, ext in reversed(stack):
                if r0 <= start and r1 >= end:
                    out[row] = ext
                    break
    return out
