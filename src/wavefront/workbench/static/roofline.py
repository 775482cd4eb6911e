"""The roofline model: where each registered op's cases sit on each device in the table.

For a case in a mode, with F = ``spec.flops(case, mode)`` and B = ``spec.min_bytes(case, dtype, mode)``:

    intensity      = F / B                                     FLOP per byte of compulsory traffic
    t_memory_us    = B / HBM bandwidth
    t_compute_us   = F / compute peak                          matrix peak of the dtype for ops whose
                                                               kernels issue matrix instructions, the
                                                               FP32 vector peak otherwise
    attainable_us  = max(t_memory_us, t_compute_us)            the best time the device allows
    bound          = "memory" if t_memory_us >= t_compute_us else "compute"

With a traffic report, ``kernel_bytes`` = B x the op's measured traffic ratio (the marginal per-row ratio
where there is one) and ``kernel_attainable_us`` is the roof for the bytes the kernels really move. With a
measured time (the bench results store, a real GPU), ``pct_of_roof`` = attainable / measured x 100.
Peaks are the table's dense vendor figures (``workbench.hardware``); no time here is a measurement.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch

from wavefront import runtime
from wavefront.ops import REGISTRY
from wavefront.ops._spec import Case, OpSpec, dtype_name
from wavefront.workbench.document import encode
from wavefront.workbench.hardware import GPU, get_gpu, gpu_for_target, gpu_from_device_name
from wavefront.workbench.static.capture import capture, op_modes
from wavefront.workbench.static.inspect import compile_jobs, job_for, specialization_key

SCHEMA = "wavefront.roofline/1"

#: (op, case, mode, dtype, device key) -> measured duration in microseconds.
MeasuredTimes = Mapping[tuple[str, str, str, str, str], float]


@dataclass
class RooflinePoint:
    op: str
    mode: str
    case: str
    dtype: str
    device: str
    flops: float
    min_bytes: int
    intensity: float  # FLOP/byte
    compute_roof: str  # "matrix" | "vector"
    peak_tflops: float
    hbm_tbps: float
    ridge: float  # FLOP/byte where the compute roof meets the memory roof
    t_memory_us: float
    t_compute_us: float
    attainable_us: float
    bound: str
    kernel_bytes: int | None = None
    kernel_attainable_us: float | None = None
    measured_us: float | None = None
    pct_of_roof: float | None = None


@dataclass
class RooflineReport:
    SCHEMA: ClassVar[str] = SCHEMA

    device: GPU
    dtype: str
    points: list[RooflinePoint]

    def as_dict(self) -> dict:
        return {"schema": SCHEMA, "device": self.device.as_dict(), "dtype": self.dtype,
                "note": "modeled from dense vendor peaks; not a measurement",
                "points": encode(self.points)}


def point(spec: OpSpec, case: Case, mode: str, dtype: torch.dtype, gpu: GPU, *, uses_matrix: bool = False,
          traffic_ratio: float | None = None, measured_us: float | None = None) -> RooflinePoint:
    """One case of one op in one mode on one device."""
    flops = float(spec.flops(case, mode))
    nbytes = int(spec.min_bytes(case, dtype, mode))
    if nbytes <= 0:
        raise ValueError(f"{spec.name}/{case.name}/{mode}: min_bytes must be positive, got {nbytes}")
    name = dtype_name(dtype)
    if uses_matrix:
        roof, peak = "matrix", gpu.peak_tflops(name if name in ("bf16", "fp16", "fp8") else "tf32")
    else:
        roof, peak = "vector", gpu.fp32_tflops
    bw = gpu.hbm_tbps
    t_mem = nbytes / (bw * 1e12) * 1e6
    t_cmp = flops / (peak * 1e12) * 1e6
    attainable = max(t_mem, t_cmp)
    p = RooflinePoint(spec.name, mode, case.name, name, gpu.key, flops, nbytes, flops / nbytes, roof, peak, bw,
                      peak / bw, t_mem, t_cmp, attainable, "memory" if t_mem >= t_cmp else "compute")
    if traffic_ratio is not None:
        p.kernel_bytes = round(nbytes * traffic_ratio)
        p.kernel_attainable_us = max(p.kernel_bytes / (bw * 1e12) * 1e6, t_cmp)
    if measured_us is not None:
        if measured_us <= 0:
            raise ValueError(f"measured time must be positive, got {measured_us} us")
        p.measured_us = measured_us
        p.pct_of_roof = attainable / measured_us * 100
    return p


def traffic_ratios(traffic_doc: dict) -> dict[tuple[str, str, str], float]:
    """(op, mode, case) -> the traffic ratio to apply to min_bytes (marginal per-row ratio when present)."""
    out = {}
    for r in traffic_doc.get("rows", []):
        if r.get("error"):
            continue
        ratio = r.get("marginal_ratio") or r.get("ratio_min")
        if ratio:
            out[(r["op"], r["mode"], r["case"])] = float(ratio)
    return out


def load_measured(path: str | Path) -> dict[tuple[str, str, str, str, str], float]:
    """Measured times from a JSON file: a list (or ``{"results": [...]}``) of records with op, case, mode,
    dtype, device (a device-table name) and dur_us."""
    doc = json.loads(Path(path).read_text())
    records = doc.get("results", []) if isinstance(doc, dict) else doc
    out = {}
    for i, r in enumerate(records):
        try:
            key = (r["op"], r["case"], r["mode"], r["dtype"], get_gpu(r["device"]).key)
            out[key] = float(r["dur_us"])
        except (KeyError, TypeError) as exc:
            raise ValueError(f"{path}: record {i} needs op, case, mode, dtype, device, dur_us ({exc})") from None
    return out


def measured_times(run, provider: str = "wavefront") -> dict[tuple[str, str, str, str, str], float]:
    """Median times of one stored GPU run (``wavefront bench`` on a GPU; a bench StoredRun) for `provider`,
    keyed like :func:`load_measured`. A CPU-timed run is refused: interpreter wall times are no performance
    figures."""
    if not run.info.is_gpu:
        raise ValueError(f"run {run.info.id} was not timed on a GPU ({run.info.timing}); "
                         "its times are not performance figures")
    key = gpu_from_device_name(run.info.device_name).key
    return {(m.op, m.case, m.mode, m.dtype, key): m.median_us for m in run.measurements
            if m.ok and m.provider == provider}


def roofline(device: str | GPU, ops: Iterable[str] | None = None, dtype: torch.dtype = torch.bfloat16, *,
             matrix_ops: Iterable[str] = (), traffic: dict | None = None, measured: MeasuredTimes | None = None,
             cases: Callable[[OpSpec], Iterable[Case]] | None = None) -> RooflineReport:
    """Every bench case of every registered op (or the named ones), both modes, on `device`.

    matrix_ops: ops whose kernels use matrix instructions (see :func:`matrix_ops_from_inspect`).
    traffic: a ``wavefront traffic`` document, for kernel_bytes. measured: times from real runs.
    """
    gpu = device if isinstance(device, GPU) else get_gpu(device)
    names = list(ops) if ops else list(REGISTRY)
    for n in names:
        if n not in REGISTRY:
            raise ValueError(f"unknown op {n!r}; registered ops: {', '.join(sorted(REGISTRY))}")
    matrix = set(matrix_ops)
    ratios = traffic_ratios(traffic) if traffic else {}
    measured = measured or {}
    points = []
    for n in names:
        spec = REGISTRY[n]
        for case in (cases(spec) if cases else spec.bench_cases):
            for mode in op_modes(spec):
                points.append(point(spec, case, mode, dtype, gpu, uses_matrix=n in matrix,
                                    traffic_ratio=ratios.get((n, mode, case.name)),
                                    measured_us=measured.get((n, case.name, mode, dtype_name(dtype), gpu.key))))
    return RooflineReport(gpu, dtype_name(dtype), points)


def matrix_ops_from_inspect(inspect_doc: dict) -> set[str]:
    """Ops with a matrix instruction in any compiled kernel of an inspect document."""
    return {r["op"] for r in inspect_doc.get("rows", []) if r.get("matrix_families")}


def detect_matrix_ops(ops: Iterable[str] | None = None, target: str = "sm_90") -> set[str]:
    """Ops whose kernels contain tt.dot, from Triton's front end only (fast; no GPU code generated)."""
    names = list(ops) if ops else list(REGISTRY)
    jobs = {}
    for n in names:
        spec = REGISTRY[n]
        with runtime.assume_target(target, gpu_for_target(target).sm_count):
            captured = capture(spec, spec.bench_cases[0], torch.bfloat16, execute=False, cheap=True)
        jobs[n] = [job_for(la, target, frontend_only=True) for ls in captured.launches.values() for la in ls]
    results = compile_jobs([j for js in jobs.values() for j in js])
    out = set()
    for n, js in jobs.items():
        if any(results[specialization_key(j)].uses_dot for j in js):
            out.add(n)
    return out
