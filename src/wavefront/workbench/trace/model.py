"""What a loaded profiler trace holds: compact columns of the events the analyses need.

A Kineto/Chrome trace is a list of events; the loader keeps only the fields the analyses read, in numpy
columns (one row per event, names interned into ``Trace.names``), so a multi-GB trace fits in memory.
Times are integer nanoseconds on the trace's own clock, read exactly from the decimal text of ``ts`` (in
microseconds, at any magnitude: see :mod:`wavefront.workbench.trace.clock`), so interval sums are exact;
``end_ns = ts_ns + dur_ns``. Results are reported in microseconds.

Tables:
- ``device``: work on the GPU: kernels, memcpy, memset (``kind``), with device, stream, correlation id
  (links to the runtime call that launched it) and External id (links to the CPU op); ``run_id``: the
  XLA execution an op of a jax.profiler trace belongs to (the same on every rank), else NO_ID.
- ``runtime``: CUDA/HIP runtime and driver API calls on the host (launches, syncs, mallocs...).
- ``cpu``: CPU operators and user annotations (ProfilerStep#N, gloo:all_reduce, ...).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import numpy.typing as npt

KIND_KERNEL, KIND_MEMCPY, KIND_MEMSET = 0, 1, 2
KIND_NAMES = ("kernel", "memcpy", "memset")

CAT_CPU_OP, CAT_USER_ANNOTATION = 0, 1

NO_ID = -1  # correlation / External id absent


@dataclass
class Columns:
    """A table of equal-length numpy columns; ``len()`` is the row count."""

    cols: dict[str, np.ndarray]

    def __len__(self) -> int:
        return len(next(iter(self.cols.values()))) if self.cols else 0

    def __getattr__(self, name: str) -> np.ndarray:
        try:
            return cast(np.ndarray, self.__dict__["cols"][name])
        except KeyError:
            raise AttributeError(name) from None

    def take(self, index: np.ndarray | slice) -> Columns:
        return Columns({k: v[index] for k, v in self.cols.items()})

    @property
    def end_ns(self) -> np.ndarray:
        return cast(np.ndarray, self.ts_ns + self.dur_ns)


@dataclass
class OpShapes:
    """Input shapes and dtypes of a CPU op recorded with ``record_shapes=True``."""

    dims: list[Any]
    types: list[Any]
    concrete: list[Any] | None = None


@dataclass
class Trace:
    """One rank's trace, as loaded. Build with :func:`wavefront.workbench.trace.load_trace`."""

    path: str
    names: list[str]
    device: Columns  # ts_ns, dur_ns, kind, name, device, stream, correlation, external_id, has_coll, run_id
    runtime: Columns  # ts_ns, dur_ns, name, tid, correlation, external_id
    cpu: Columns  # ts_ns, dur_ns, name, tid, cat, external_id, shape
    shapes: list[OpShapes] = field(default_factory=list)  # distinct input shapes; cpu.shape indexes it
    op_comm_args: dict[int, dict[str, Any]] = field(default_factory=dict)  # collective args of CPU ops, by External id
    # collective args on kernels, by correlation
    kernel_comm_args: dict[int, dict[str, Any]] = field(default_factory=dict)
    n_sync_events: int = 0  # GPU-side cuda_sync events: kept out of busy time
    n_events: int = 0  # every event in the file, kept or not
    n_malformed: int = 0  # events skipped as malformed (not an object, a bad ts, ...)
    meta: dict[str, Any] = field(default_factory=dict)  # deviceProperties, distributedInfo, host_name, ...
    warnings: list[str] = field(default_factory=list)
    complete: bool = True  # False when the file was truncated or corrupt after some events
    bytes_read: int = 0

    @property
    def rank(self) -> int | None:
        info = self.meta.get("distributedInfo") or {}
        rank = info.get("rank")
        return int(rank) if isinstance(rank, int | float | str) and str(rank).lstrip("-").isdigit() else None

    @property
    def world_size(self) -> int | None:
        info = self.meta.get("distributedInfo") or {}
        size = info.get("world_size")
        return int(size) if isinstance(size, int | float) else None

    @property
    def device_name(self) -> str | None:
        props = self.meta.get("deviceProperties") or []
        for p in props:
            if isinstance(p, dict) and p.get("name"):
                return str(p["name"])
        return None

    @property
    def has_device_events(self) -> bool:
        return len(self.device) > 0

    def name_of(self, ids: npt.ArrayLike) -> list[str]:
        names = self.names
        return [names[i] for i in np.asarray(ids).tolist()]
