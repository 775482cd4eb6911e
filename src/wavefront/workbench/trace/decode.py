"""The fast loader: typed decoding (msgspec Structs that keep only the fields the analyses read) of the
traceEvents array in byte ranges, several processes per file when the file is large and uncompressed.

A byte range of the array is cut between two events: after a ``}`` that is followed by ``,`` and ``{``
(whitespace allowed). Such a cut may fall inside an event (an argument holding a list of objects, a
string holding ``}, {``); then the range is not a list of whole JSON values, and decoding it as
``[`` + range + ``]`` fails, so a wrong cut is always detected, never silently accepted: the file is then
read by the streaming reader (:mod:`wavefront.workbench.trace.load`), as is any damaged file (truncated,
corrupt, an event of an unexpected type). ``ts`` and ``dur`` are kept as their raw text and parsed to
integer nanoseconds exactly (:mod:`wavefront.workbench.trace.clock`). Without msgspec (the ``trace``
extra) every file goes through the streaming reader.

Memory: one range at a time per process (``RANGE_BYTES``), with its decoded events, plus the columns.
"""

from __future__ import annotations

import gc
import gzip
import json
import os
import re
import zlib
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np

from wavefront.workbench.trace.clock import ClockValueError, ns_column
from wavefront.workbench.trace.events import (
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
    int_ids,
    xla_step_name,
)
from wavefront.workbench.trace.flops import SHAPED_OPS
from wavefront.workbench.trace.model import KIND_KERNEL, NO_ID, OpShapes, Trace

try:
    import msgspec
except ImportError:  # the streaming reader serves
    msgspec = None  # type: ignore[assignment]

RANGE_BYTES = 48 << 20
# A file is read in parallel byte ranges when it is uncompressed and at least this large.
PARALLEL_MIN_BYTES = 96 << 20
_CUT = re.compile(rb"\}[ \t\r\n]*,[ \t\r\n]*\{")
_HEAD_BYTES = 4 << 20  # the keys before traceEvents (deviceProperties, distributedInfo) fit in this


class FastPathFailed(Exception):
    """This file is for the streaming reader (damaged, unusual, or a cut fell inside an event)."""


if msgspec is not None:
    _NONE = msgspec.Raw()

    class _Args(msgspec.Struct, gc=False):
        device: Any = None
        stream: Any = None
        correlation: Any = None
        external_id: Any = msgspec.field(default=None, name="External id")
        dims: msgspec.Raw = msgspec.field(default=_NONE, name="Input Dims")
        types: msgspec.Raw = msgspec.field(default=_NONE, name="Input type")
        concrete: msgspec.Raw = msgspec.field(default=_NONE, name="Concrete Inputs")
        coll: msgspec.Raw = msgspec.field(default=_NONE, name="Collective name")
        pg_name: msgspec.Raw = msgspec.field(default=_NONE, name="Process Group Name")
        pg_desc: msgspec.Raw = msgspec.field(default=_NONE, name="Process Group Description")
        pg_ranks: msgspec.Raw = msgspec.field(default=_NONE, name="Process Group Ranks")
        pg_id: msgspec.Raw = msgspec.field(default=_NONE, name="pg_id")
        in_nelems: msgspec.Raw = msgspec.field(default=_NONE, name="In msg nelems")
        out_nelems: msgspec.Raw = msgspec.field(default=_NONE, name="Out msg nelems")
        group_size: msgspec.Raw = msgspec.field(default=_NONE, name="Group size")
        dtype: msgspec.Raw = msgspec.field(default=_NONE, name="dtype")
        seq: msgspec.Raw = msgspec.field(default=_NONE, name="Seq")
        rank: msgspec.Raw = msgspec.field(default=_NONE, name="Rank")
        name: Any = None  # process_name / thread_name metadata
        labels: Any = None  # process_labels metadata
        hlo_op: Any = None  # an XLA op (jax.profiler)
        device_ordinal: Any = None
        step_num: Any = None  # jax.profiler.StepTraceAnnotation

    class _Event(msgspec.Struct, gc=False):
        ph: Any = None
        cat: Any = None
        name: Any = ""
        pid: Any = None
        tid: Any = None
        ts: msgspec.Raw = _NONE
        dur: msgspec.Raw = _NONE
        id: Any = None
        args: _Args | None = None

    _COMM_FIELDS = tuple(zip(COMM_ARG_KEYS, ("coll", "pg_name", "pg_desc", "pg_ranks", "pg_id", "in_nelems",
                                             "out_nelems", "group_size", "dtype", "seq", "rank"), strict=True))
    _EMPTY_ARGS = _Args()
    _EVENTS = msgspec.json.Decoder(list[_Event])
    _ONE_EVENT = msgspec.json.Decoder(_Event)


def _ns(raws: list) -> np.ndarray:
    """A missing ``ts`` is an empty text: ns_column refuses it, and the file goes to the streaming reader."""
    try:
        return ns_column(b",".join(raws), len(raws))
    except ClockValueError as exc:
        raise FastPathFailed(str(exc)) from None


def _comm(args) -> dict:
    return {key: msgspec.json.decode(raw) for key, attr in _COMM_FIELDS if (raw := getattr(args, attr)) is not _NONE}


class _Acc:
    """Columns of the events decoded so far (one Parts per range)."""

    def __init__(self):
        self.parts = Parts()
        self.name_ids: dict[str, int] = {}
        self.shape_ids: dict[bytes, int] = {}
        self.chunks: dict[str, dict[str, list[np.ndarray]]] = {}

    def names(self, values: list) -> np.ndarray:
        ids = self.name_ids
        return np.array([ids[v] if v in ids else ids.setdefault(v, len(ids)) for v in values], dtype=np.int32)

    def put(self, table: str, cols: dict[str, Any]) -> None:
        t = self.chunks.setdefault(table, {})
        for k, v in cols.items():
            t.setdefault(k, []).append(np.asarray(v, dtype=DTYPES.get(k, np.int64)))

    def add(self, events: list) -> None:
        p = self.parts
        p.n_events += len(events)
        x = [e for e in events if e.ph == "X"]
        dev = [e for e in x if e.cat in DEVICE_CATS]
        rt = [e for e in x if e.cat in RUNTIME_CATS]
        cpu = [e for e in x if e.cat in CPU_CATS]
        p.n_sync += sum(1 for e in x if e.cat in SYNC_CATS)
        if rt:
            args = [e.args or _EMPTY_ARGS for e in rt]
            self.put("rt", {"ts_ns": _ns([e.ts for e in rt]), "dur_ns": self._dur(rt),
                            "name": self.names([e.name for e in rt]), "tid": int_ids([e.tid for e in rt]),
                            "correlation": self._ids([a.correlation for a in args]),
                            "external_id": self._ids([a.external_id for a in args])})
        xla = [e for e in x if e.cat is None and e.args is not None]
        if xla:
            dev += [e for e in xla if e.args.hlo_op is not None]
            steps = [e for e in xla if e.args.step_num is not None]
            for e in steps:
                e.name, e.cat = xla_step_name(e.args.step_num), XLA_STEP_CAT
            cpu += steps
        if dev:
            self._device(dev)
        if cpu:
            self._cpu(cpu)
        flows = [e for e in events if e.ph == "f" and e.cat == "ac2g"]
        if flows:
            self.put("flow", {"pid": int_ids([e.pid for e in flows]), "tid": int_ids([e.tid for e in flows]),
                              "ts_ns": _ns([e.ts for e in flows]), "id": int_ids([e.id for e in flows])})
        for e in events:
            if e.ph == "M" and e.name in META_NAMES:
                a = e.args or _EMPTY_ARGS
                p.meta_events[f"{e.name}:{e.pid}:{e.tid}"] = {"name": a.name} if a.labels is None else {
                    "labels": a.labels}

    @staticmethod
    def _ids(values: list) -> np.ndarray:
        return int_ids([NO_ID if v is None else v for v in values])

    @staticmethod
    def _dur(events: list) -> np.ndarray:
        raws = [e.dur for e in events]
        try:
            return _ns(raws)
        except FastPathFailed:  # an X event without dur lasts 0
            return _ns([r if len(r) else b"0" for r in raws])

    def _device(self, dev: list) -> None:
        args = [e.args or _EMPTY_ARGS for e in dev]
        corr = self._ids([a.correlation for a in args])
        coll = np.array([a.coll is not _NONE for a in args], dtype=np.int8)
        for row in np.flatnonzero(coll).tolist():
            if corr[row] != NO_ID:
                self.parts.kernel_comm[int(corr[row])] = _comm(args[row])
        self.put("dev", {"ts_ns": _ns([e.ts for e in dev]), "dur_ns": self._dur(dev),
                         "kind": [DEVICE_CATS.get(e.cat, KIND_KERNEL) for e in dev],
                         "name": self.names([e.name for e in dev]),
                         "device": int_ids([a.device if a.device is not None else a.device_ordinal
                                            if a.device_ordinal is not None else e.pid
                                            for a, e in zip(args, dev, strict=True)]),
                         "stream": int_ids([a.stream if a.stream is not None else e.tid
                                            for a, e in zip(args, dev, strict=True)]),
                         "correlation": corr, "external_id": self._ids([a.external_id for a in args]),
                         "has_coll": coll, "pid": int_ids([e.pid for e in dev]), "tid": int_ids([e.tid for e in dev])})

    def _cpu(self, cpu: list) -> None:
        args = [e.args or _EMPTY_ARGS for e in cpu]
        ext = self._ids([a.external_id for a in args])
        shape = np.full(len(cpu), NO_ID, dtype=np.int32)
        for row in [i for i, a in enumerate(args) if a.dims is not _NONE]:
            a = args[row]
            if cpu[row].name not in SHAPED_OPS:
                continue
            key = bytes(a.dims) + b"|" + bytes(a.types)
            sid = self.shape_ids.get(key)
            if sid is None:
                sid = self.shape_ids[key] = len(self.parts.shapes)
                concrete = msgspec.json.decode(a.concrete) if a.concrete is not _NONE else None
                types = msgspec.json.decode(a.types) if a.types is not _NONE else []
                self.parts.shapes.append(OpShapes(msgspec.json.decode(a.dims), types, concrete))
            shape[row] = sid
        for row in [i for i, a in enumerate(args) if a.coll is not _NONE]:
            self.parts.op_comm[int(ext[row])] = _comm(args[row])
        self.put("cpu", {"ts_ns": _ns([e.ts for e in cpu]), "dur_ns": self._dur(cpu),
                         "name": self.names([e.name for e in cpu]), "tid": int_ids([e.tid for e in cpu]),
                         "cat": [CPU_CATS[e.cat] for e in cpu], "external_id": ext, "shape": shape,
                         "pid": int_ids([e.pid for e in cpu])})

    def result(self) -> Parts:
        p = self.parts
        if any(not isinstance(n, str) for n in self.name_ids):
            raise FastPathFailed("a non-string event name")
        p.names = list(self.name_ids)
        for table, cols in self.chunks.items():
            p.tables[table] = {k: np.concatenate(v) for k, v in cols.items()}
        return p


def _decode_range(acc: _Acc, data: bytes | memoryview) -> None:
    """Events of one cut range given with its brackets: ``[`` whole events separated by commas ``]``."""
    events: list | None = None
    try:
        events = _EVENTS.decode(data)
        acc.add(events)
    except (msgspec.DecodeError, msgspec.ValidationError, TypeError, KeyError, ValueError) as exc:
        raise FastPathFailed(str(exc)) from None
    finally:
        events = None  # free the events (and their views of the buffer) before the buffer is reused


def _bracketed(text: bytes) -> bytes:
    return b"[" + text + b"]"


def _head(data: bytes) -> tuple[int, dict]:
    """Where the events start (just after the array's '['), and the top-level keys before it."""
    stripped = data.lstrip()
    if stripped[:1] == b"[":
        return len(data) - len(stripped) + 1, {}
    m = re.search(rb'"traceEvents"[ \t\r\n]*:[ \t\r\n]*\[', data)
    if stripped[:1] != b"{" or m is None:
        raise FastPathFailed("no traceEvents array at the start")
    try:
        meta = json.loads(data[:m.end()] + b"]}")
    except ValueError:
        raise FastPathFailed("the keys before traceEvents are not JSON") from None
    meta.pop("traceEvents", None)
    return m.end(), meta


def _skip(ws: re.Pattern, s: str, pos: int) -> int:
    m = ws.match(s, pos)
    return m.end() if m is not None else pos


def _tail(acc: _Acc, text: bytes, meta: dict) -> None:
    """The last events (after the last cut), the array's end and the top-level keys after it."""
    s = text.decode("utf-8")
    dec = json.JSONDecoder()
    ws = re.compile(r"[ \t\r\n,]*")
    pos = _skip(ws, s, 0)
    events = []
    while pos < len(s) and s[pos] != "]":
        try:
            _, end = dec.raw_decode(s, pos)
            events.append(_ONE_EVENT.decode(s[pos:end].encode()))
        except (ValueError, msgspec.DecodeError, msgspec.ValidationError):
            raise FastPathFailed("the last events do not decode") from None
        pos = _skip(ws, s, end)
    if pos >= len(s):
        raise FastPathFailed("the traceEvents array is not closed")
    acc.add(events)
    rest = s[pos + 1:].strip()
    if rest in ("", "}"):
        return
    try:
        extra = json.loads("{" + rest.lstrip(",").lstrip())
    except ValueError:
        raise FastPathFailed("the keys after traceEvents are not JSON") from None
    meta.update({k: v for k, v in extra.items() if k != "traceEvents"})


def _last_cut(buf: bytes | bytearray, lo: int, hi: int) -> tuple[int, int] | None:
    """The last candidate cut in ``buf[lo:hi]``: (just after its ``}``, at its ``{``), or None."""
    window = 1 << 16
    while True:
        a = max(lo, hi - window)
        last = None
        for last in _CUT.finditer(buf, a, hi):  # noqa: B007 - the last match is wanted
            pass
        if last is not None:
            return last.start() + 1, last.end() - 1
        if a == lo:
            return None
        window *= 8


def _open(path: Path):
    raw = open(path, "rb")  # noqa: SIM115 - returned
    magic = raw.read(2)
    raw.seek(0)
    return gzip.GzipFile(fileobj=raw) if magic == b"\x1f\x8b" else raw


def _consume(readinto: Callable[[memoryview], int], head: bytes, acc: _Acc, meta: dict, *, tail: bool,
             progress: Callable[[], None] | None = None) -> None:
    """Decode the events in ``head`` and what ``readinto`` fills after it, one range at a time, in one
    buffer allocated once (the range is decoded in place: the bytes just before and after it, a
    separator or whitespace, are overwritten with its brackets). With ``tail`` the input ends with the
    file (the array's close and the keys after it); otherwise just before an event."""
    buf = bytearray(max(2 * RANGE_BYTES, len(head) + RANGE_BYTES) + 1)
    view = memoryview(buf)
    # buf[0] is slack for the opening bracket of the range that starts at 1
    start, fill = 1, 1 + len(head)
    buf[1:fill] = head
    while True:
        if fill + RANGE_BYTES > len(buf):  # keep what is not decoded, at the front
            kept = fill - start
            buf[1:1 + kept] = buf[start:fill]
            start, fill = 1, 1 + kept
            if fill + RANGE_BYTES > len(buf):  # one event larger than a range
                view.release()
                buf.extend(bytes(RANGE_BYTES))
                view = memoryview(buf)
        got = readinto(view[fill:fill + RANGE_BYTES])
        fill += got
        if not got:
            rest = bytes(view[start:fill])
            if tail:
                _tail_with_cut(acc, rest, 0, meta)
            elif (piece := rest.rstrip().rstrip(b",")).strip():
                _decode_range(acc, _bracketed(piece))
            return
        cut = _last_cut(buf, start, fill)
        if cut is None:
            continue
        buf[start - 1], buf[cut[0]] = 0x5B, 0x5D  # '[' and ']'
        _decode_range(acc, view[start - 1:cut[0] + 1])
        start = cut[1]
        if progress is not None:
            progress()


def _read_serial(path: Path, progress: Callable[[int, int], None] | None) -> tuple[Parts, dict, int]:
    """Read a file front to back (gzip, or not large)."""
    acc = _Acc()
    total = os.path.getsize(path)
    with _open(path) as f:
        raw = getattr(f, "fileobj", f)
        try:
            head = f.read(_HEAD_BYTES)
            start, meta = _head(head)
            _consume(f.readinto, head[start:], acc, meta, tail=True,
                     progress=(lambda: progress(min(raw.tell(), total), total)) if progress else None)
        except (EOFError, OSError, zlib.error) as exc:
            raise FastPathFailed(f"read error: {exc}") from None
    return acc.result(), meta, total


def _tail_with_cut(acc: _Acc, buf: bytes, start: int, meta: dict) -> None:
    """The end of the file: the events up to the last cut fast, the rest (the array's end) exactly.
    A cut inside the top-level keys after the array fails to decode: then the cut before it is tried."""
    hi = len(buf)
    for _ in range(4):
        cut = _last_cut(buf, start, hi)
        if cut is None:
            break
        try:
            _decode_range(acc, _bracketed(buf[start:cut[0]]))
        except FastPathFailed:
            if len(buf) - cut[0] > _HEAD_BYTES:  # not near the end: damage, not a cut in the trailing keys
                raise
            hi = cut[0] - 1
            continue
        _tail(acc, buf[cut[1]:], meta)
        return
    _tail(acc, buf[start:], meta)


def _read_range(path: str, lo: int, hi: int, last: bool) -> tuple[Parts, dict]:
    """One worker's share of an uncompressed file: from the cut at ``lo`` to the cut at ``hi`` (both the
    ``{`` of an event), or to the file's end when ``last``."""
    gc.disable()
    acc = _Acc()
    meta: dict = {}
    with open(path, "rb") as f:
        f.seek(lo)

        def readinto(view: memoryview) -> int:
            return f.readinto(view[:max(0, hi - f.tell())])

        _consume(readinto, b"", acc, meta, tail=last)
    return acc.result(), meta


def _range_cuts(path: Path, n: int) -> list[int]:
    """``n + 1`` byte offsets: the events' start, n - 1 cuts near equal shares, the file's end."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(_HEAD_BYTES)
        start, _ = _head(head)
        cuts = [start]
        for k in range(1, n):
            f.seek(size * k // n)
            window = f.read(1 << 20)
            m = _CUT.search(window)
            if m is None:
                break
            cuts.append(size * k // n + m.end() - 1)
    cuts.append(size)
    return sorted(set(cuts))


def pool_context():
    """fork where the platform has it: workers start at once and need no importable ``__main__``; the
    workers only decode and return columns, so nothing they inherit (a progress thread) is touched."""
    import multiprocessing

    return get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")


def load_fast(path: Path, *, progress: Callable[[int, int], None] | None = None, workers: int = 1) -> Trace | None:
    """The trace, or None when this file is for the streaming reader (or msgspec is not installed)."""
    if msgspec is None:
        return None
    gc_was_enabled = gc.isenabled()
    gc.disable()  # millions of objects that hold no cycles: collection passes would dominate
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            compressed = f.read(2) == b"\x1f\x8b"
        if workers > 1 and not compressed and size >= PARALLEL_MIN_BYTES:
            parts, meta = _read_parallel(path, workers)
        else:
            parts, meta, size = _read_serial(path, progress)
    except (FastPathFailed, BrokenProcessPool):  # damage, an odd file, or a worker lost (memory)
        return None
    finally:
        if gc_was_enabled:
            gc.enable()
    if progress is not None:
        progress(size, size)
    return finish(parts, path, meta, [], True, size)


def _read_parallel(path: Path, workers: int) -> tuple[Parts, dict]:
    with open(path, "rb") as f:
        _, meta = _head(f.read(_HEAD_BYTES))
    cuts = _range_cuts(path, workers)
    ranges = list(zip(cuts[:-1], cuts[1:], strict=True))
    with ProcessPoolExecutor(max_workers=len(ranges), mp_context=pool_context()) as pool:
        futures = [pool.submit(_read_range, str(path), lo, hi, i == len(ranges) - 1)
                   for i, (lo, hi) in enumerate(ranges)]
        results = [fut.result() for fut in futures]
    for _, tail_meta in results:
        meta.update(tail_meta)
    return Parts.merge([p for p, _ in results]), meta
