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

import numpy as np

from wavefront.workbench.trace.flops import SHAPED_OPS
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

CHUNK_BYTES = 8 << 20
# A single event larger than this is treated as corruption rather than read on forever.
MAX_EVENT_CHARS = 64 << 20

DEVICE_CATS = {"kernel": KIND_KERNEL, "Kernel": KIND_KERNEL, "gpu_memcpy": KIND_MEMCPY, "Memcpy": KIND_MEMCPY,
               "gpu_memset": KIND_MEMSET, "Memset": KIND_MEMSET}
RUNTIME_CATS = {"cuda_runtime", "cuda_driver", "Runtime", "hip_runtime", "hip_driver", "privateuse1_runtime",
                "privateuse1_driver"}
CPU_CATS = {"cpu_op": CAT_CPU_OP, "Operator": CAT_CPU_OP, "user_annotation": CAT_USER_ANNOTATION}
SYNC_CATS = {"cuda_sync"}
COMM_ARG_KEYS = ("Collective name", "Process Group Name", "Process Group Description", "Process Group Ranks",
                 "In msg nelems", "Out msg nelems", "Group size", "dtype", "Seq", "Rank")

_WS = re.compile(r"[ \t\n\r]*")
_WS_COMMA = re.compile(r"[ \t\n\r,]*")


class TraceLoadError(ValueError):
    """The file is not a readable trace at all (no events could be recovered)."""


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

    def skip(self, pattern=_WS) -> str:
        """Skip whitespace; return the next character ('' at end of input)."""
        while True:
            self.pos = pattern.match(self.buf, self.pos).end()
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self.more():
                return ""

    def value(self, decode):
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
    """Accumulates the kept fields of each event into typed arrays."""

    def __init__(self):
        self.names: list[str] = []
        self.name_ids: dict[str, int] = {}
        self.dev = {k: array(t) for k, t in (("ts", "d"), ("dur", "d"), ("kind", "b"), ("name", "i"),
                                             ("device", "i"), ("stream", "q"), ("correlation", "q"),
                                             ("external_id", "q"), ("has_coll", "b"), ("pid", "q"), ("tid", "q"))}
        self.rt = {k: array(t) for k, t in (("ts", "d"), ("dur", "d"), ("name", "i"), ("tid", "q"),
                                            ("correlation", "q"), ("external_id", "q"))}
        self.cpu = {k: array(t) for k, t in (("ts", "d"), ("dur", "d"), ("name", "i"), ("tid", "q"),
                                             ("cat", "b"), ("external_id", "q"), ("shape", "i"))}
        self.flow = {k: array(t) for k, t in (("pid", "q"), ("tid", "q"), ("ts", "d"), ("id", "q"))}
        self.shapes: list[OpShapes] = []
        self.shape_ids: dict[str, int] = {}
        self.op_comm: dict[int, dict] = {}
        self.kernel_comm: dict[int, dict] = {}
        self.n_sync = 0
        self.n_events = 0
        self.n_malformed = 0
        self.meta_events: dict[str, dict] = {}

    def intern(self, name) -> int:
        nid = self.name_ids.get(name)
        if nid is None:
            name = str(name)
            nid = self.name_ids[name] = len(self.names)
            self.names.append(name)
        return nid


def _int_id(value) -> int:
    """Ids are usually ints; strings ("stream 7", "Spans") are hashed to a stable non-negative int."""
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if value is None:
        return NO_ID
    text = str(value)
    digits = re.sub(r"\D", "", text)
    return int(digits) if digits and len(digits) < 18 else zlib.crc32(text.encode()) + (1 << 40)


def _add_events(reader: _Reader, b: _Builder, raw_sink: Callable[[str], None] | None = None) -> None:
    """Decode the traceEvents array at the cursor (just after '['); ``raw_sink`` receives each event's
    text as written (to copy the trace)."""
    decode = json.JSONDecoder().raw_decode
    ws_comma = _WS_COMMA.match
    dev, rt, cpu, flow = b.dev, b.rt, b.cpu, b.flow
    intern = b.intern
    shaped_ops = SHAPED_OPS

    def handle(e) -> None:
        b.n_events += 1
        if not isinstance(e, dict):
            b.n_malformed += 1
            return
        try:
            ph = e.get("ph")
            if ph == "X":
                cat = e.get("cat")
                kind = DEVICE_CATS.get(cat)
                args = e.get("args") or {}
                if kind is not None:
                    dev["ts"].append(e["ts"])
                    dev["dur"].append(e.get("dur", 0.0))
                    dev["kind"].append(kind)
                    dev["name"].append(intern(e.get("name", "")))
                    dev["device"].append(_int_id(args.get("device", e.get("pid"))))
                    dev["stream"].append(_int_id(args.get("stream", e.get("tid"))))
                    corr = args.get("correlation", NO_ID)
                    dev["correlation"].append(corr)
                    dev["external_id"].append(args.get("External id", NO_ID))
                    coll = "Collective name" in args
                    dev["has_coll"].append(coll)
                    dev["pid"].append(_int_id(e.get("pid")))
                    dev["tid"].append(_int_id(e.get("tid")))
                    if coll and corr != NO_ID:
                        b.kernel_comm[corr] = {k: args[k] for k in COMM_ARG_KEYS if k in args}
                elif cat in RUNTIME_CATS:
                    rt["ts"].append(e["ts"])
                    rt["dur"].append(e.get("dur", 0.0))
                    rt["name"].append(intern(e.get("name", "")))
                    rt["tid"].append(_int_id(e.get("tid")))
                    rt["correlation"].append(args.get("correlation", NO_ID))
                    rt["external_id"].append(args.get("External id", NO_ID))
                elif cat in CPU_CATS:
                    name = e.get("name", "")
                    ext = args.get("External id", NO_ID)
                    cpu["ts"].append(e["ts"])
                    cpu["dur"].append(e.get("dur", 0.0))
                    cpu["name"].append(intern(name))
                    cpu["tid"].append(_int_id(e.get("tid")))
                    cpu["cat"].append(CPU_CATS[cat])
                    cpu["external_id"].append(ext)
                    shape = NO_ID
                    if args:
                        if name in shaped_ops and "Input Dims" in args:
                            # one copy per distinct (dims, types): a training loop repeats a few hundred shapes
                            dims, types = args["Input Dims"], args.get("Input type") or []
                            key = f"{dims}{types}"
                            shape = b.shape_ids.get(key, NO_ID)
                            if shape == NO_ID:
                                shape = b.shape_ids[key] = len(b.shapes)
                                b.shapes.append(OpShapes(dims, types, args.get("Concrete Inputs")))
                        if "Collective name" in args:
                            b.op_comm[ext] = {k: args[k] for k in COMM_ARG_KEYS if k in args}
                    cpu["shape"].append(shape)
                elif cat in SYNC_CATS:
                    b.n_sync += 1
            elif ph == "f" and e.get("cat") == "ac2g":
                flow["pid"].append(_int_id(e.get("pid")))
                flow["tid"].append(_int_id(e.get("tid")))
                flow["ts"].append(e["ts"])
                flow["id"].append(_int_id(e.get("id")))
            elif ph == "M":
                name = e.get("name")
                if name in ("process_name", "process_labels", "thread_name"):
                    key = f"{name}:{e.get('pid')}:{e.get('tid')}"
                    b.meta_events[key] = e.get("args") or {}
        except (TypeError, ValueError, KeyError, OverflowError):
            b.n_malformed += 1
            _truncate_to_common_length(b)

    while True:
        # Fast path: the complete events already in the buffer, without method calls per event.
        buf, pos = reader.buf, reader.pos
        n = len(buf)
        while True:
            pos = ws_comma(buf, pos).end()
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


def _truncate_to_common_length(b: _Builder) -> None:
    """A malformed event may have appended some columns and not others; drop the partial row."""
    for table in (b.dev, b.rt, b.cpu, b.flow):
        n = min(len(v) for v in table.values())
        for v in table.values():
            del v[n:]


def _finish(b: _Builder, path: Path, meta: dict, warnings: list[str], complete: bool, nbytes: int) -> Trace:
    def cols(table: dict[str, array]) -> Columns:
        out = {k: np.frombuffer(v, dtype=v.typecode if v.typecode != "b" else np.int8).copy()
               if len(v) else np.zeros(0, dtype=v.typecode if v.typecode != "b" else np.int8)
               for k, v in table.items()}
        # Kineto writes microseconds with three decimals: integer nanoseconds make every sum exact.
        out["ts_ns"] = np.rint(out.pop("ts") * 1000.0).astype(np.int64)
        if "dur" in out:
            out["dur_ns"] = np.maximum(np.rint(out.pop("dur") * 1000.0), 0).astype(np.int64)
        order = np.argsort(out["ts_ns"], kind="stable")
        return Columns({k: v[order] for k, v in out.items()})

    device, runtime, cpu, flow = cols(b.dev), cols(b.rt), cols(b.cpu), cols(b.flow)
    _link_flows(device, flow)
    device.cols.pop("pid")
    device.cols.pop("tid")
    if b.n_malformed:
        warnings.append(f"{b.n_malformed} malformed event(s) skipped")
    meta = dict(meta)
    meta["n_flow_links"] = len(flow)
    meta["thread_labels"] = b.meta_events
    return Trace(path=str(path), names=b.names, device=device, runtime=runtime, cpu=cpu, shapes=b.shapes,
                 op_comm_args=b.op_comm, kernel_comm_args=b.kernel_comm, n_sync_events=b.n_sync,
                 n_events=b.n_events, meta=meta, warnings=warnings, complete=complete, bytes_read=nbytes)


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


def load_trace(path: str | Path, *, progress: Callable[[int, int], None] | None = None,
               raw_sink: Callable[[str], None] | None = None) -> Trace:
    """Load one rank's trace. ``progress(bytes_done, bytes_total)`` is called after each chunk;
    ``raw_sink(text)`` receives every event's JSON text as written (used to copy the trace).

    Raises FileNotFoundError for a missing file and :class:`TraceLoadError` when nothing usable is in
    it; otherwise returns the trace, with ``complete=False`` and a warning when the file is damaged.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"trace file not found: {path}")
    reader = _Reader(path, progress)
    b = _Builder()
    meta: dict = {}
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
        if b.n_events == b.n_malformed and not meta:
            raise TraceLoadError(f"{path}: {reason} {where}; no events could be read") from None
        warnings.append(f"{reason} {where}: the analysis covers the {b.n_events:,} events read before it")
    finally:
        if gc_was_enabled:
            gc.enable()
        nbytes = reader.raw.tell()
        reader.close()
    if reader.damage and complete:
        complete = False
        warnings.append(reader.damage)
    if not saw_events and complete:
        raise TraceLoadError(f"{path}: no 'traceEvents' list: not a Kineto/Chrome trace")
    return _finish(b, path, meta, warnings, complete, nbytes)
