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
import io
import itertools
import json
import multiprocessing
import operator
import os
import re
import zlib
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import get_context
from multiprocessing.context import BaseContext
from operator import attrgetter
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

RANGE_BYTES = 8 << 20  # small enough that a range's decoded events stay in cache and reuse freed memory
# A file is read in parallel byte ranges when it is uncompressed and at least this large.
PARALLEL_MIN_BYTES = 96 << 20
_CUT = re.compile(rb"\}[ \t\r\n]*,[ \t\r\n]*\{")
_HEAD_BYTES = 4 << 20  # the keys before traceEvents (deviceProperties, distributedInfo) fit in this

_Getter = Callable[[Any], Any]  # an attrgetter over decoded events
_Column = Callable[[_Getter, list[Any]], np.ndarray]


class FastPathFailed(Exception):
    """This file is for the streaming reader (damaged, unusual, or a cut fell inside an event)."""


# Chrome trace-event phases (the format's complete list) and the categories Kineto writes: decoded as
# literals, they come back as shared objects instead of a new string per event. A category outside the
# list fails the range's decoding, and the file continues with the generic decoder (category as any
# string): an unknown category costs one range decoded twice, never a wrong result.
_PHASES = ("X", "B", "E", "i", "I", "C", "b", "n", "e", "s", "t", "f", "P", "N", "O", "D", "M", "V", "v", "R", "c",
           "(", ")")
_KNOWN_CATS = (*DEVICE_CATS, *RUNTIME_CATS, *CPU_CATS, *SYNC_CATS, "ac2g", "fwdbwd", "python_function",
               "gpu_user_annotation", "cpu_instant_event", "external_correlation", "overhead", "Trace",
               "cuda_profiler_range", "collective_comm", "mtia_runtime", "mtia_ccp_events", "glow_runtime",
               "hpu_op", "xpu_runtime", "xpu_driver", "gpu_mem", "Python", "async_cpu_to_gpu")
# Times as floats are exact when small enough (see _ns_of_floats); otherwise the file continues with
# their raw text, parsed digit by digit (clock.ns_column).
LEVELS = ("literal", "generic", "raw-times")

if msgspec is not None:
    from typing import Literal

    _NONE = msgspec.Raw()

    _RAW_ARGS = (("dims", "Input Dims"), ("types", "Input type"), ("concrete", "Concrete Inputs"),
                 ("coll", "Collective name"), ("pg_name", "Process Group Name"),
                 ("pg_desc", "Process Group Description"), ("pg_ranks", "Process Group Ranks"), ("pg_id", "pg_id"),
                 ("in_nelems", "In msg nelems"), ("out_nelems", "Out msg nelems"), ("group_size", "Group size"),
                 ("dtype", "dtype"), ("seq", "Seq"), ("rank", "Rank"))

    def _args_type(id_type: Any) -> type[msgspec.Struct]:
        """The args the analyses read; ``id_type`` for device, stream, correlation and External id."""
        return msgspec.defstruct("_Args", [
            ("device", id_type, None), ("stream", id_type, None), ("correlation", id_type, None),
            ("external_id", id_type, msgspec.field(default=None, name="External id")),
            *((attr, msgspec.Raw, msgspec.field(default=_NONE, name=key)) for attr, key in _RAW_ARGS),
            ("name", Any, None), ("labels", Any, None),  # process_name / thread_name / process_labels metadata
            ("hlo_op", Any, None), ("hlo_module", Any, None),  # an XLA op (jax.profiler) and its program
            ("run_id", Any, None),  # one execution of an XLA program: the same on every rank
            ("device_ordinal", Any, None), ("step_num", Any, None),  # step_num: jax's StepTraceAnnotation
        ], gc=False, frozen=True)

    def _event_type(ph_type: Any, cat_type: Any, id_type: Any, time_type: Any, ts_default: object,
                    dur_default: object) -> type[msgspec.Struct]:
        args = _args_type(id_type)
        # args default to one shared frozen instance: events without args allocate nothing
        return msgspec.defstruct("_Event", [
            ("ph", ph_type, None), ("cat", cat_type, None), ("name", Any, ""), ("pid", Any, None),
            ("tid", Any, None), ("ts", time_type, ts_default), ("dur", time_type, dur_default), ("id", Any, None),
            ("args", args, args())], gc=False)

    # nan: a missing ts never passes the exactness check, so it reaches the raw-text level, which refuses
    # it (the streaming reader then counts the event as malformed); a missing dur is 0, as there
    _TYPES = {
        "literal": _event_type(Literal[_PHASES] | None, Literal[_KNOWN_CATS] | None, int | None, float,
                               float("nan"), 0.0),
        "generic": _event_type(Any, Any, Any, float, float("nan"), 0.0),
        "raw-times": _event_type(Any, Any, Any, msgspec.Raw, _NONE, _NONE),
    }
    _DECODERS = {level: msgspec.json.Decoder(list[t]) for level, t in _TYPES.items()}  # type: ignore[valid-type]
    _ONE_EVENT = msgspec.json.Decoder(_TYPES["raw-times"])
    _COMM_FIELDS = tuple(zip(COMM_ARG_KEYS, ("coll", "pg_name", "pg_desc", "pg_ranks", "pg_id", "in_nelems",
                                             "out_nelems", "group_size", "dtype", "seq", "rank"), strict=True))

_GET = {k: attrgetter(k) for k in ("ph", "cat", "name", "pid", "tid", "ts", "dur", "id", "args")}
_ARG = {k: attrgetter(k) for k in ("device", "stream", "correlation", "external_id", "dims", "types", "coll")}
# Per event, a code of its phase, and one of its category: which table an X event of that category goes
# to (_T_XLA: no category, as jax.profiler writes) times 8, plus its device kind or CPU category.
_PH_X, _PH_F, _PH_M = 1, 2, 3
_T_NONE, _T_DEV, _T_RT, _T_CPU, _T_SYNC, _T_XLA, _T_FLOW = 0, 1, 2, 3, 4, 5, 6


def _phase_code(ph: object) -> int:
    return {"X": _PH_X, "f": _PH_F, "M": _PH_M}.get(ph, 0) if isinstance(ph, str) else 0


def _category_code(cat: object) -> int:
    if cat is None:
        return 8 * _T_XLA + KIND_KERNEL
    if not isinstance(cat, str):
        return 0
    if cat in DEVICE_CATS:
        return 8 * _T_DEV + DEVICE_CATS[cat]
    if cat in RUNTIME_CATS:
        return 8 * _T_RT
    if cat in CPU_CATS:
        return 8 * _T_CPU + CPU_CATS[cat]
    if cat == "ac2g":
        return 8 * _T_FLOW
    return 8 * _T_SYNC if cat in SYNC_CATS else 0


class _Inexact(Exception):
    """Times that a float cannot carry exactly: decode the range again with their raw text."""


def _ns_of_floats(values: list[Any] | np.ndarray) -> np.ndarray:
    """Microseconds decoded as floats to integer nanoseconds, exactly, or :class:`_Inexact`.

    msgspec rounds a number's text ``v`` to the nearest float ``f``. With ``N = rint(f * 1000)``: when
    ``N / 1000`` rounds to the same ``f`` and ``|f| < 2**40``, both ``v`` and ``N / 1000`` lie within one
    float spacing of ``f`` (at most ``2**-13`` us there), so ``|1000 v - N| <= 0.122``: N is the exact
    round-half-even nanosecond of the text, whatever its number of decimals. Kineto's usual clocks (three
    decimals, below 12 days in us) always pass; Unix-epoch clocks (``1.76e15`` us) never do.
    """
    f = values if isinstance(values, np.ndarray) else np.fromiter(values, dtype=np.float64, count=len(values))
    ns = np.rint(f * 1000.0)
    if len(f) and not (np.all(np.abs(f) < 2.0**40) and np.array_equal(ns / 1000.0, f)):
        raise _Inexact
    return ns.astype(np.int64)


def _ns(raws: list[Any]) -> np.ndarray:
    """A missing ``ts`` is an empty text: ns_column refuses it, and the file goes to the streaming reader."""
    try:
        return ns_column(b",".join(raws), len(raws))
    except ClockValueError as exc:
        raise FastPathFailed(str(exc)) from None


def _comm(args: Any) -> dict[str, Any]:
    return {key: msgspec.json.decode(raw) for key, attr in _COMM_FIELDS if (raw := getattr(args, attr)) is not _NONE}


def _take(events: list[Any], rows: np.ndarray) -> list[Any]:
    if len(rows) == len(events):
        return events
    return [events[i] for i in rows.tolist()]


def _ids(values: list[Any], fallback: list[Any] | None = None) -> np.ndarray:
    """int_id of each value (a missing one: its ``fallback`` value, else NO_ID); plain ints in one call."""
    try:
        out = np.array(values)
    except (TypeError, ValueError, OverflowError):
        out = None
    if out is not None and out.dtype == np.int64 and out.ndim == 1:
        return out
    if fallback is not None:
        values = [f if v is None else v for v, f in zip(values, fallback, strict=True)]
    return int_ids([NO_ID if v is None else v for v in values])


def _typed_ids(values: list[Any]) -> np.ndarray:
    """Ids the decoder already typed ``int | None``: plain ints convert without inspection."""
    try:
        return np.fromiter(values, dtype=np.int64, count=len(values))
    except (TypeError, OverflowError):  # a missing id, or one past int64
        return _ids(values)


# Column readers: (attribute getter, events) -> numpy column, straight from the getter's iterator where
# the decoder has typed the values (no intermediate list)
def _float_times(get: _Getter, seq: list[Any]) -> np.ndarray:
    return _ns_of_floats(np.fromiter(map(get, seq), dtype=np.float64, count=len(seq)))


def _raw_times(get: _Getter, seq: list[Any]) -> np.ndarray:
    return _ns(list(map(get, seq)))


def _typed_id_col(get: _Getter, seq: list[Any]) -> np.ndarray:
    try:
        return np.fromiter(map(get, seq), dtype=np.int64, count=len(seq))
    except (TypeError, OverflowError):  # a missing id, or one past int64
        return _ids(list(map(get, seq)))


def _id_col(get: _Getter, seq: list[Any]) -> np.ndarray:
    return _ids(list(map(get, seq)))


class _Acc:
    """Columns of the events decoded so far (one Parts per range)."""

    def __init__(self, keep_flows: bool = False):
        self.parts = Parts()
        self.level = 0  # index into LEVELS: only ever moves on
        # ac2g flows only serve device events written without a correlation id: they are kept from the
        # first such event on (and counted before); see load_fast for one that comes after its flow
        self.keep_flows = keep_flows
        self.name_ids: dict[str, int] = {}
        self.shape_ids: dict[tuple[bytes, bytes], int] = {}
        self.codes: dict[str, dict[str, Any]] = {"ph": {}, "cat": {}}
        self.chunks: dict[str, dict[str, list[np.ndarray]]] = {}

    def names(self, values: list[Any]) -> np.ndarray:
        ids = self.name_ids
        for v in dict.fromkeys(values):
            if v not in ids:
                ids[v] = len(ids)
        return np.fromiter(map(ids.__getitem__, values), dtype=np.int32, count=len(values))

    def _code(self, field: str, values: list[Any], code_of: Callable[[Any], int]) -> np.ndarray:
        table = self.codes[field]
        for v in set(values):
            if v not in table:
                table[v] = code_of(v)
        return np.fromiter(map(table.__getitem__, values), dtype=np.int8, count=len(values))

    def add(self, events: list[Any], level: str) -> None:
        """Keep the events' columns. The columns are computed before any is stored, so a range that raises
        :class:`_Inexact` can be decoded again (names and shapes it interned are found again then)."""
        n = len(events)
        if n == 0:
            return
        ns = _raw_times if level == "raw-times" else _float_times
        ids = _typed_id_col if level == "literal" else _id_col
        ph = self._code("ph", list(map(_GET["ph"], events)), _phase_code)
        cat = self._code("cat", list(map(_GET["cat"], events)), _category_code)
        table = np.where(ph == _PH_X, cat >> 3, _T_NONE)
        kind = cat & 7
        out: dict[str, dict[str, Any]] = {}
        kernel_comm: dict[int, dict[str, Any]] = {}
        op_comm: dict[int, dict[str, Any]] = {}

        dev_rows, cpu_rows = np.flatnonzero(table == _T_DEV), np.flatnonzero(table == _T_CPU)
        dev, cpu = _take(events, dev_rows), _take(events, cpu_rows)
        dev_kind, cpu_cat = kind[dev_rows], kind[cpu_rows]
        xla = _take(events, np.flatnonzero(table == _T_XLA))
        ops: list[Any] = []
        if xla:  # jax.profiler: XLA ops are device work, step annotations the steps
            ops = [e for e in xla if e.args.hlo_op is not None]
            steps = [msgspec.structs.replace(e, name=xla_step_name(e.args.step_num), cat=XLA_STEP_CAT)
                     for e in xla if e.args.step_num is not None]
            dev, cpu = dev + ops, cpu + steps
            dev_kind = np.concatenate([dev_kind, np.full(len(ops), KIND_KERNEL, dtype=np.int8)])
            cpu_cat = np.concatenate([cpu_cat, np.full(len(steps), CPU_CATS[XLA_STEP_CAT], dtype=np.int8)])
        rt = _take(events, np.flatnonzero(table == _T_RT))
        if rt:
            args = list(map(_GET["args"], rt))
            out["rt"] = {"ts_ns": ns(_GET["ts"], rt), "dur_ns": ns(_GET["dur"], rt),
                         "name": self.names(list(map(_GET["name"], rt))), "tid": _id_col(_GET["tid"], rt),
                         "correlation": ids(_ARG["correlation"], args),
                         "external_id": ids(_ARG["external_id"], args)}
        if dev:
            out["dev"], kernel_comm = self._device(dev, dev_kind, ns, ids, len(ops))
        if cpu:
            out["cpu"], op_comm = self._cpu(cpu, cpu_cat, ns, ids)
        flow_rows = np.flatnonzero((ph == _PH_F) & (cat >> 3 == _T_FLOW))
        keep_flows = self.keep_flows or ("dev" in out and bool(np.any(out["dev"]["correlation"] == NO_ID)))
        flows = _take(events, flow_rows) if keep_flows else []
        if flows:
            out["flow"] = {"pid": _id_col(_GET["pid"], flows), "tid": _id_col(_GET["tid"], flows),
                           "ts_ns": ns(_GET["ts"], flows), "id": _id_col(_GET["id"], flows)}
        meta = {}
        for e in _take(events, np.flatnonzero(ph == _PH_M)):
            if e.name in META_NAMES:
                a = e.args
                meta[f"{e.name}:{e.pid}:{e.tid}"] = {"name": a.name} if a.labels is None else {"labels": a.labels}
        p = self.parts
        self.keep_flows = keep_flows
        if not keep_flows:
            p.n_flows_skipped += len(flow_rows)
        p.n_events += n
        p.n_sync += int(np.count_nonzero(table == _T_SYNC))
        p.kernel_comm.update(kernel_comm)
        p.op_comm.update(op_comm)
        p.meta_events.update(meta)
        for name, cols in out.items():
            t = self.chunks.setdefault(name, {})
            for k, v in cols.items():
                t.setdefault(k, []).append(np.asarray(v, dtype=DTYPES.get(k, np.int64)))

    def _device(self, dev: list[Any], kind: np.ndarray, ns: _Column, ids: _Column,
                n_xla: int) -> tuple[dict[str, Any], dict[int, dict[str, Any]]]:
        """The device table of these events; the last ``n_xla`` are XLA ops."""
        args = list(map(_GET["args"], dev))
        run_id = np.full(len(dev), NO_ID)
        if n_xla:
            run_id[-n_xla:] = _ids([a.run_id for a in args[-n_xla:]])
        corr = ids(_ARG["correlation"], args)
        colls = list(map(_ARG["coll"], args))
        coll = np.fromiter(map(operator.is_not, colls, itertools.repeat(_NONE)), dtype=np.int8, count=len(dev))
        kernel_comm = {int(corr[row]): _comm(args[row]) for row in np.flatnonzero(coll).tolist() if corr[row] != NO_ID}
        typed_ids = _typed_ids if ids is _typed_id_col else _ids
        device, device_ids = list(map(_ARG["device"], args)), typed_ids
        if None in device:
            device, device_ids = [d if d is not None else a.device_ordinal if a.device_ordinal is not None
                                  else e.pid for d, a, e in zip(device, args, dev, strict=True)], _ids
        stream, stream_ids = list(map(_ARG["stream"], args)), typed_ids
        if None in stream:
            stream, stream_ids = [s if s is not None else e.tid for s, e in zip(stream, dev, strict=True)], _ids
        # pid and tid only link a kernel written without its correlation id to its ac2g flow
        missing = np.flatnonzero(corr == NO_ID)
        pid, tid = np.full(len(dev), NO_ID), np.full(len(dev), NO_ID)
        if len(missing):
            lost = [dev[i] for i in missing.tolist()]
            pid[missing], tid[missing] = _id_col(_GET["pid"], lost), _id_col(_GET["tid"], lost)
        return {"ts_ns": ns(_GET["ts"], dev), "dur_ns": ns(_GET["dur"], dev), "kind": kind,
                "name": self.names(list(map(_GET["name"], dev))), "device": device_ids(device),
                "stream": stream_ids(stream),
                "correlation": corr, "external_id": ids(_ARG["external_id"], args),
                "has_coll": coll, "run_id": run_id, "pid": pid, "tid": tid}, kernel_comm

    def _cpu(self, cpu: list[Any], cat: np.ndarray, ns: _Column,
             ids: _Column) -> tuple[dict[str, Any], dict[int, dict[str, Any]]]:
        args = list(map(_GET["args"], cpu))
        ext = ids(_ARG["external_id"], args)
        name = self.names(list(map(_GET["name"], cpu)))
        shaped = np.fromiter(map(SHAPED_OPS.__contains__, self.name_ids), dtype=bool, count=len(self.name_ids))
        shape = np.full(len(cpu), NO_ID, dtype=np.int32)
        rows = [i for i in np.flatnonzero(shaped[name]).tolist() if args[i].dims is not _NONE]
        if rows:
            sel = [args[i] for i in rows]
            # one OpShapes per distinct (dims, types), from its first event; the texts are copied out in one
            # join each (half the cost of one bytes() per text), NUL between them (JSON text holds none)
            keys = list(zip(b"\0".join(map(_ARG["dims"], sel)).split(b"\0"),
                            b"\0".join(map(_ARG["types"], sel)).split(b"\0"), strict=True))
            known = self.shape_ids
            for key, a in zip(keys, sel, strict=True):
                if key not in known:
                    known[key] = len(self.parts.shapes)
                    concrete = msgspec.json.decode(a.concrete) if a.concrete is not _NONE else None
                    types = msgspec.json.decode(a.types) if a.types is not _NONE else []
                    self.parts.shapes.append(OpShapes(msgspec.json.decode(a.dims), types, concrete))
            shape[rows] = list(map(known.__getitem__, keys))
        colls = list(map(_ARG["coll"], args))
        op_comm = {int(ext[i]): _comm(args[i]) for i, c in enumerate(colls) if c is not _NONE}
        return {"ts_ns": ns(_GET["ts"], cpu), "dur_ns": ns(_GET["dur"], cpu),
                "name": name, "tid": _id_col(_GET["tid"], cpu), "cat": cat, "external_id": ext,
                "shape": shape}, op_comm

    def result(self) -> Parts:
        p = self.parts
        if any(not isinstance(n, str) for n in self.name_ids):
            raise FastPathFailed("a non-string event name")
        p.names = list(self.name_ids)
        for table, cols in self.chunks.items():
            p.tables[table] = {k: np.concatenate(v) for k, v in cols.items()}
        return p


def _decode_range(acc: _Acc, data: bytes | memoryview) -> None:
    """Events of one cut range given with its brackets: ``[`` whole events separated by commas ``]``.
    A range the current level cannot take is decoded again at the next (see LEVELS)."""
    events: list[Any] | None = None
    try:
        while True:
            level = LEVELS[acc.level]
            try:
                events = _DECODERS[level].decode(data)
                acc.add(events, level)
                return
            except msgspec.ValidationError:
                if level == "raw-times":
                    raise
                acc.level += 1  # an unknown category, or times that are not numbers
            except _Inexact:
                acc.level = LEVELS.index("raw-times")
            events = None
    except (msgspec.DecodeError, msgspec.ValidationError, TypeError, KeyError, ValueError) as exc:
        raise FastPathFailed(str(exc)) from None
    finally:
        events = None  # free the events (and their views of the buffer) before the buffer is reused


def _bracketed(text: bytes) -> bytes:
    return b"[" + text + b"]"


def _head(data: bytes) -> tuple[int, dict[str, Any]]:
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


def _skip(ws: re.Pattern[str], s: str, pos: int) -> int:
    m = ws.match(s, pos)
    return m.end() if m is not None else pos


def _tail(acc: _Acc, text: bytes, meta: dict[str, Any]) -> None:
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
    acc.add(events, "raw-times")
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


def _open(path: Path) -> io.BufferedIOBase:
    raw = open(path, "rb")  # noqa: SIM115 - returned
    magic = raw.read(2)
    raw.seek(0)
    return gzip.GzipFile(fileobj=raw) if magic == b"\x1f\x8b" else raw


def _consume(readinto: Callable[[memoryview], int], head: bytes, acc: _Acc, meta: dict[str, Any], *, tail: bool,
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


def _read_serial(path: Path, progress: Callable[[int, int], None] | None,
                 keep_flows: bool = False) -> tuple[Parts, dict[str, Any], int]:
    """Read a file front to back (gzip, or not large)."""
    acc = _Acc(keep_flows)
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


def _tail_with_cut(acc: _Acc, buf: bytes, start: int, meta: dict[str, Any]) -> None:
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


def _read_range(path: str, lo: int, hi: int, last: bool, keep_flows: bool = False) -> tuple[Parts, dict[str, Any]]:
    """One worker's share of an uncompressed file: from the cut at ``lo`` to the cut at ``hi`` (both the
    ``{`` of an event), or to the file's end when ``last``."""
    gc.disable()
    acc = _Acc(keep_flows)
    meta: dict[str, Any] = {}
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


def pool_context() -> BaseContext:
    """fork where the platform has it: workers start at once and need no importable ``__main__``; the
    workers only decode and return columns, so nothing they inherit (a progress thread) is touched."""
    return get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")


def load_fast(path: Path, *, progress: Callable[[int, int], None] | None = None, workers: int = 1,
              keep_flows: bool = False) -> Trace | None:
    """The trace, or None when this file is for the streaming reader (or msgspec is not installed).
    A device event without a correlation id whose ac2g flow came before it in the file (its flow skipped,
    see _Acc) makes the file be read again keeping every flow."""
    if msgspec is None:
        return None
    gc_was_enabled = gc.isenabled()
    gc.disable()  # millions of objects that hold no cycles: collection passes would dominate
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            compressed = f.read(2) == b"\x1f\x8b"
        if workers > 1 and not compressed and size >= PARALLEL_MIN_BYTES:
            parts, meta = _read_parallel(path, workers, keep_flows)
        else:
            parts, meta, size = _read_serial(path, progress, keep_flows)
    except (FastPathFailed, BrokenProcessPool):  # damage, an odd file, or a worker lost (memory)
        return None
    finally:
        if gc_was_enabled:
            gc.enable()
    if parts.n_flows_skipped and np.any(parts.tables["dev"]["correlation"] == NO_ID):
        return load_fast(path, progress=progress, workers=workers, keep_flows=True)
    if progress is not None:
        progress(size, size)
    return finish(parts, path, meta, [], True, size)


def _read_parallel(path: Path, workers: int, keep_flows: bool) -> tuple[Parts, dict[str, Any]]:
    with open(path, "rb") as f:
        _, meta = _head(f.read(_HEAD_BYTES))
    cuts = _range_cuts(path, workers)
    ranges = list(zip(cuts[:-1], cuts[1:], strict=True))
    with ProcessPoolExecutor(max_workers=len(ranges), mp_context=pool_context()) as pool:
        futures = [pool.submit(_read_range, str(path), lo, hi, i == len(ranges) - 1, keep_flows)
                   for i, (lo, hi) in enumerate(ranges)]
        results = [fut.result() for fut in futures]
    for _, tail_meta in results:
        meta.update(tail_meta)
    return Parts.merge([p for p, _ in results]), meta
