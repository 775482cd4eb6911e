"""Holistic Trace Analysis (HTA) definitions computed on our loaded trace, to check agreement with HTA
where the definitions match (``benchmarks/trace_vs_hta.py``, docs/trace.md "Against HTA").

HTA's temporal breakdown and communication/computation overlap (HTA 0.5.0, per rank, whole trace):

- device events: kernels, memcpy and memset whose launching runtime call starts before the last
  ``ProfilerStep`` starts (HTA drops the last step); events without a launch link are dropped;
- ``kernel_time`` = last end - first start of those events; ``idle`` = kernel_time - |union|;
- ``compute`` = |union of compute kernels|; ``non_compute`` = kernel_time - idle - compute;
- ``comp_comm_overlap_pctg`` = 100 * |comm ∩ compute| / |comm|.

By default HTA shrinks every event to whole microseconds (start rounded up, end rounded down; PyTorch
PR 122425) before any of this, unless ``HTA_DISABLE_NS_ROUNDING=1``; ``hta_rounding=True`` does the same,
so both settings can be matched. HTA classifies kernels by
name; we use our classification (:mod:`classify`), so traces whose communication kernels do not match
HTA's ``^nccl.*Kernel`` pattern (RCCL renames, custom collectives) differ on purpose.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from wavefront.workbench.trace.breakdown import find_steps
from wavefront.workbench.trace.classify import COMM, COMPUTE, DeviceClasses, classify_device
from wavefront.workbench.trace.intervals import IntervalSet, intersect, union
from wavefront.workbench.trace.model import Trace


def hta_equivalent(trace: Trace, classes: DeviceClasses | None = None, *, hta_rounding: bool = True) -> dict[str, Any]:
    """HTA's per-rank temporal breakdown and overlap, in microseconds (``*_us``), exact integer nanoseconds
    (``*_ns``) and percent. ValueError when HTA's definitions do not apply (no launch records)."""
    if len(trace.device) == 0:
        raise ValueError("hta_equivalent needs a trace with device events")
    classes = classes if classes is not None else classify_device(trace)
    dev, rt = trace.device, trace.runtime
    keep = classes.runtime_row >= 0
    if not np.any(keep):  # a jax.profiler trace: XLA ops, no runtime launch calls
        raise ValueError("HTA keeps only device events whose launching runtime call is in the trace, and this "
                         "trace records no launch (jax.profiler traces never do)")
    steps, _ = find_steps(trace)
    if len(steps) >= 2:
        last_start = max(s.start_ns for s in steps)
        keep &= rt.ts_ns[np.maximum(classes.runtime_row, 0)] < last_start
    if hta_rounding:
        start = -(-dev.ts_ns // 1000)  # ceil
        end = dev.end_ns // 1000
        unit_ns = 1000  # the sets below are in whole microseconds
    else:
        start, end, unit_ns = dev.ts_ns, dev.end_ns, 1
    start, end, cls = start[keep], end[keep], classes.cls[keep]
    if len(start) == 0:
        raise ValueError("no device event is launched before the last ProfilerStep")
    every = IntervalSet.union_of(start, end)
    compute = IntervalSet.union_of(start[cls == COMPUTE], end[cls == COMPUTE])
    comm = IntervalSet.union_of(start[cls == COMM], end[cls == COMM])
    span = int(end.max() - start.min())
    idle = span - union(every).measure()
    compute_t = compute.measure()
    comm_t = comm.measure()
    ns = {"kernel_time": span * unit_ns, "idle_time": idle * unit_ns, "compute_time": compute_t * unit_ns,
          "non_compute_time": (span - idle - compute_t) * unit_ns}
    return {**{f"{k}_us": v / 1000 for k, v in ns.items()}, **{f"{k}_ns": v for k, v in ns.items()},
            "comp_comm_overlap_pctg": 100.0 * intersect(comm, compute).measure() / comm_t if comm_t else None}
