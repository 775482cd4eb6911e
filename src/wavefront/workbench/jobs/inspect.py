"""``wavefront inspect``: compile every (or the named) op's kernels for GPU targets and read the machine
code; and the launch configurations the targets' dispatchers choose (``--configs``).

    from wavefront.workbench.jobs import inspect
    inspect.inspect(inspect.InspectRequest(ops=("softmax",), targets=("sm_90",))).as_dict()   # wavefront.inspect/1

The quick sweep (the default ``wavefront bench`` on a CPU) takes each op's first bench case:
:func:`quick_inspect_cases` (its kernels are the same at the other shapes; only their launch
configurations differ).
"""

from __future__ import annotations

from dataclasses import dataclass

from wavefront import runtime
from wavefront.workbench.jobs.ops import check_ops, check_targets, torch_dtype
from wavefront.workbench.jobs.request import ProgressFn, RequestError
from wavefront.workbench.static.configs import GpuConfigs
from wavefront.workbench.static.configs import gpu_configs as enumerate_configs
from wavefront.workbench.static.inspect import InspectReport, inspect_ops


def quick_inspect_cases(spec) -> list:
    """The inspect cases of the quick sweep: each op's first bench case."""
    return list(spec.bench_cases[:1])


@dataclass(frozen=True)
class InspectRequest:
    ops: tuple[str, ...] = ()  # () = the whole registry
    targets: tuple[str, ...] = runtime.DEFAULT_TARGETS
    dtype: str = "bf16"
    asm_dir: str | None = None
    workers: int | None = None
    quick: bool = False  # each op's first bench case only (quick_inspect_cases)


def inspect(request: InspectRequest, on_progress: ProgressFn | None = None) -> InspectReport:
    """Compile every (or the named) op's kernels for the targets: an InspectReport (wavefront.inspect/1)."""
    check_ops(request.ops)
    targets = check_targets(request.targets)
    if request.workers is not None and request.workers < 1:
        raise RequestError("workers", f"must be >= 1; got {request.workers}")
    return inspect_ops(request.ops or None, targets, torch_dtype(request.dtype), workers=request.workers,
                       asm_dir=request.asm_dir, on_progress=on_progress,
                       cases=quick_inspect_cases if request.quick else None)


@dataclass(frozen=True)
class ConfigsRequest:
    ops: tuple[str, ...] = ()  # () = the whole registry
    targets: tuple[str, ...] = ("sm_90", "sm_100", "gfx942")
    dtype: str = "bf16"


def gpu_configs(request: ConfigsRequest) -> GpuConfigs:
    """Every launch configuration the targets' dispatchers choose at the bench shapes, each with the small problem
    that selects it on the interpreter (static.configs): a GpuConfigs (wavefront.gpu-configs/1). Records only."""
    check_ops(request.ops)
    targets = check_targets(request.targets)
    return enumerate_configs(targets, request.ops or None, torch_dtype(request.dtype))
