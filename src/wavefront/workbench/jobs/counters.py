"""``wavefront counters`` as library calls: a request in, a result that owns its JSON document out.

    from wavefront.workbench.jobs import counters as job
    job.counters(job.CountersRequest("profile.csv", device="h100", inspect="inspect.json")).as_dict()
    job.compare(job.CompareRequest("a.csv", "b.csv")).as_dict()         # wavefront.counters.compare/1

A/B: launches are grouped by kernel name, blocks and threads per block. Where both profiles hold at least
:data:`wavefront.workbench.stats.MIN_SAMPLES` launches of a group, each metric is compared with the statistics
``wavefront compare`` uses (:func:`wavefront.workbench.stats.compare`: ratio of medians, bootstrap 95% interval,
Mann-Whitney p); otherwise the medians' plain delta is given, labelled ``"delta"`` with both counts.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from wavefront.workbench import stats
from wavefront.workbench.counters.analysis import KernelRow, analyse, occupancy
from wavefront.workbench.counters.load import load
from wavefront.workbench.counters.model import COMPARE_SCHEMA, SCHEMA, CountersLoadError, Launch, Profile
from wavefront.workbench.document import encode
from wavefront.workbench.hardware import GPU, get_gpu, gpu_from_device_name
from wavefront.workbench.jobs.request import RequestError

#: Metrics compared A/B, per kernel shape (duration in us, bytes, FLOP, occupancy fraction, registers).
COMPARED = ("duration_us", "dram_bytes", "l2_bytes", "l1_bytes", "flops", "achieved_occupancy", "registers")


@dataclass(frozen=True)
class CountersRequest:
    profile: str | Path
    device: str | None = None  # device-table name; None: the one the profile names
    inspect: str | Path | None = None  # a wavefront.inspect/1 document
    traffic: str | Path | None = None  # a wavefront.traffic/1 document


def _document(path: str | Path | None, schema: str, argument: str) -> dict[str, Any] | None:
    if path is None:
        return None
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RequestError(argument, f"cannot read JSON document {path}: {exc}") from None
    if not isinstance(doc, dict) or doc.get("schema") != schema or not isinstance(doc.get("rows"), list):
        got = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
        raise RequestError(argument, f"{path} is not a {schema} document with rows (schema {got!r})")
    return doc


def device_for(profile: Profile, device: str | None) -> GPU:
    try:
        if device:
            return get_gpu(device)
        if profile.device:
            return gpu_from_device_name(profile.device)
    except ValueError as exc:
        raise RequestError("device", str(exc)) from None
    raise RequestError("device", f"{profile.path} names no device; give a device-table name (h100, mi300x)")


@dataclass
class CountersResult:
    SCHEMA: ClassVar[str] = SCHEMA

    profile: Profile
    device: GPU
    rows: list[KernelRow]
    inspect: str | None = None
    traffic: str | None = None

    def as_dict(self) -> dict[str, Any]:
        gaps = sum(bool(r.gaps) for r in self.rows)
        return {"schema": SCHEMA, "profile": self.profile.path, "tool": self.profile.tool,
                "format": self.profile.format, "device": self.device.key, "device_name": self.device.name,
                "hbm_tbps": self.device.hbm_tbps, "matrix_peak_tflops": self.device.bf16_tflops,
                "vector_peak_tflops": self.device.fp32_tflops, "inspect": self.inspect, "traffic": self.traffic,
                "n_launches": len(self.rows), "n_gaps": gaps, "notes": list(self.profile.notes),
                "kernels": encode(self.rows)}


def counters(request: CountersRequest) -> CountersResult:
    """Read, place on the roofline, match to predictions. CountersLoadError / RequestError: one line."""
    profile = load(request.profile)
    gpu = device_for(profile, request.device)
    inspect_doc = _document(request.inspect, "wavefront.inspect/1", "inspect")
    traffic_doc = _document(request.traffic, "wavefront.traffic/1", "traffic")
    return CountersResult(profile, gpu, analyse(profile, gpu, inspect_doc, traffic_doc),
                          str(request.inspect) if request.inspect else None,
                          str(request.traffic) if request.traffic else None)


# -- A/B ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CompareRequest:
    a: str | Path
    b: str | Path
    device: str | None = None  # only needed for AMD occupancy (CU count); None: the file's or none


@dataclass
class MetricDelta:
    kernel: str
    n_blocks: int | None
    threads_per_block: int | None
    metric: str
    method: str  # "stats" | "delta" | "not measured"
    n_a: int
    n_b: int
    median_a: float | None
    median_b: float | None
    ratio: float | None  # median B / median A
    delta: float | None  # median B - median A
    ci_low: float | None = None
    ci_high: float | None = None
    p_value: float | None = None
    verdict: str = ""  # stats: lower | higher | same | unknown; delta: "" (no verdict without repeats)


@dataclass
class CompareResult:
    SCHEMA: ClassVar[str] = COMPARE_SCHEMA

    a: Profile
    b: Profile
    deltas: list[MetricDelta]
    only_a: list[str] = field(default_factory=list)
    only_b: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"schema": COMPARE_SCHEMA, "a": self.a.path, "b": self.b.path, "tool_a": self.a.tool,
                "tool_b": self.b.tool, "min_samples": stats.MIN_SAMPLES, "only_a": self.only_a,
                "only_b": self.only_b, "deltas": encode(self.deltas)}


def _value(la: Launch, metric: str, gpu: GPU | None) -> float | None:
    if metric == "duration_us":
        return la.duration_ns / 1e3 if la.duration_ns is not None else None
    if metric == "achieved_occupancy":
        return occupancy(la, gpu) if gpu else la.achieved_occupancy
    v = getattr(la, metric)
    return float(v) if v is not None else None


def _delta(shape: tuple[str, int | None, int | None], metric: str, a: list[float], b: list[float]) -> MetricDelta:
    kernel, blocks, threads = shape
    if not a or not b:
        return MetricDelta(kernel, blocks, threads, metric, "not measured", len(a), len(b), None, None, None, None)
    ma, mb = statistics.median(a), statistics.median(b)
    base = MetricDelta(kernel, blocks, threads, metric, "delta", len(a), len(b), ma, mb, mb / ma if ma else None,
                       mb - ma)
    positive = all(v > 0 for v in a + b)
    if min(len(a), len(b)) < stats.MIN_SAMPLES or not positive:
        return base
    c = stats.compare(a, b)
    verdict = {"slower": "higher", "faster": "lower"}.get(c.verdict, c.verdict)
    return MetricDelta(kernel, blocks, threads, metric, "stats", c.n_a, c.n_b, c.median_a, c.median_b, c.ratio,
                       c.median_b - c.median_a, c.ci_low, c.ci_high, c.p_value, verdict)


def _groups(profile: Profile) -> dict[tuple[Any, ...], list[Launch]]:
    out: dict[tuple[Any, ...], list[Launch]] = defaultdict(list)
    for la in profile.launches:
        out[la.shape].append(la)
    return out


def compare(request: CompareRequest) -> CompareResult:
    """Per kernel shape and metric: statistics with repeats, a labelled plain delta without."""
    a, b = load(request.a), load(request.b)
    gpu = None
    if request.device or a.device:
        gpu = device_for(a, request.device)
    ga, gb = _groups(a), _groups(b)
    deltas = []
    for shape in [s for s in ga if s in gb]:
        for metric in COMPARED:
            va = [v for v in (_value(la, metric, gpu) for la in ga[shape]) if v is not None]
            vb = [v for v in (_value(la, metric, gpu) for la in gb[shape]) if v is not None]
            deltas.append(_delta(shape, metric, va, vb))
    if not deltas:
        raise CountersLoadError(f"{request.a} and {request.b} share no kernel launch (same name, blocks and "
                                "threads per block); nothing to compare")
    def name(s: tuple[str, int | None, int | None]) -> str:
        return f"{s[0]} [{s[1]} x {s[2]}]"

    return CompareResult(a, b, deltas, [name(s) for s in ga if s not in gb], [name(s) for s in gb if s not in ga])
