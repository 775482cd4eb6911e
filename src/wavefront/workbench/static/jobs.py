"""The static verbs as library calls: a typed request in, a report that owns its JSON document out.

    from wavefront.workbench.static import jobs
    jobs.inspect(jobs.InspectRequest(ops=("softmax",), targets=("sm_90",))).as_dict()    # wavefront.inspect/1
    jobs.traffic(jobs.TrafficRequest(ops=("softmax",), marginal=False)).as_dict()        # wavefront.traffic/1
    jobs.roofline(jobs.RooflineRequest(device="mi300x", ops=("softmax",))).as_dict()     # wavefront.roofline/1

``wavefront inspect|traffic|roofline`` are these calls plus rendering. Bad input raises
:class:`RequestError`, which names the request field (the CLI option of the same name).

The representative subsets the default ``wavefront bench`` sweep uses on a CPU live here too:
:func:`quick_inspect_cases` (each op's first bench case) and :func:`quick_traffic_cases` (each op's first
traffic case, or its smallest correctness case when that one is too large to count quickly).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from wavefront import runtime

#: on_progress(done, total, what): called as the job advances (total 0 while unknown).
ProgressFn = Callable[[int, int, str], None]

DTYPES = ("fp32", "bf16", "fp16")
#: The quick traffic sweep counts a case only if its minimal bytes stay below this; above it, counting
#: every address costs minutes and gigabytes (linear_cross_entropy's 8k-token case: 133 s, 4.5 GB).
QUICK_TRAFFIC_MAX_BYTES = 16 << 20


class RequestError(ValueError):
    """A request field holds a bad value; ``argument`` names the field (and the CLI option)."""

    def __init__(self, argument: str, message: str):
        super().__init__(f"{argument}: {message}")
        self.argument = argument
        self.message = message


def torch_dtype(name: str):
    import torch

    table = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    if name not in table:
        raise RequestError("dtype", f"must be one of {', '.join(DTYPES)}; got {name!r}")
    return table[name]


def check_ops(ops: Iterable[str] | None, argument: str = "op") -> tuple[str, ...]:
    from wavefront.ops import REGISTRY

    for name in ops or ():
        if name not in REGISTRY:
            raise RequestError(argument, f"unknown op {name!r}; registered ops: {', '.join(sorted(REGISTRY))}")
    return tuple(ops or ())


def check_targets(targets: Iterable[str], argument: str = "targets") -> tuple[str, ...]:
    out = tuple(t.strip() for t in targets if t.strip())
    if not out:
        raise RequestError(argument, "give at least one target")
    for t in out:
        if t not in runtime.ARCHS or runtime.ARCHS[t].family == "cpu":
            raise RequestError(argument, f"unknown target {t!r}; choose from {', '.join(runtime.DEFAULT_TARGETS)}")
    return out


def split_targets(text: str, argument: str = "targets") -> tuple[str, ...]:
    """A comma-separated target list ('none' or '' for no target)."""
    if text.strip().lower() in ("", "none"):
        return ()
    return check_targets(text.split(","), argument)


def use_interpreter() -> None:
    """Traffic is counted under the interpreter, also on a GPU machine: turn it on before any kernel module
    is imported (kernel modules load lazily, on an op's first call)."""
    if not runtime.interpreting():
        os.environ["TRITON_INTERPRET"] = "1"


def read_document(path: str | Path, kind: str, argument: str | None = None, row_keys: tuple[str, ...] = ()) -> dict:
    """A ``wavefront <kind> --json`` document: an object whose ``rows`` is a list of objects (each holding
    `row_keys`), and whose ``schema``, when present, is ``wavefront.<kind>/N``. Else a RequestError."""
    argument = argument or kind
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise RequestError(argument, f"cannot read {path}: {exc}") from None
    if not isinstance(doc, dict):
        raise RequestError(argument, f"{path} is not a `wavefront {kind} --json` document (not a JSON object)")
    schema = doc.get("schema")
    if schema is not None and not str(schema).startswith(f"wavefront.{kind}/"):
        raise RequestError(argument, f"{path} has schema {schema!r}; expected a `wavefront {kind} --json` "
                                     f"document (wavefront.{kind}/1)")
    rows = doc.get("rows")
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        what = "no 'rows'" if rows is None else "'rows' that is not a list of objects"
        raise RequestError(argument, f"{path} has {what}: not a `wavefront {kind} --json` document")
    for i, r in enumerate(rows):
        missing = [k for k in row_keys if k not in r]
        if missing:
            raise RequestError(argument, f"{path}: row {i} lacks {', '.join(missing)}: not a `wavefront {kind} "
                                         "--json` document")
    return doc


def quick_inspect_cases(spec) -> list:
    """The inspect cases of the quick sweep: each op's first bench case (its kernels are the same at the
    other shapes; only their launch configurations differ)."""
    return list(spec.bench_cases[:1])


def quick_traffic_cases(spec, dtype=None) -> list:
    """The traffic case of the quick sweep: the op's first traffic case if its minimal bytes stay under
    :data:`QUICK_TRAFFIC_MAX_BYTES`, else its smallest non-slow correctness case."""
    import torch

    from wavefront.workbench.static.capture import op_modes
    from wavefront.workbench.static.traffic import traffic_cases

    dtype = dtype or torch.bfloat16

    def size(case) -> int:
        return max(spec.min_bytes(case, dtype, m) for m in op_modes(spec))

    first = traffic_cases(spec)[0]
    if size(first) <= QUICK_TRAFFIC_MAX_BYTES:
        return [first]
    return [min((c for c in spec.cases if not c.slow), key=size)]


@dataclass(frozen=True)
class InspectRequest:
    ops: tuple[str, ...] = ()  # () = the whole registry
    targets: tuple[str, ...] = runtime.DEFAULT_TARGETS
    dtype: str = "bf16"
    asm_dir: str | None = None
    workers: int | None = None
    quick: bool = False  # each op's first bench case only (quick_inspect_cases)


def inspect(request: InspectRequest, on_progress: ProgressFn | None = None):
    """Compile every (or the named) op's kernels for the targets: an InspectReport (wavefront.inspect/1)."""
    from wavefront.workbench.static.inspect import inspect_ops

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


def gpu_configs(request: ConfigsRequest):
    """Every launch configuration the targets' dispatchers choose at the bench shapes, each with the small problem
    that selects it on the interpreter (static.configs): a GpuConfigs (wavefront.gpu-configs/1). Records only."""
    from wavefront.workbench.static.configs import gpu_configs as enumerate_configs

    check_ops(request.ops)
    targets = check_targets(request.targets)
    return enumerate_configs(targets, request.ops or None, torch_dtype(request.dtype))


@dataclass(frozen=True)
class TrafficRequest:
    ops: tuple[str, ...] = ()
    dtype: str = "bf16"
    marginal: bool = True  # also count taller cases for the per-row ratio
    quick: bool = False  # one small case per op (quick_traffic_cases)


def traffic(request: TrafficRequest, on_progress: ProgressFn | None = None):
    """Count each op's bytes under the instrumented interpreter: a TrafficReport (wavefront.traffic/1)."""
    from wavefront.workbench.static.traffic import traffic_ops

    check_ops(request.ops)
    dtype = torch_dtype(request.dtype)
    use_interpreter()
    cases = (lambda spec: quick_traffic_cases(spec, dtype)) if request.quick else None
    return traffic_ops(request.ops or None, dtype, marginal=request.marginal, cases=cases, on_progress=on_progress)


@dataclass(frozen=True)
class RooflineRequest:
    device: str = "h100"  # a device-table name
    ops: tuple[str, ...] = ()
    dtype: str = "bf16"
    traffic: str | None = None  # a `wavefront traffic --json` document
    inspect: str | None = None  # a `wavefront inspect --json` document (which ops use matrix units)
    measured: str | None = None  # JSON records of measured GPU times
    store: str | None = None  # a results store: the measured times of its run `run`
    run: str = "latest"


def roofline(request: RooflineRequest):
    """Every bench case of every (or the named) op on a device of the table: a RooflineReport
    (wavefront.roofline/1). Matrix use comes from the inspect document, else from Triton's front end."""
    from wavefront.workbench.hardware import get_gpu
    from wavefront.workbench.static import roofline as rl

    check_ops(request.ops)
    try:
        gpu = get_gpu(request.device)
    except ValueError as exc:
        raise RequestError("device", str(exc)) from None
    dtype = torch_dtype(request.dtype)
    traffic_doc = read_document(request.traffic, "traffic") if request.traffic else None
    inspect_doc = read_document(request.inspect, "inspect") if request.inspect else None
    times: dict = {}
    if request.measured:
        try:
            times.update(rl.load_measured(request.measured))
        except (OSError, ValueError, AttributeError, TypeError) as exc:
            raise RequestError("measured", f"cannot read {request.measured}: {exc}") from None
    if request.store is not None:
        times.update(_store_times(request.store, request.run))
    matrix = (rl.matrix_ops_from_inspect(inspect_doc) if inspect_doc is not None
              else rl.detect_matrix_ops(request.ops or None, target=gpu.arch))
    return rl.roofline(gpu, request.ops or None, dtype, matrix_ops=matrix, traffic=traffic_doc,
                       measured=times or None)


def _store_times(store: str, run: str) -> dict:
    import sqlite3

    from wavefront.workbench.bench.store import StoreError
    from wavefront.workbench.static import roofline as rl

    if Path(store).is_dir():
        raise RequestError("store", f"{store} is a directory; give the results store file")
    try:
        return rl.measured_from_store(store, run)
    except (StoreError, ValueError, sqlite3.Error) as exc:
        raise RequestError("store", str(exc)) from None
