"""What the vendor-timeline readers share (Nsight Systems SQLite exports, rocprofv3 CSV traces): interned
names, host ranges (NVTX / ROCTx) turned into steps, operators and annotations, and the link from each
runtime call to the innermost range that encloses it (the role torch.profiler's External id plays).

A range whose name matches the step pattern (``ProfilerStep#N`` by default) becomes step N; a range
named like an operator (``aten::mm``, ``c10d::allreduce_``, ``nccl:all_reduce``: what
``torch.autograd.profiler.emit_nvtx`` writes, through NVTX on CUDA and ROCTx on ROCm) is a host operator
whose kernels take its class; any other range is an annotation, which decides no kernel's class.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np

from wavefront.workbench.trace.classify import is_comm_op_name
from wavefront.workbench.trace.events import COLUMNS, DTYPES
from wavefront.workbench.trace.model import CAT_CPU_OP, CAT_USER_ANNOTATION, NO_ID

DEFAULT_STEP_PATTERN = r"^ProfilerStep#(\d+)$"
OpRanges = dict[int, list[tuple[int, int, int]]]  # thread -> (start, end, external id) of its ranges


class Names:
    """The trace's name table: each distinct name stored once, rows hold its index."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.ids: dict[str, int] = {}

    def intern(self, name: str) -> int:
        nid = self.ids.get(name)
        if nid is None:
            nid = self.ids[name] = len(self.names)
            self.names.append(name)
        return nid

    def map(self, ids: np.ndarray, label: Callable[[int], str]) -> np.ndarray:
        """Interned name index per row, ``label(id)`` computed once per distinct id."""
        uniq, inverse = np.unique(ids, return_inverse=True)
        table = np.array([self.intern(label(int(i))) for i in uniq.tolist()], dtype=np.int32)
        return table[inverse.reshape(-1)] if len(ids) else np.zeros(0, dtype=np.int32)

    def of_labels(self, labels: list[str]) -> np.ndarray:
        """Interned name index per row of text labels."""
        return np.array([self.intern(s) for s in labels], dtype=np.int32).reshape(-1)


def empty(table: str) -> dict[str, np.ndarray]:
    return {k: np.zeros(0, dtype=DTYPES.get(k, np.int64)) for k in COLUMNS[table]}


def device_rows(kind: np.ndarray, start: np.ndarray, end: np.ndarray, name: np.ndarray, device: np.ndarray,
                stream: np.ndarray, correlation: np.ndarray) -> dict[str, np.ndarray]:
    """The ``dev`` table of a vendor timeline (no External ids, flows or collective args: linking is by
    correlation id)."""
    n = len(start)
    return {"ts_ns": start, "dur_ns": end - start, "kind": kind.astype(np.int8), "name": name,
            "device": device, "stream": stream, "correlation": correlation,
            "external_id": np.full(n, NO_ID, dtype=np.int64), "has_coll": np.zeros(n, dtype=np.int8),
            "run_id": np.full(n, NO_ID, dtype=np.int64), "pid": np.full(n, NO_ID, dtype=np.int64),
            "tid": np.full(n, NO_ID, dtype=np.int64)}


def is_operator(name: str) -> bool:
    return "::" in name or is_comm_op_name(name)


def host_ranges(times: np.ndarray, labels: list[str], step: re.Pattern[str],
                names: Names) -> tuple[dict[str, np.ndarray], OpRanges]:
    """The ``cpu`` table of host ranges ``times`` (rows of start, end, thread; in start order) named
    ``labels``, and the non-step ranges per thread for :func:`enclosing`. A step takes its number from
    the pattern's first group when that is digits, else its order of appearance; it is stored as
    ``ProfilerStep#N`` so the breakdown finds it."""
    uniq, inverse = np.unique(np.array(labels, dtype=object), return_inverse=True)
    inverse = inverse.reshape(-1)
    if not len(uniq):
        return empty("cpu"), {}
    matches = [step.search(str(u)) for u in uniq.tolist()]
    is_step = np.array([m is not None for m in matches], dtype=bool)[inverse]
    is_op = np.array([is_operator(str(u)) for u in uniq.tolist()], dtype=bool)[inverse] & ~is_step
    group = [int(m.group(1)) if m and m.groups() and (m.group(1) or "").isdigit() else -1 for m in matches]
    number = np.array(group, dtype=np.int64)[inverse]
    number = np.where(number >= 0, number, np.cumsum(is_step))
    name = np.array([names.intern(str(u)) for u in uniq.tolist()], dtype=np.int32)[inverse]
    step_names = {int(n): names.intern(f"ProfilerStep#{int(n)}") for n in np.unique(number[is_step]).tolist()}
    name[is_step] = [step_names[int(n)] for n in number[is_step].tolist()]
    ext = np.arange(1, len(times) + 1, dtype=np.int64)
    cpu = {"ts_ns": times[:, 0], "dur_ns": times[:, 1] - times[:, 0], "name": name, "tid": times[:, 2],
           "cat": np.where(is_op, CAT_CPU_OP, CAT_USER_ANNOTATION).astype(np.int8), "external_id": ext,
           "shape": np.full(len(times), NO_ID, dtype=np.int32)}
    op_ranges: OpRanges = {}
    ranges = ~is_step  # a launch links to its innermost range, operator or not, as External id does
    for thread in np.unique(times[ranges, 2]).tolist():
        sel = ranges & (times[:, 2] == thread)
        op_ranges[thread] = list(zip(times[sel, 0].tolist(), times[sel, 1].tolist(), ext[sel].tolist(),
                                     strict=True))
    return cpu, op_ranges


def enclosing(op_ranges: OpRanges, start: np.ndarray, end: np.ndarray, tid: np.ndarray) -> np.ndarray:
    """External id of the innermost range on the same thread holding each runtime call (rows in
    start order), NO_ID where none does: one sweep per thread with a stack of the open ranges."""
    out = np.full(len(start), NO_ID, dtype=np.int64)
    starts, ends = start.tolist(), end.tolist()
    for thread, ranges in op_ranges.items():
        rows = np.flatnonzero(tid == thread).tolist()
        stack: list[tuple[int, int, int]] = []
        i = 0
        for row in rows:
            s0, s1 = starts[row], ends[row]
            while i < len(ranges) and ranges[i][0] <= s0:
                stack.append(ranges[i])
                i += 1
            while stack and stack[-1][1] <= s0:  # closed before this call (push/pop ranges nest)
                stack.pop()
            for _r0, r1, ext in reversed(stack):
                if r1 >= s1:
                    out[row] = ext
                    break
    return out
