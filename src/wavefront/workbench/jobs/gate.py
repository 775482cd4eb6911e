"""The job behind ``wavefront gate``: the static half and the perf half in one call, with the policy of
which ``--baseline`` feeds which half.

    from wavefront.workbench.jobs.gate import GateRequest, run
    result = run(GateRequest(baseline=("benchmarks/baselines/static.json",)))
    result.as_dict()      # wavefront.gate/1; result.exit_code: 0 pass, 1 regression

Policy: a baseline whose JSON schema is the static baseline's feeds the static half; any other baseline
(a results document or store) feeds the perf half; with ``static=True`` and no static baseline, a
missing ``.json`` baseline is taken as the static baseline to create (``update``) or to report missing.
Bad input (an unreadable or absent baseline, inspect/traffic documents without a list of rows, an
interrupted run) raises :class:`~wavefront.workbench.jobs.request.RequestError`: it is a usage error
(exit 2), never a regression (exit 1).
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from wavefront import runtime
from wavefront.workbench.bench.regress import check_complete, dynamic_gate
from wavefront.workbench.bench.store import StoreError, open_run
from wavefront.workbench.jobs import inspect as inspect_job
from wavefront.workbench.jobs import traffic as traffic_job
from wavefront.workbench.jobs.ops import use_interpreter
from wavefront.workbench.jobs.request import PhaseProgress, RequestError, phases, read_document
from wavefront.workbench.static import gate as g

SCHEMA = g.SCHEMA
#: The phases run() reports progress for (one ProgressFn each).
PHASES = ("compile", "traffic")


@dataclass(frozen=True)
class GateRequest:
    static: bool = False
    baseline: tuple[str, ...] = ()
    current: str = "latest"  # the run the perf half judges
    store: str = "wavefront-results.sqlite"  # where `current` (and a run-reference baseline) live
    threshold: float = 0.05
    update: bool = False  # rewrite the static baseline from the present state
    targets: tuple[str, ...] = runtime.DEFAULT_TARGETS
    inspect: str | None = None  # a `wavefront inspect --json` document instead of compiling
    traffic: str | None = None  # a `wavefront traffic --json` document instead of counting


@dataclass
class GateResult:
    SCHEMA: ClassVar[str] = SCHEMA

    halves: list[g.HalfResult]
    perf_markdown: str | None = None

    @property
    def passed(self) -> bool:
        return all(h.passed for h in self.halves)

    @property
    def exit_code(self) -> int:
        return 0 if self.passed else 1

    def as_dict(self) -> dict:
        doc = g.gate_document(self.halves)
        if self.perf_markdown is not None:
            doc["perf_markdown"] = self.perf_markdown
        return doc


def split_baselines(request: GateRequest) -> tuple[Path | None, str | None]:
    """(the static baseline, the perf baseline) of a request; see the module docstring."""
    paths = [Path(b) for b in request.baseline]
    static = [p for p in paths if g.is_static_baseline(p)]
    perf = [p for p in paths if p not in static]
    if request.static and not static:
        absent = [p for p in perf if p.suffix == ".json" and not p.exists()]
        if absent:
            static, perf = absent[:1], [p for p in perf if p != absent[0]]
    if len(static) > 1 or len(perf) > 1:
        raise RequestError("baseline", "give at most one static baseline and one perf baseline")
    if not (request.static or static or perf):
        raise RequestError("baseline", "choose a gate half: --static (machine code and bytes) and/or --baseline "
                                       "PERF (timings from `wavefront bench`)")
    static_path = static[0] if static else (g.DEFAULT_STATIC_BASELINE if request.static else None)
    return static_path, str(perf[0]) if perf else None


def _static_half(request: GateRequest, path: Path, progress: PhaseProgress) -> g.HalfResult:
    base = None
    if not request.update:
        try:
            base = g.load_baseline(path)
        except (OSError, ValueError, AttributeError) as exc:
            raise RequestError("baseline", str(exc)) from None
    # Documents first: a bad one fails in a second, not after minutes of compiling.
    inspect_doc = read_document(request.inspect, "inspect", row_keys=("key",)) if request.inspect else None
    traffic_doc = read_document(request.traffic, "traffic", row_keys=("key",)) if request.traffic else None
    if traffic_doc is None:
        use_interpreter()  # before any kernel module loads
    if inspect_doc is None:
        inspect_doc = inspect_job.inspect(inspect_job.InspectRequest(targets=request.targets),
                                          progress("compile")).as_dict()
    if traffic_doc is None:
        traffic_doc = traffic_job.traffic(traffic_job.TrafficRequest(marginal=True), progress("traffic")).as_dict()
    if request.update:
        g.write_baseline(g.static_snapshot(inspect_doc, traffic_doc), path)
        n = len(inspect_doc["rows"]) + len(traffic_doc["rows"])
        return g.HalfResult("static", notes=[f"baseline rewritten: {path} ({n} rows)"], compared=0)
    return g.check_pipelines(g.static_half(inspect_doc, traffic_doc, base))


def _open(ref: str, store: str, argument: str):
    if Path(ref).is_dir():
        raise RequestError(argument, f"{ref} is a directory; give a results document, store or run reference")
    if Path(ref).suffix in (".json", ".sqlite") and not Path(ref).exists():
        raise RequestError(argument, f"no such file: {ref}")
    try:
        run = open_run(ref, store)
        check_complete(run, ref)
    except (StoreError, sqlite3.Error, OSError, ValueError, KeyError, TypeError) as exc:
        raise RequestError(argument, f"cannot read {ref}: {exc}") from None
    return run


def _perf_half(request: GateRequest, baseline_ref: str) -> tuple[g.HalfResult, str]:
    if Path(request.store).is_dir():
        raise RequestError("store", f"{request.store} is a directory; give the results store file")
    baseline = _open(baseline_ref, request.store, "baseline")
    current = _open(request.current, request.store, "current")
    try:
        report = dynamic_gate(baseline, current, threshold=request.threshold)
    except ValueError as exc:  # different devices or timing kinds: not comparable
        raise RequestError("baseline", str(exc)) from None
    findings = [g.Finding("perf", r.label, r.status, r.why or r.status) for r in report.failures]
    notes = list(report.notes) + ([] if report.rows else ["the runs hold no timings: nothing to gate (a CPU "
                                                           "`wavefront bench` times only with --cpu-timing)"])
    half = g.HalfResult("perf", findings=findings, notes=notes, compared=len(report.rows))
    return half, report.markdown()


def run(request: GateRequest, on_progress: PhaseProgress | None = None) -> GateResult:
    """Run the gate's halves; see the module docstring; `on_progress(phase)` gives each phase's ProgressFn
    (:data:`PHASES`). Raises RequestError on bad input."""
    if request.threshold < 0:
        raise RequestError("threshold", f"must be >= 0; got {request.threshold}")
    static_path, perf_ref = split_baselines(request)
    progress = phases(on_progress)
    result = GateResult([])
    if static_path is not None:
        result.halves.append(_static_half(request, static_path, progress))
    if perf_ref is not None:
        half, result.perf_markdown = _perf_half(request, perf_ref)
        result.halves.append(half)
    return result
