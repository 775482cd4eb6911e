"""Streaming loader for Kineto / Chrome JSON traces (plain or gzip), as torch.profiler writes them.

The file is read in chunks and decoded one event at a time with the C JSON scanner
(``json.JSONDecoder.raw_decode``), so memory holds one chunk plus the compact columns of
:mod:`wavefront.workbench.trace.model`, never the whole document or a dict per event. Top-level keys may
come in any order; the "JSON array" form (the whole file is the event list) is accepted too.

Bad input never raises past what was read: a truncated or corrupt file yields the events before the
damage, ``complete=False`` and a warning naming the byte offset. Only a file with nothing usable (not
JSON, not a trace) raises :class:`TraceLoadError`.
"""

from __future__ import annotations

import codecs
import gc
import gzip
import json
import os
import re
import zlib
from array import array
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from wavefront.workbench.trace import decode, nsys, rocprof
from wavefront.workbench.trace.clock import ClockValueError, value_to_ns
from wavefront.workbench.trace.errors import TraceLoadError as TraceLoadError  # re-exported: the readers raise it
from wavefront.workbench.trace.events import (
    COLUMNS,
    COMM_ARG_KEYS,
    CPU_CATS,
    DEVICE_CATS,
    DTYPES,
    META_NAMES,
    RUNTIME_CATS,
    SYNC_CATS,
    XLA_STEP_CAT,
    Parts,
    finish,
    int_id,
    xla_step_name,
)
from wavefront.workbench.trace.flops import SHAPED_OPS
from wavefront.workbench.trace.model import KIND_KERNEL, NO_ID, OpShapes, Trace
from wavefront.workbench.trace.vendor import DEFAULT_STEP_PATTERN

CHUNK_BYTES = 8 << 20
# A single event larger than this is treated as corruption rather than read on forever.
MAX_EVENT_CHARS = 64 << 20

_WS = re.compile(r"[ \t\n\r]*")
_WS_COMMA = re.compile(r"[ \t\n\r,]*")


class _Reader:
    """A growing text buffer over a (maybe gzip) byte stream."""

    def __init__(self, path: Path, progress: Callable[[int, int], None] | None):
        self.raw = open(path, "rb")  # noqa: SIM115 - closed in close()
        magic = self.raw.read(2)
        self.raw.seek(0)
        self.stream = gzip.GzipFile(fileobj=self.raw) if magic == b"\x1f\x8b" else self.raw
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self.total = os.path.getsize(path)
        self.progress = progress
        self.buf = ""
        self.pos = 0
        self.eof = False
        self.damage: str | None = None  # why reading stopped early (gzip damage)
        self.consumed_chars = 0
        self.last_start = 0

    def more(self) -> bool:
        """Append one chunk to the buffer (dropping what was consumed). False at end of input."""
        if self.eof:
            return False
        try:
            # read1: what is decoded so far comes back before a damaged gzip tail raises
            data = self.stream.read1(CHUNK_BYTES)
        except EOFError:
            data, self.damage = b"", "the gzip stream ends early (truncated file)"
        except (OSError, zlib.error) as exc:
            data, self.damage = b"", f"the gzip stream is corrupt ({exc})"
        text = self.decoder.decode(data, final=not data)
        self.consumed_chars += self.pos
        self.buf = self.buf[self.pos:] + text
        self.pos = 0
        if not data:
            self.eof = True
        if self.progress is not None:
            self.progress(self.raw.tell(), self.total)
        return bool(data) or bool(text)

    def skip(self, pattern: re.Pattern[str] = _WS) -> str:
        """Skip whitespace; return the next character ('' at end of input)."""
        while True:
            self.pos = pattern.match(self.buf, self.pos).end()  # type: ignore[union-attr]  # matches ""
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self.more():
                return ""

    def value(self, decode: Callable[[str, int], tuple[Any, int]]) -> Any:
        """Decode one JSON value at the cursor, reading more input until it is complete."""
        while True:
            self.last_start = self.pos
            try:
                obj, end = decode(self.buf, self.pos)
            except json.JSONDecodeError:
                if self.eof or len(self.buf) - self.pos > MAX_EVENT_CHARS:
                    raise
                self.more()
                continue
            # A number or literal that touches the end of the buffer may continue in the next chunk.
            if end >= len(self.buf) and not self.eof and self.buf[end - 1] not in '}]"':
                self.more()
                continue
            self.pos = end
            return obj

    def offset(self) -> int:
        return self.consumed_chars + self.pos

    def close(self) -> None:
        self.raw.close()


class _Builder:
    """Accumulates the kept fields of each event (times as exact integer nanoseconds) into typed arrays."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.name_ids: dict[str, int] = {}
        codes: dict[type | None, str] = {np.int8: "b", np.int32: "i"}
        self.tables = {t: {k: array(codes.get(DTYPES.get(k), "q")) for k in cols} for t, cols in COLUMNS.items()}
        self.shapes: list[OpShapes] = []
        self.shape_ids: dict[str, int] = {}
        self.parts = Parts()

    def intern(self, name: Any) -> int:
        nid = self.name_ids.get(name)
        if nid is None:
            name = str(name)
            nid = self.name_ids[name] = len(self.names)
            self.names.append(name)
        return nid

    def row(self, table: str, values: dict[str, Any]) -> None:
        """Append one row; every value is computed before any column grows, so a bad event adds nothing."""
        cols = self.tables[table]
        for k in COLUMNS[table]:
            cols[k].append(values[k])

    def to_parts(self) -> Parts:
        p = self.parts
        p.names = self.names
        p.shapes = self.shapes
        p.tables = {t: {k: np.frombuffer(v, dtype=DTYPES.get(k, np.int64)).copy() if len(v)
                        else np.zeros(0, dtype=DTYPES.get(k, np.int64)) for k, v in cols.items()}
                    for t, cols in self.tables.items()}
        return p


def _comm_args(args: dict[str, Any]) -> dict[str, Any]:
    return {k: args[k] for k in COMM_ARG_KEYS if k in args}


def _handle(b: _Builder, e: dict[str, Any]) -> None:
    """Keep what the analyses need of one decoded event (floats arrive as their text: exact clocks)."""
    p = b.parts
    p.n_events += 1
    if not isinstance(e, dict):
        p.n_malformed += 1
        return
    try:
        ph = e.get("ph")
        if ph == "X":
            cat = e.get("cat")
            kind = DEVICE_CATS.get(cat) if isinstance(cat, str) else None
            args = e.get("args") or {}
            if not isinstance(args, dict):
                raise TypeError("args")
            name = e.get("name", "")
            if cat is None and "hlo_op" in args:  # an XLA op (jax.profiler)
                kind = KIND_KERNEL
                args = {"device": args.get("device_ordinal", e.get("pid")), **args}
            elif cat is None and "step_num" in args:
                cat, name = XLA_STEP_CAT, xla_step_name(args["step_num"])
            if kind is None and cat not in RUNTIME_CATS and cat not in CPU_CATS:
                if cat in SYNC_CATS:
                    p.n_sync += 1
                return
            ts, dur = value_to_ns(e["ts"]), value_to_ns(e.get("dur", 0))
            corr = int_id(args.get("correlation", NO_ID))
            ext = int_id(args.get("External id", NO_ID))
            if kind is not None:
                coll = "Collective name" in args
                b.row("dev", {"ts_ns": ts, "dur_ns": dur, "kind": kind, "name": b.intern(name),
                              "device": int_id(args.get("device", e.get("pid"))),
                              "stream": int_id(args.get("stream", e.get("tid"))), "correlation": corr,
                              "external_id": ext, "has_coll": coll, "run_id": int_id(args.get("run_id")),
                              "pid": int_id(e.get("pid")),
                              "tid": int_id(e.get("tid"))})
                if coll and corr != NO_ID:
                    p.kernel_comm[corr] = _comm_args(args)
            elif cat in RUNTIME_CATS:
                b.row("rt", {"ts_ns": ts, "dur_ns": dur, "name": b.intern(name), "tid": int_id(e.get("tid")),
                             "correlation": corr, "external_id": ext})
            else:
                shape = NO_ID
                if name in SHAPED_OPS and "Input Dims" in args:
                    # one copy per distinct (dims, types): a training loop repeats a few hundred shapes
                    dims, types = args["Input Dims"], args.get("Input type") or []
                    key = f"{dims}{types}"
                    shape = b.shape_ids.get(key, NO_ID)
                    if shape == NO_ID:
                        shape = b.shape_ids[key] = len(b.shapes)
                        b.shapes.append(OpShapes(dims, types, args.get("Concrete Inputs")))
                if "Collective name" in args:
                    p.op_comm[ext] = _comm_args(args)
                b.row("cpu", {"ts_ns": ts, "dur_ns": dur, "name": b.intern(name), "tid": int_id(e.get("tid")),
                              "cat": CPU_CATS[str(cat)], "external_id": ext, "shape": shape})
        elif ph == "f" and e.get("cat") == "ac2g":
            b.row("flow", {"pid": int_id(e.get("pid")), "tid": int_id(e.get("tid")), "ts_ns": value_to_ns(e["ts"]),
                           "id": int_id(e.get("id"))})
        elif ph == "M":
            name = e.get("name")
            if name in META_NAMES:
                p.meta_events[f"{name}:{e.get('pid')}:{e.get('tid')}"] = e.get("args") or {}
    except (TypeError, ValueError, KeyError, OverflowError, ClockValueError):
        p.n_malformed += 1


def _add_events(reader: _Reader, b: _Builder, raw_sink: Callable[[str], None] | None = None) -> None:
    """Decode the traceEvents array at the cursor (just after '['); ``raw_sink`` receives each event's
    text as written (to copy the trace)."""
    decode = json.JSONDecoder(parse_float=str).raw_decode
    ws_comma = _WS_COMMA.match

    def handle(e: dict[str, Any]) -> None:
        _handle(b, e)

    while True:
        # Fast path: the complete events already in the buffer, without method calls per event.
        buf, pos = reader.buf, reader.pos
        n = len(buf)
        while True:
            pos = ws_comma(buf, pos).end()  # type: ignore[union-attr]  # [ws,]* always matches
            if pos >= n or buf[pos] == "]":
                break
            try:
                e, end = decode(buf, pos)
            except json.JSONDecodeError:
                break
            if raw_sink is not None:
                raw_sink(buf[pos:end])
            pos = end
            handle(e)
        reader.pos = pos
        # Slow path: the array's end, an event split across chunks, or damage.
        ch = reader.skip(_WS_COMMA)
        if ch == "]":
            reader.pos += 1
            return
        if ch == "":
            raise EOFError("the traceEvents array is not closed")
        e = reader.value(decode)
        if raw_sink is not None:
            raw_sink(reader.buf[reader.last_start:reader.pos])
        handle(e)


def load_trace(path: str | Path, *, progress: Callable[[int, int], None] | None = None,
               raw_sink: Callable[[str], None] | None = None, workers: int = 1,
               step_pattern: str | None = None) -> Trace:
    """Load one rank's trace. ``progress(bytes_done, bytes_total)`` is called as it goes;
    ``raw_sink(text)`` receives every event's JSON text as written (used to copy the trace); ``workers``
    processes read a large uncompressed file in byte ranges. A file that starts with SQLite's header is
    read as an Nsight Systems export (:mod:`wavefront.workbench.trace.nsys`), a CSV whose header is a
    rocprofv3 trace's as that process's rocprofv3 trace (:mod:`wavefront.workbench.trace.rocprof`), their
    NVTX / ROCTx ranges matching ``step_pattern`` (default ``ProfilerStep#N``) as the steps.

    The typed decoder (:mod:`wavefront.workbench.trace.decode`, needs msgspec: the ``trace`` extra) reads
    sound files; a damaged file, an unusual one, or ``raw_sink`` goes through the streaming reader here,
    which keeps what precedes the damage. Raises FileNotFoundError for a missing file and
    :class:`TraceLoadError` when nothing usable is in it (not JSON, not a trace, no events); otherwise
    returns the trace, with ``complete=False`` and a warning when the file is damaged.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"trace file not found: {path}")
    vendor = ("an Nsight Systems export" if nsys.is_sqlite(path) else
              "a rocprofv3 trace" if rocprof.sniff(path) else None)
    if vendor is not None and raw_sink is not None:
        raise TraceLoadError(f"{path}: {vendor} cannot be copied with annotations (JSON traces only)")
    if vendor is not None:
        read = nsys.load_nsys if vendor.startswith("an Nsight") else rocprof.load_rocprof
        return read(path, step_pattern=step_pattern or DEFAULT_STEP_PATTERN)
    trace = None
    if raw_sink is None:
        trace = decode.load_fast(path, progress=progress, workers=workers)
    if trace is None:
        trace = _load_streaming(path, progress, raw_sink)
    if trace.n_events == trace.n_malformed:
        what = "holds no events" if trace.n_events == 0 else f"holds no usable event ({trace.n_events:,} malformed)"
        why = "".join(f"; {w}" for w in trace.warnings if "negative duration" in w)
        raise TraceLoadError(f"{path}: the trace {what}{why}")
    return trace


def _load_streaming(path: Path, progress: Callable[[int, int], None] | None,
                    raw_sink: Callable[[str], None] | None) -> Trace:
    reader = _Reader(path, progress)
    b = _Builder()
    meta: dict[str, Any] = {}
    warnings: list[str] = []
    complete = True
    decode = json.JSONDecoder().raw_decode
    saw_events = False
    gc_was_enabled = gc.isenabled()
    gc.disable()  # millions of short-lived containers: collection passes would dominate the run time
    try:
        first = reader.skip()
        if first == "[":
            reader.pos += 1
            saw_events = True
            _add_events(reader, b, raw_sink)
        elif first == "{":
            reader.pos += 1
            while True:
                ch = reader.skip(_WS_COMMA)
                if ch == "}" or ch == "":
                    if ch == "":
                        raise EOFError("the top-level object is not closed")
                    break
                key = reader.value(decode)
                if reader.skip() != ":":
                    raise json.JSONDecodeError("expected ':'", reader.buf, reader.pos)
                reader.pos += 1
                ch = reader.skip()
                if key == "traceEvents" and ch == "[":
                    reader.pos += 1
                    saw_events = True
                    _add_events(reader, b, raw_sink)
                else:
                    meta[str(key)] = reader.value(decode)
        else:
            raise TraceLoadError(f"{path}: not a JSON trace (it starts with {reader.buf[:20]!r})")
    except (json.JSONDecodeError, EOFError) as exc:
        complete = False
        where = f"near character {reader.offset():,}"
        at_end = isinstance(exc, EOFError) or exc.pos >= len(exc.doc.rstrip()) or exc.msg.startswith("Unterminated")
        reason = reader.damage or ("the file ends early (truncated)" if reader.eof and at_end
                                   else f"corrupt JSON ({exc})")
        parts = b.parts
        if parts.n_events == parts.n_malformed:
            raise TraceLoadError(f"{path}: {reason} {where}; no events could be read") from None
        warnings.append(f"{reason} {where}: the analysis covers the {parts.n_events:,} events read before it")
    finally:
        if gc_was_enabled:
            gc.enable()
        nbytes = reader.raw.tell()
        reader.close()
    if reader.damage and complete:
        complete = False
        warnings.append(reader.damage)
    if not saw_events and complete and "rocprofiler-sdk-tool" in meta:
        raise TraceLoadError(f"{path}: a rocprofv3 --output-format json file, which is not read: run rocprofv3 with "
                             "--output-format csv and give its *_kernel_trace.csv (docs/trace.md)")
    if not saw_events and complete:
        raise TraceLoadError(f"{path}: no 'traceEvents' list: not a Kineto/Chrome trace")
    return finish(b.to_parts(), path, meta, warnings, complete, nbytes)
