"""Nsight Systems SQLite exports (``nsys export --type sqlite``) read into the same :class:`Trace` columns as
a torch.profiler trace, so the breakdown, kernel table, launch statistics and multi-rank analyses apply.

Schema followed: the export schema Nsight Systems documents for its 2024.x and 2025.x releases (the
"SQLite Schema Reference" of the user guide). Read (stdlib ``sqlite3``, times as the integers stored):

- ``CUPTI_ACTIVITY_KIND_KERNEL``: ``start``, ``end``, ``deviceId``, ``streamId``, ``correlationId`` and the
  kernel name through ``StringIds`` (``demangledName``, else ``shortName``) -> device kernels;
- ``CUPTI_ACTIVITY_KIND_MEMCPY`` / ``CUPTI_ACTIVITY_KIND_MEMSET`` (optional): ``start``, ``end``,
  ``deviceId``, ``streamId``, ``correlationId``, ``copyKind`` (and ``srcKind``, ``dstKind``, ``memKind``
  when present) -> memcpy / memset, named as torch.profiler names them ("Memcpy HtoD (Pageable -> Device)",
  "Memset (Device)");
- ``CUPTI_ACTIVITY_KIND_RUNTIME`` (optional): CUDA runtime/driver calls, ``start``, ``end``, ``globalTid``,
  ``correlationId``, ``nameId`` -> runtime calls (a device event links to its launch by ``correlationId``);
- ``NVTX_EVENTS`` (optional): push/pop (``eventType`` 59) and start/end (60) ranges with ``text`` or
  ``textId`` -> host ranges (the codes read by name from ``ENUM_NSYS_EVENT_TYPE`` when the export has it;
  ranges in NCCL's own domain, ``domainId`` of the ``NvtxDomainCreate`` event named "NCCL", are collectives).
  A range whose name is a step (``ProfilerStep#N`` by default) becomes a step;
  a range named like an operator (``aten::mm``, ``c10d::allreduce_``, ``nccl:all_reduce``: what
  ``torch.autograd.profiler.emit_nvtx`` writes) is a host operator, any other range an annotation; each
  runtime call takes the innermost non-step range enclosing it on its thread as its launching op (the
  role torch.profiler's External id plays), so a kernel launched inside an ``nccl:*`` range classifies as
  communication, and one launched directly inside an annotation falls to the stream and name rules.
- ``StringIds`` (``id``, ``value``): the string table;
- ``TARGET_INFO_GPU`` (optional): ``id``, ``name`` -> the device name the roofline looks up.

An export without ``CUPTI_ACTIVITY_KIND_KERNEL``, ``StringIds`` or one of the columns above is refused with
:class:`~wavefront.workbench.trace.errors.TraceLoadError` naming the file and what is missing; nothing is guessed.
Not read yet: OS runtime, CUDA graph node ids, GPU metrics, NVTX payloads and domains other than NCCL's.
"""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np

from wavefront.workbench.trace.errors import TraceLoadError
from wavefront.workbench.trace.events import COLUMNS, DTYPES, Parts, finish
from wavefront.workbench.trace.model import (
    CAT_CPU_OP,
    CAT_USER_ANNOTATION,
    KIND_KERNEL,
    KIND_MEMCPY,
    KIND_MEMSET,
    Trace,
)
from wavefront.workbench.trace.vendor import (
    DEFAULT_STEP_PATTERN,
    Names,
    OpRanges,
    device_rows,
    empty,
    enclosing,
    host_ranges,
)

SQLITE_MAGIC = b"SQLite format 3\x00"
_API_VERSION = re.compile(r"_v\d{4,}$")
SCHEMA = "Nsight Systems SQLite export (2024.x/2025.x schema)"
# NVTX_EVENTS.eventType codes of the schema reference's NVTX_EVENT_TYPES list (33 NvtxCategory, 34 NvtxMark,
# 39 NvtxThread, 59 NvtxPushPopRange, 60 NvtxStartEndRange, 75 NvtxDomainCreate, 76 NvtxDomainDestroy); an export
# that carries ENUM_NSYS_EVENT_TYPE (id, name) is read by those names instead, and one whose enum names
# neither range type is refused.
NVTX_PUSH_POP, NVTX_START_END, NVTX_DOMAIN_CREATE = 59, 60, 75
NVTX_RANGE_NAMES = ("NvtxPushPopRange", "NvtxStartEndRange")
NCCL_DOMAIN = "NCCL"
# CUPTI_ActivityMemcpyKind, as stored in copyKind.
COPY_KINDS = {1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA", 8: "DtoD", 9: "HtoH",
              10: "PtoP"}
# CUPTI_ActivityMemoryKind, as stored in srcKind / dstKind / memKind.
MEMORY_KINDS = ("Unknown", "Pageable", "Pinned", "Device", "Array", "Managed", "Device Static", "Managed Static")
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
        raise TraceLoadError(f"{path}: not an {SCHEMA} with CUDA trace: missing " + ", ".join(problems))


def load_nsys(path: str | Path, *, step_pattern: str = DEFAULT_STEP_PATTERN) -> Trace:
    """One rank's Nsight Systems SQLite export as a :class:`Trace` (times: the export's integer ns)."""
    path = Path(path)
    try:
        db = sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True)  # read-only; as_uri escapes '#', '?'
    except sqlite3.Error as exc:
        raise TraceLoadError(f"{path}: cannot open the SQLite file ({exc})") from None
    try:
        have = _columns(db)
        _check_schema(path, have)
        parts = _read(db, have, re.compile(step_pattern), path)
        meta: dict[str, Any] = {"source": "nsys", "schema": SCHEMA}
        if {"id", "name"} <= have.get("TARGET_INFO_GPU", set()):  # the GPU names, for the roofline's device row
            meta["deviceProperties"] = [{"id": i, "name": n} for i, n in
                                        db.execute("SELECT id, name FROM TARGET_INFO_GPU ORDER BY id")]
    except (sqlite3.Error, TypeError) as exc:  # TypeError: a NULL where the schema stores a time
        raise TraceLoadError(f"{path}: not a readable {SCHEMA} ({exc})") from None
    finally:
        db.close()
    return finish(parts, path, meta, [], True, path.stat().st_size)


def _memory(kind: int) -> str:
    return MEMORY_KINDS[kind] if 0 <= kind < len(MEMORY_KINDS) else "Unknown"


def _matrix(rows: list[tuple[Any, ...]], width: int) -> np.ndarray:
    """Rows of integers as an (n, width) int64 matrix (a NULL where a time belongs raises TypeError)."""
    return np.array(rows, dtype=np.int64).reshape(-1, width)


def _event_types(db: sqlite3.Connection, have: dict[str, set[str]], path: Path) -> tuple[tuple[int, ...], int]:
    """The eventType codes of NVTX ranges and of NvtxDomainCreate: from the export's own
    ENUM_NSYS_EVENT_TYPE when it has one, else the documented 59, 60 and 75."""
    if not {"id", "name"} <= have.get("ENUM_NSYS_EVENT_TYPE", set()):
        return (NVTX_PUSH_POP, NVTX_START_END), NVTX_DOMAIN_CREATE
    ids = {str(name): int(i) for i, name in db.execute("SELECT id, name FROM ENUM_NSYS_EVENT_TYPE")}
    ranges = tuple(ids[n] for n in NVTX_RANGE_NAMES if n in ids)
    if not ranges:
        raise TraceLoadError(f"{path}: not an {SCHEMA}: its ENUM_NSYS_EVENT_TYPE names no NVTX range type "
                             f"(expected {' or '.join(NVTX_RANGE_NAMES)})")
    return ranges, ids.get("NvtxDomainCreate", NVTX_DOMAIN_CREATE)


def _read(db: sqlite3.Connection, have: dict[str, set[str]], step: re.Pattern[str], path: Path) -> Parts:
    strings = dict(db.execute("SELECT id, value FROM StringIds"))
    names = Names()
    n_events = 0
    kernel_cols = have["CUPTI_ACTIVITY_KIND_KERNEL"]
    name_col = "demangledName" if "demangledName" in kernel_cols else "shortName"
    # One integer matrix per table (NULL ids become NO_ID); names are interned once per distinct id.
    select = 'SELECT start, "end", deviceId, streamId, COALESCE(correlationId, -1), '
    sources = [(KIND_KERNEL, f"{select}{name_col} FROM CUPTI_ACTIVITY_KIND_KERNEL",
                lambda i: strings.get(i, f"<string {i}>"))]
    if "CUPTI_ACTIVITY_KIND_MEMCPY" in have:
        # named as Kineto names them: "Memcpy HtoD (Pageable -> Device)"; the three kinds packed in one integer
        cols = have["CUPTI_ACTIVITY_KIND_MEMCPY"]
        src, dst = (f"COALESCE({c}, 0)" if c in cols else "0" for c in ("srcKind", "dstKind"))
        sources.append((KIND_MEMCPY, f"{select}copyKind * 256 + {src} * 16 + {dst} FROM CUPTI_ACTIVITY_KIND_MEMCPY",
                        lambda i: f"Memcpy {COPY_KINDS.get(i >> 8, 'Unknown')} ({_memory(i >> 4 & 15)} -> "
                                  f"{_memory(i & 15)})"))
    if "CUPTI_ACTIVITY_KIND_MEMSET" in have:
        mem = "COALESCE(memKind, 3)" if "memKind" in have["CUPTI_ACTIVITY_KIND_MEMSET"] else "3"
        sources.append((KIND_MEMSET, f"{select}{mem} FROM CUPTI_ACTIVITY_KIND_MEMSET",
                        lambda i: f"Memset ({_memory(i)})"))
    pieces: list[dict[str, np.ndarray]] = []
    for kind, sql, label in sources:
        rows = _matrix(db.execute(sql).fetchall(), 6)
        n_events += len(rows)
        pieces.append(device_rows(np.full(len(rows), kind), rows[:, 0], rows[:, 1], names.map(rows[:, 5], label),
                                  rows[:, 2], rows[:, 3], rows[:, 4]))
    dev = {k: np.concatenate([p[k] for p in pieces]).astype(DTYPES.get(k, np.int64)) for k in COLUMNS["dev"]}

    cpu, op_ranges = empty("cpu"), OpRanges()
    op_comm: dict[int, dict[str, Any]] = {}
    if "NVTX_EVENTS" in have:
        nvtx_cols = have["NVTX_EVENTS"]
        text = "e.text" if "text" in nvtx_cols else "NULL"
        by_id = "s.value" if "textId" in nvtx_cols else "NULL"
        join = "LEFT JOIN StringIds s ON s.id = e.textId" if "textId" in nvtx_cols else ""
        range_types, domain_create = _event_types(db, have, path)
        where = (f"WHERE e.eventType IN ({', '.join(map(str, range_types))}) AND e.\"end\" IS NOT NULL "
                 "ORDER BY e.start")
        domain = "COALESCE(e.domainId, 0)" if "domainId" in nvtx_cols else "0"
        times = _matrix(db.execute(f'SELECT e.start, e."end", COALESCE(e.globalTid, 0), {domain} '
                                   f"FROM NVTX_EVENTS e {where}").fetchall(), 4)
        labels = [r[0] or "" for r in db.execute(f"SELECT COALESCE({text}, {by_id}) FROM NVTX_EVENTS e {join} {where}")]
        n_events += len(times)
        cpu, op_ranges = host_ranges(times[:, :3], labels, step, names)
        # NCCL's own ranges (its NVTX domain "NCCL": ncclAllReduce, ...) are collectives: operators whose
        # kernels are communication, the range name their collective's name
        nccl = [] if "domainId" not in nvtx_cols else [int(r[0]) for r in db.execute(
            f"SELECT e.domainId FROM NVTX_EVENTS e {join} WHERE e.eventType = {domain_create} "
            f"AND COALESCE({text}, {by_id}) = '{NCCL_DOMAIN}'")]
        in_nccl = np.isin(times[:, 3], nccl) & (cpu["cat"] == CAT_USER_ANNOTATION) if nccl else []
        for row in np.flatnonzero(in_nccl).tolist():
            cpu["cat"][row] = CAT_CPU_OP
            op_comm[int(cpu["external_id"][row])] = {"Collective name": labels[row]}

    rt = empty("rt")
    if "CUPTI_ACTIVITY_KIND_RUNTIME" in have:
        sql = ('SELECT start, "end", COALESCE(globalTid, 0), COALESCE(correlationId, -1), nameId '
               "FROM CUPTI_ACTIVITY_KIND_RUNTIME ORDER BY start")
        rows = _matrix(db.execute(sql).fetchall(), 5)
        n_events += len(rows)
        # nsys appends the API's version to its name (cudaLaunchKernel_v7000); torch.profiler does not
        api = names.map(rows[:, 4], lambda i: _API_VERSION.sub("", strings.get(i, f"<string {i}>")))
        rt = {"ts_ns": rows[:, 0], "dur_ns": rows[:, 1] - rows[:, 0], "name": api, "tid": rows[:, 2],
              "correlation": rows[:, 3], "external_id": enclosing(op_ranges, rows[:, 0], rows[:, 1], rows[:, 2])}

    parts = Parts()
    parts.names = names.names
    parts.tables = {"dev": dev, "rt": rt, "cpu": cpu, "flow": empty("flow")}
    parts.op_comm = op_comm
    parts.n_events = n_events
    return parts
