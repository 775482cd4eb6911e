"""``wavefront traffic``: count each op's bytes under the instrumented interpreter.

    from wavefront.workbench.jobs import traffic
    traffic.traffic(traffic.TrafficRequest(ops=("softmax",), marginal=False)).as_dict()   # wavefront.traffic/1

The quick sweep (the default ``wavefront bench`` on a CPU) counts one case per op:
:func:`quick_traffic_cases` (the op's first traffic case, or its smallest correctness case when that one is
too large to count quickly).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from wavefront.workbench.jobs.ops import check_ops, torch_dtype, use_interpreter
from wavefront.workbench.jobs.request import ProgressFn
from wavefront.workbench.static.capture import op_modes
from wavefront.workbench.static.traffic import TrafficReport, traffic_cases, traffic_ops

#: The quick traffic sweep counts a case only if its minimal bytes stay below this; above it, counting
#: every address costs minutes and gigabytes (linear_cross_entropy's 8k-token case: 133 s, 4.5 GB).
QUICK_TRAFFIC_MAX_BYTES = 16 << 20


def quick_traffic_cases(spec, dtype=None) -> list:
    """The traffic case of the quick sweep: the op's first traffic case if its minimal bytes stay under
    :data:`QUICK_TRAFFIC_MAX_BYTES`, else its smallest non-slow correctness case."""
    dtype = dtype or torch.bfloat16

    def size(case) -> int:
        return max(spec.min_bytes(case, dtype, m) for m in op_modes(spec))

    first = traffic_cases(spec)[0]
    if size(first) <= QUICK_TRAFFIC_MAX_BYTES:
        return [first]
    return [min((c for c in spec.cases if not c.slow), key=size)]


@dataclass(frozen=True)
class TrafficRequest:
    ops: tuple[str, ...] = ()
    dtype: str = "bf16"
    marginal: bool = True  # also count taller cases for the per-row ratio
    quick: bool = False  # one small case per op (quick_traffic_cases)


def traffic(request: TrafficRequest, on_progress: ProgressFn | None = None) -> TrafficReport:
    """Count each op's bytes under the instrumented interpreter: a TrafficReport (wavefront.traffic/1)."""
    check_ops(request.ops)
    dtype = torch_dtype(request.dtype)
    use_interpreter()
    cases = (lambda spec: quick_traffic_cases(spec, dtype)) if request.quick else None
    return traffic_ops(request.ops or None, dtype, marginal=request.marginal, cases=cases, on_progress=on_progress)
