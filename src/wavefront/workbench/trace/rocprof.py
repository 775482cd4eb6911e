"""rocprofv3 CSV traces (``rocprofv3 --kernel-trace --memory-copy-trace --hip-trace --marker-trace``, or
``--runtime-trace``/``--sys-trace``) read into the same :class:`Trace` columns as a torch.profiler trace, so
the breakdown, kernel table, launch statistics, multi-rank and diff analyses apply.

Format followed: the CSV files rocprofv3 (rocprofiler-sdk) writes in ROCm 6.2 to 6.4, as its "Using
rocprofv3" guide shows them. One process (one rank) writes one file per trace kind, all named
``<prefix><kind>.csv`` (the prefix is ``<pid>_`` by default, under ``<hostname>/``). Read (``csv``, times as
the integer nanoseconds written):

- ``kernel_trace.csv`` (required): ``Kind``, ``Agent_Id``, ``Queue_Id``, ``Kernel_Name`` (demangled unless
  rocprofv3 ran with ``-M``), ``Correlation_Id``, ``Start_Timestamp``, ``End_Timestamp``; ``Stream_Id``
  (ROCm 6.3 and later) is the stream, else the queue is. The HIP runtime's blit kernels
  (``__amd_rocclr_fillBuffer*``, ``__amd_rocclr_copyBuffer*``: how hipMemset and device copies run) count
  as memset / memcpy work under their own names;
- ``memory_copy_trace.csv`` (optional): ``Kind``, ``Direction``, ``Source_Agent_Id``,
  ``Destination_Agent_Id``, ``Correlation_Id``, the two timestamps, ``Stream_Id`` when written -> memcpy
  named "Memcpy HtoD (Host -> Device)" and so on;
- ``hip_api_trace.csv`` (optional): ``Domain``, ``Function``, ``Thread_Id``, ``Correlation_Id``, the two
  timestamps -> runtime calls (a dispatch links to its launch by ``Correlation_Id``);
- ``marker_api_trace.csv`` (optional): the same columns, ROCTx ranges -> host ranges, read by the rules of
  :mod:`~wavefront.workbench.trace.vendor` (``ProfilerStep#N`` or ``--step-pattern`` names the steps;
  ``aten::``/``nccl:`` names are operators); a row whose end equals its start is a mark, not a range;
- ``agent_info.csv`` (optional): the first ``Agent_Type`` GPU's ``Product_Name`` -> the device name the
  roofline looks up.

RCCL kernels (``ncclDevKernel_*``, ``ncclKernel_*``) are communication by their names, as on the
torch.profiler path. Device ids are the agent numbers as written ("Agent 2" -> 2), not HIP ordinals.
A file whose header lacks a column above is refused with :class:`~wavefront.workbench.trace.errors.TraceLoadError`
naming the file and the columns; nothing is guessed. Not read: ``--output-format json``/``pftrace``/``rocpd``
outputs, HSA API, RCCL API (``rccl_api_trace.csv``), scratch and allocation traces, counter collection.
"""

from __future__ import annotations

import csv
import gc
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from wavefront.workbench.trace import vendor
from wavefront.workbench.trace.errors import TraceLoadError
from wavefront.workbench.trace.events import COLUMNS, DTYPES, Parts, finish, int_id
from wavefront.workbench.trace.model import KIND_KERNEL, KIND_MEMCPY, KIND_MEMSET, Trace

SCHEMA = "rocprofv3 CSV trace (ROCm 6.2-6.4)"
KERNEL, MEMCPY, HIP_API, MARKER, AGENTS = ("kernel_trace", "memory_copy_trace", "hip_api_trace", "marker_api_trace",
                                           "agent_info")
TRACE_KINDS = (KERNEL, MEMCPY, HIP_API, MARKER)
TIMES = ("Start_Timestamp", "End_Timestamp")
REQUIRED = {
    KERNEL: ("Kind", "Agent_Id", "Queue_Id", "Kernel_Name", "Correlation_Id", *TIMES),
    MEMCPY: ("Kind", "Direction", "Source_Agent_Id", "Destination_Agent_Id", "Correlation_Id", *TIMES),
    HIP_API: ("Domain", "Function", "Thread_Id", "Correlation_Id", *TIMES),
    MARKER: ("Domain", "Function", "Thread_Id", *TIMES),
}
DIRECTIONS = {"MEMORY_COPY_HOST_TO_DEVICE": ("HtoD", "Host", "Device"),
              "MEMORY_COPY_DEVICE_TO_HOST": ("DtoH", "Device", "Host"),
              "MEMORY_COPY_DEVICE_TO_DEVICE": ("DtoD", "Device", "Device"),
              "MEMORY_COPY_HOST_TO_HOST": ("HtoH", "Host", "Host")}
BLIT_KINDS = ((re.compile(r"^__amd_rocclr_fillBuffer"), KIND_MEMSET), (re.compile(r"^__amd_rocclr_copy"), KIND_MEMCPY))
_SNIFF_BYTES = 1 << 16


def _header(path: Path) -> list[str] | None:
    """The first CSV line's fields when the file starts like a rocprofv3 CSV (a header naming
    ``Start_Timestamp`` or starting with ``"Kind"``/``"Domain"``), else None."""
    with open(path, "rb") as f:
        head = f.read(_SNIFF_BYTES)
    line = head.split(b"\n", 1)[0].rstrip(b"\r")
    if not (b"Start_Timestamp" in line or line.startswith((b'"Kind"', b'"Domain"'))):
        return None
    try:
        return next(csv.reader([line.decode("utf-8")]))
    except (UnicodeDecodeError, StopIteration, csv.Error):
        return None


def sniff(path: str | Path) -> str | None:
    """The trace kind of a rocprofv3 CSV from its header (and, for the API traces, which share one header,
    the first row's ``Domain``, else the file name); None when the file does not look like one."""
    path = Path(path)
    header = _header(path)
    if header is None:
        return None
    cols = set(header)
    if "Kernel_Name" in cols:
        return KERNEL
    if "Direction" in cols:
        return MEMCPY
    if "Function" in cols:
        with open(path, newline="", encoding="utf-8", errors="replace") as f:
            rows = csv.reader(f)
            next(rows, None)
            first = next(rows, None)
        domain = first[header.index("Domain")] if first and "Domain" in cols and len(first) == len(header) else ""
        if domain.startswith("MARKER") or (not domain and path.name.endswith(f"{MARKER}.csv")):
            return MARKER
        if domain.startswith("HIP") or (not domain and path.name.endswith(f"{HIP_API}.csv")):
            return HIP_API
        return f"other:{domain or path.name}"  # an HSA/RCCL/... API trace: not read
    # a kernel trace missing Kernel_Name is refused naming the columns; scratch/allocation traces are not read
    return KERNEL if path.name.endswith(f"{KERNEL}.csv") else f"other:{path.name}"


def siblings(path: Path, kind: str) -> dict[str, Path]:
    """The files of the same process as ``path`` (a ``kind`` trace): ``<prefix><kind>.csv`` beside it."""
    suffix = f"{kind}.csv"
    if not path.name.endswith(suffix):
        return {kind: path}  # renamed: the file stands alone
    prefix = path.name[:-len(suffix)]
    found = {k: path.with_name(f"{prefix}{k}.csv") for k in (*TRACE_KINDS, AGENTS)}
    found = {k: p for k, p in found.items() if p.is_file()}
    found[kind] = path
    return found


def group_paths(paths: Sequence[str | Path]) -> list[Path]:
    """One path per rank: the rocprofv3 CSVs of one process (same directory and prefix) collapse into
    their kernel trace; other files pass through. A rocprofv3 trace without its kernel trace beside it
    raises :class:`TraceLoadError`; API traces of other domains (HSA, RCCL) are left out."""
    out: list[Path] = []
    seen: set[Path] = set()
    for item in paths:
        p = Path(item)
        kind = sniff(p) if p.is_file() else None
        if kind is None:
            out.append(p)
            continue
        if kind.startswith("other:"):
            continue
        kernel = siblings(p, kind).get(KERNEL)
        if kernel is None:
            raise TraceLoadError(f"{p}: a rocprofv3 {kind}.csv is read with the process's kernel trace; expected "
                                 f"{p.name[:-len(kind + '.csv')]}{KERNEL}.csv beside it")
        if kernel.resolve() not in seen:
            seen.add(kernel.resolve())
            out.append(kernel)
    return out


class _Table:
    """The well-formed rows of one trace CSV as columns of text (a row of another width is counted, not read)."""

    def __init__(self, path: Path, kind: str):
        self.path = path
        with open(path, newline="", encoding="utf-8", errors="replace") as f:
            reader = csv.reader(f)
            self.header: list[str] = next(reader, [])
            missing = [c for c in REQUIRED[kind] if c not in self.header]
            if missing:
                raise TraceLoadError(f"{path}: not a {SCHEMA} {kind}.csv: missing column(s) {', '.join(missing)} "
                                     f"(expected {', '.join(REQUIRED[kind])})")
            gc_was_enabled = gc.isenabled()
            gc.disable()  # a list per row: collection passes would dominate the read
            try:
                rows = list(reader)
                width = len(self.header)
                good = [r for r in rows if len(r) == width]
                columns = zip(*good, strict=True) if good else iter(())
                self.cols = {name: np.array(col, dtype=object) for name, col in zip(self.header, columns,
                                                                                     strict=False)}
            except csv.Error as exc:
                raise TraceLoadError(f"{path}: not a readable {SCHEMA} ({exc})") from None
            finally:
                if gc_was_enabled:
                    gc.enable()
        self.n_rows, self.n_bad, self.n = len(rows), len(rows) - len(good), len(good)

    def text(self, name: str) -> np.ndarray:
        return self.cols.get(name, np.zeros(0, dtype=object)) if self.n else np.zeros(0, dtype=object)

    def ints(self, *names: str) -> np.ndarray:
        """The columns as an (n, len(names)) int64 matrix; a value that is not an integer is refused."""
        try:
            return np.stack([np.array(self.text(c).tolist(), dtype=np.int64) for c in names], axis=1) if self.n \
                else np.zeros((0, len(names)), dtype=np.int64)
        except ValueError as exc:
            raise TraceLoadError(f"{self.path}: not a readable {SCHEMA}: a time or id is not an integer ({exc})"
                                 ) from None

    def ids(self, name: str) -> np.ndarray:
        """Ids written as text ("Agent 2", 7) as integers, each distinct value parsed once."""
        uniq, inverse = np.unique(self.text(name).astype(str), return_inverse=True)
        return np.array([int_id(u) for u in uniq.tolist()], dtype=np.int64)[inverse.reshape(-1)] if self.n else \
            np.zeros(0, dtype=np.int64)

    def take(self, keep: np.ndarray) -> None:
        self.cols = {k: v[keep] for k, v in self.cols.items()}
        self.n = int(np.count_nonzero(keep))


def _labels(names: vendor.Names, values: np.ndarray, label: Callable[[str], str] = str) -> np.ndarray:
    """Interned name per row, ``label`` applied once per distinct value."""
    uniq, inverse = np.unique(values.astype(str), return_inverse=True)
    table = np.array([names.intern(label(u)) for u in uniq.tolist()], dtype=np.int32)
    return table[inverse.reshape(-1)] if len(values) else np.zeros(0, dtype=np.int32)


def _device_name(path: Path) -> str | None:
    with open(path, newline="", encoding="utf-8", errors="replace") as f:
        for row in csv.DictReader(f):
            if row.get("Agent_Type") == "GPU" and (row.get("Product_Name") or row.get("Name")):
                return row.get("Product_Name") or row.get("Name")
    return None


def load_rocprof(path: str | Path, *, step_pattern: str = vendor.DEFAULT_STEP_PATTERN) -> Trace:
    """One process's rocprofv3 CSV trace as a :class:`Trace`: ``path`` is any of its trace files (the
    others are found beside it by name); times are the integer nanoseconds written."""
    path = Path(path)
    kind = sniff(path)
    if kind is None or kind.startswith("other:"):
        raise TraceLoadError(f"{path}: not a {SCHEMA}: expected a kernel_trace.csv header naming "
                             f"{', '.join(REQUIRED[KERNEL])}")
    files = siblings(path, kind)
    if KERNEL not in files:
        raise TraceLoadError(f"{path}: a rocprofv3 {kind}.csv is read with the process's kernel trace, "
                             "which is not beside it")
    names = vendor.Names()
    step = re.compile(step_pattern)
    n_events = n_bad = 0

    t = _Table(files[KERNEL], KERNEL)
    n_events, n_bad = n_events + t.n_rows, n_bad + t.n_bad
    t.take(t.text("Kind") == "KERNEL_DISPATCH")
    ints = t.ints("Start_Timestamp", "End_Timestamp", "Correlation_Id")
    names_in = t.text("Kernel_Name")
    kind_of = {n: next((k for pattern, k in BLIT_KINDS if pattern.match(n)), KIND_KERNEL)
               for n in np.unique(names_in.astype(str)).tolist()}
    kinds = np.array([kind_of[n] for n in names_in.tolist()], dtype=np.int8)
    stream = "Stream_Id" if "Stream_Id" in t.header else "Queue_Id"  # ROCm 6.3+ / 6.2
    pieces = [vendor.device_rows(kinds, ints[:, 0], ints[:, 1], _labels(names, names_in), t.ids("Agent_Id"),
                                 t.ids(stream), ints[:, 2])]
    if MEMCPY in files:
        t = _Table(files[MEMCPY], MEMCPY)
        n_events, n_bad = n_events + t.n_rows, n_bad + t.n_bad
        ints = t.ints("Start_Timestamp", "End_Timestamp", "Correlation_Id")
        direction = t.text("Direction").astype(str)
        to_device = np.isin(direction, [d for d, (_, _, dst) in DIRECTIONS.items() if dst == "Device"])
        agents = np.where(to_device, t.ids("Destination_Agent_Id"), t.ids("Source_Agent_Id"))
        streams = t.ids("Stream_Id") if "Stream_Id" in t.header else np.zeros(t.n, dtype=np.int64)

        def memcpy_name(d: str) -> str:
            short, src, dst = DIRECTIONS.get(d, ("Unknown", "Unknown", "Unknown"))
            return f"Memcpy {short} ({src} -> {dst})"

        pieces.append(vendor.device_rows(np.full(t.n, KIND_MEMCPY), ints[:, 0], ints[:, 1],
                                         _labels(names, direction, memcpy_name), agents, streams, ints[:, 2]))
    dev = {k: np.concatenate([p[k] for p in pieces]).astype(DTYPES.get(k, np.int64)) for k in COLUMNS["dev"]}

    cpu, op_ranges = vendor.empty("cpu"), vendor.OpRanges()
    if MARKER in files:
        t = _Table(files[MARKER], MARKER)
        n_events, n_bad = n_events + t.n_rows, n_bad + t.n_bad
        times = t.ints("Start_Timestamp", "End_Timestamp", "Thread_Id")
        order = np.argsort(times[:, 0], kind="stable")
        order = order[(times[:, 1] > times[:, 0])[order]]  # a mark (end == start) is no range
        cpu, op_ranges = vendor.host_ranges(times[order], t.text("Function")[order].astype(str).tolist(), step, names)

    rt = vendor.empty("rt")
    if HIP_API in files:
        t = _Table(files[HIP_API], HIP_API)
        n_events, n_bad = n_events + t.n_rows, n_bad + t.n_bad
        ints = t.ints("Start_Timestamp", "End_Timestamp", "Thread_Id", "Correlation_Id")
        order = np.argsort(ints[:, 0], kind="stable")
        ints = ints[order]
        rt = {"ts_ns": ints[:, 0], "dur_ns": ints[:, 1] - ints[:, 0], "name": _labels(names, t.text("Function")[order]),
              "tid": ints[:, 2], "correlation": ints[:, 3],
              "external_id": vendor.enclosing(op_ranges, ints[:, 0], ints[:, 1], ints[:, 2])}

    parts = Parts()
    parts.names = names.names
    parts.tables = {"dev": dev, "rt": rt, "cpu": cpu, "flow": vendor.empty("flow")}
    parts.n_events, parts.n_malformed = n_events, n_bad
    meta: dict[str, Any] = {"source": "rocprofv3", "schema": SCHEMA,
                            "files": {k: p.name for k, p in sorted(files.items())}}
    if AGENTS in files and (gpu := _device_name(files[AGENTS])):
        meta["deviceProperties"] = [{"id": 0, "name": gpu}]
    nbytes = sum(p.stat().st_size for p in files.values())
    return finish(parts, path, meta, [], True, nbytes)
