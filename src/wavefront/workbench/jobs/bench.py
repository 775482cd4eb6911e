"""The main job, ``wavefront bench``, as a library call: a BenchRequest in, a BenchResult out.

    from wavefront.workbench.jobs.bench import BenchRequest, plan, run
    result = run(BenchRequest(op=("softmax",), store=None, report=None))
    result.as_dict()        # the wavefront.bench/1 document; result.exit_code: 1 if a case failed

What runs (:func:`plan` says it up front, with a rough duration):

- correctness of each op against its float64 reference, forward and backward. On a CPU the default is
  the quick sweep, one case per op in every dtype (:func:`quick_correctness_case`); ``full=True`` checks
  every non-slow case, as on a GPU;
- the modeled roofline of every bench case on a device of the table (arithmetic only);
- timings against the baselines on a GPU (on a CPU only with ``cpu_timing``, labelled: not performance);
- on a CPU, the static sections of the dashboard: machine code for two targets (inspect) and bytes moved
  (traffic); the quick sweep takes a representative case per op (jobs/inspect.py, jobs/traffic.py);
- the run goes to the results store, marked ``extra["status"] = "incomplete"`` until it completes (an
  interrupted run stays so, and the gate refuses it), and the dashboard is written.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import torch

from wavefront import runtime
from wavefront.kernels._memcheck import env_mode
from wavefront.memcheck import checking
from wavefront.ops import REGISTRY
from wavefront.ops._spec import dtype_name
from wavefront.workbench.bench import harness as H
from wavefront.workbench.bench.correctness import check_case, iter_checks
from wavefront.workbench.bench.model import model_case
from wavefront.workbench.bench.provenance import collect_run_info
from wavefront.workbench.bench.providers import PROVIDERS
from wavefront.workbench.bench.records import TIMING_CPU, TIMING_GPU, TIMING_NONE, CorrectnessRow, StoredRun
from wavefront.workbench.bench.runnable import MODES, modes_for
from wavefront.workbench.bench.store import ResultStore, StoreError
from wavefront.workbench.document import encode, write_json
from wavefront.workbench.hardware import get_gpu, gpu_from_device_name
from wavefront.workbench.jobs import inspect as inspect_job
from wavefront.workbench.jobs import traffic as traffic_job
from wavefront.workbench.jobs.ops import check_ops, check_targets, torch_dtype
from wavefront.workbench.jobs.request import DTYPES, PhaseProgress, RequestError, phases
from wavefront.workbench.report import write_report

SCHEMA = "wavefront.bench/1"
DEFAULT_STORE = "wavefront-results.sqlite"
DEFAULT_REPORT = "artifacts/wavefront-report.html"
DEFAULT_INSPECT_TARGETS = ("sm_90", "gfx942")
#: The full CPU sweep (every non-slow case, every kernel and traffic case), as issue #13 measured it on a
#: 2-core machine before the quick sweep became the default; not re-run here (over the memory budget).
FULL_SWEEP_COST = "about 17 min and 7.5 GiB peak on 2 CPU cores"
#: Rough CPU seconds per unit of work, fitted to `wavefront bench` (the quick sweep: 54 CPU-s for 36 checks,
#: 24 op x target compiles and 12 traffic cases; docs/bench.md): enough to say "about N minutes" up front.
_COST_S = {"check": 0.3, "inspect": 0.6, "traffic": 1.5, "timing": 2.0, "fixed": 10.0}
STATUS_COMPLETE, STATUS_INCOMPLETE = "complete", "incomplete"

#: The phases run() reports progress for (one ProgressFn each): correctness, timing, inspect, traffic.
PHASES = ("correctness", "timing", "inspect", "traffic")


@dataclass(frozen=True)
class BenchRequest:
    op: tuple[str, ...] = ()  # () = the whole registry
    mode: tuple[str, ...] = ()  # () = every mode
    provider: tuple[str, ...] = ()  # () = every provider
    dtype: tuple[str, ...] = ()  # correctness: () = every dtype of the op; timing: () = bf16
    case: tuple[str, ...] = ()  # case names; overrides the quick sweep's choice
    device: str | None = None  # "cuda" | "cpu"; None: cuda when present
    device_model: str | None = None  # device-table row for the modeled roofline (default: the GPU, else h100)
    full: bool = False  # CPU: every non-slow case, kernel and traffic case (FULL_SWEEP_COST)
    slow: bool = False  # include the correctness cases marked slow
    reps: int = 30
    warmup: int = 5
    budget_s: float | None = None
    cpu_timing: bool = False
    skip_correctness: bool = False
    store: str | None = DEFAULT_STORE  # None: keep nothing (a temporary store feeds the dashboard)
    report: str | None = DEFAULT_REPORT  # None: no dashboard
    doc: tuple[str, ...] = ()  # more JSON documents for the dashboard
    inspect_targets: tuple[str, ...] = DEFAULT_INSPECT_TARGETS  # () = no inspect section
    traffic: bool = True
    label: str = ""
    memcheck: bool = False  # correctness under memcheck (interpreted kernels' accesses bounds-checked)


@dataclass
class BenchPlan:
    """What a request will run, resolved and validated."""

    request: BenchRequest
    device: str
    gpu: object  # the device-table row
    timing: str
    checks: list[tuple]  # (spec, case, dtype)
    modeled: list  # Modeled points
    timing_items: list
    timing_config: object | None
    inspect_targets: tuple[str, ...]
    traffic: bool

    @property
    def quick(self) -> bool:
        return self.device == "cpu" and not self.request.full

    def estimate_s(self) -> float:
        """CPU seconds the quick sweep's work should take (rough; a busy machine takes longer in wall time)."""
        n_ops = len(self.request.op or REGISTRY)
        n_inspect = len(self.inspect_targets) * n_ops
        n_traffic = n_ops if self.traffic else 0
        return (_COST_S["fixed"] + _COST_S["check"] * len(self.checks) + _COST_S["inspect"] * n_inspect
                + _COST_S["traffic"] * n_traffic + _COST_S["timing"] * len(self.timing_items))

    def describe(self) -> list[str]:
        sweep = "quick CPU sweep (--full: every case, " + FULL_SWEEP_COST + ")" if self.quick else "full sweep"
        lines = [f"{sweep} on {self.device}: {len(self.checks)} correctness checks, "
                 f"{len(self.modeled)} modeled roofline points on {self.gpu.name}"]
        if self.timing_items:
            lines.append(f"timing: {len(self.timing_items)} op x case x mode items ({self.timing})")
        if self.inspect_targets:
            lines.append(f"inspect: kernels compiled for {', '.join(self.inspect_targets)}")
        if self.traffic:
            lines.append("traffic: bytes counted by the instrumented interpreter")
        if self.device != "cpu":
            lines.append("on a GPU: minutes, most of it timing")
        elif self.quick:
            lines.append(f"roughly {max(1, round(self.estimate_s() / 60))} min of CPU time (longer on a busy machine)")
        else:
            lines.append(f"the full sweep of every op: {FULL_SWEEP_COST}")
        return lines


@dataclass
class BenchResult:
    """The outcome of a run; ``as_dict()`` is its ``wavefront.bench/1`` document."""

    SCHEMA: ClassVar[str] = SCHEMA


    plan: BenchPlan
    runtime: dict
    run_id: int | None
    store: str | None
    report: str | None
    documents: dict[str, str]
    results: list  # CaseCheck
    run: object  # StoredRun
    skipped: dict[str, str] = field(default_factory=dict)  # section -> why it is missing
    findings: dict[str, str] = field(default_factory=dict)  # section -> what it found, in one line

    @property
    def failures(self) -> list:
        return [r for r in self.results if not r.passed]

    @property
    def exit_code(self) -> int:
        return 1 if self.failures else 0

    def as_dict(self) -> dict:
        return {"schema": SCHEMA, "runtime": self.runtime, "run_id": self.run_id, "store": self.store,
                "report": self.report, "sweep": "quick" if self.plan.quick else "full", "documents": self.documents,
                "skipped": self.skipped, "findings": self.findings, "n_cases": len(self.results),
                "n_failed": len(self.failures),
                "results": [r.as_dict() for r in self.results], "modeled": [p.as_dict() for p in self.plan.modeled],
                "run": encode(self.run)}


def quick_correctness_case(spec):
    """The quick sweep's case: the op's non-power-of-two case where it has one (the regime kernels most
    often get wrong: masked tails), else its first non-slow case."""
    cases = [c for c in spec.cases if not c.slow]
    return next((c for c in cases if c.name == "npow2"), cases[0])


def _device(request: BenchRequest) -> str:
    if request.device not in (None, "cpu", "cuda"):
        raise RequestError("device", f"must be cuda or cpu; got {request.device!r}")
    if request.device == "cuda" and not torch.cuda.is_available():
        raise RequestError("device", "cuda: torch sees no GPU on this machine")
    return request.device or ("cuda" if torch.cuda.is_available() else "cpu")


def _gpu(request: BenchRequest, device: str):
    try:
        if request.device_model:
            return get_gpu(request.device_model)
        return gpu_from_device_name(torch.cuda.get_device_name()) if device == "cuda" else get_gpu("h100")
    except ValueError as exc:
        if request.device_model:
            raise RequestError("device_model", str(exc)) from None
        raise RequestError("device_model", f"{exc}; pass a device-table row") from None


def _checks(request: BenchRequest, device: str) -> list[tuple]:
    if request.skip_correctness:
        return []
    dtypes = [torch_dtype(d) for d in request.dtype] or None
    todo = list(iter_checks(request.op or None, dtypes, device, request.slow))
    if request.case:
        return [t for t in todo if t[1].name in request.case]
    if device == "cpu" and not request.full:
        quick = {name: quick_correctness_case(REGISTRY[name]).name for name in request.op or REGISTRY}
        todo = [t for t in todo if t[1].name == quick[t[0].name]]
    return todo


def _check_cases(request: BenchRequest) -> None:
    known = {c.name for n in request.op or REGISTRY for c in (*REGISTRY[n].cases, *REGISTRY[n].bench_cases)}
    unknown = [c for c in request.case if c not in known]
    if unknown:
        raise RequestError("case", f"no case named {', '.join(map(repr, unknown))} in "
                                   f"{', '.join(request.op) if request.op else 'the registry'}; cases: "
                                   f"{', '.join(sorted(known))}")


def plan(request: BenchRequest) -> BenchPlan:
    """Validate a request and resolve what it will run (nothing runs). Raises RequestError."""
    check_ops(request.op)
    for m in request.mode:
        if m not in MODES:
            raise RequestError("mode", f"must be one of {', '.join(MODES)}; got {m!r}")
    for p in request.provider:
        if p not in PROVIDERS:
            raise RequestError("provider", f"must be one of {', '.join(PROVIDERS)}; got {p!r}")
    for d in request.dtype:
        if d not in DTYPES:
            raise RequestError("dtype", f"must be one of {', '.join(DTYPES)}; got {d!r}")
    _check_cases(request)
    device = _device(request)
    on_gpu = device == "cuda"
    if request.reps < 1 or (on_gpu and request.reps < 30):
        raise RequestError("reps", f"must be >= 30 on a GPU (>= 1 on CPU); got {request.reps}")
    if request.warmup < 0:
        raise RequestError("warmup", f"must be >= 0; got {request.warmup}")
    try:
        env_mode()  # WAVEFRONT_MEMCHECK: a bad value fails here, not in every case
    except ValueError as exc:
        raise RequestError("memcheck", str(exc)) from None
    if request.budget_s is not None and request.budget_s <= 0:
        raise RequestError("budget_s", f"must be > 0; got {request.budget_s}")
    if request.store is not None and Path(request.store).is_dir():
        raise RequestError("store", f"{request.store} is a directory; give the results store file")
    if request.report is not None and Path(request.report).is_dir():
        raise RequestError("report", f"{request.report} is a directory; give the dashboard's file name")
    for d in request.doc:
        if not Path(d).is_file():
            raise RequestError("doc", f"no such file: {d}")
    targets = check_targets(request.inspect_targets, "inspect_targets") if request.inspect_targets else ()
    gpu = _gpu(request, device)
    timing = TIMING_GPU if on_gpu else (TIMING_CPU if request.cpu_timing else TIMING_NONE)
    modeled = [model_case(REGISTRY[n], c, torch.bfloat16, m, gpu) for n in request.op or REGISTRY
               for c in REGISTRY[n].bench_cases for m in modes_for(REGISTRY[n])
               if not request.mode or m in request.mode]
    cfg, items = None, []
    if timing != TIMING_NONE:
        cfg = H.BenchConfig(ops=request.op or None, modes=request.mode or MODES,
                            providers=request.provider or PROVIDERS,
                            dtypes=tuple(torch_dtype(d) for d in request.dtype) or (torch.bfloat16,),
                            case_set="bench" if on_gpu else "small", case_names=request.case or None,
                            reps=request.reps, warmup=request.warmup, budget_s=request.budget_s)
        items = H.plan(cfg, runtime.arch(device) if on_gpu else None)
    checks = _checks(request, device)
    if request.case and not checks and not items:
        raise RequestError("case", f"{', '.join(request.case)} names no correctness case of the selected ops "
                                   "(bench cases are timed on a GPU, or on a CPU with cpu_timing): nothing would run")
    return BenchPlan(request, device, gpu, timing, checks, modeled, items, cfg, () if on_gpu else targets,
                     request.traffic and not on_gpu)


def _open_store(request: BenchRequest):
    path = (Path(tempfile.mkdtemp(prefix="wavefront-bench-")) / "run.sqlite" if request.store is None
            else Path(request.store))
    try:
        return path, ResultStore(path)
    except (StoreError, sqlite3.Error, OSError) as exc:
        raise RequestError("store", f"{path}: {exc}") from None


def _correctness(p: BenchPlan, progress: PhaseProgress) -> list:
    on_progress = progress("correctness")
    results = []
    with checking() if p.request.memcheck else contextlib.nullcontext():
        for i, (spec, case, dtype) in enumerate(p.checks):
            on_progress(i, len(p.checks), f"{spec.name}/{case.name}/{dtype_name(dtype)}")
            results.append(check_case(spec, case, dtype, p.device))
    on_progress(len(p.checks), len(p.checks), "done")
    return results


def _timing(p: BenchPlan, st, info, progress: PhaseProgress) -> list:
    on_progress = progress("timing")
    ctx = None
    if p.device == "cuda":
        on_progress(0, len(p.timing_items), "measuring device-to-device copy bandwidth")
        ctx = H.gpu_context(torch.device(p.device), p.gpu)
        info.copy_gbps, info.flush_bytes = ctx.copy_gbps, ctx.flusher.n_bytes
        st.update_run(info)
    done = [0]

    def on_item(item, rows):
        st.add_measurements(info.id, rows)  # committed as it goes: an interrupted run keeps them
        done[0] += 1
        on_progress(done[0], len(p.timing_items), item.label)

    measurements = []
    for rows in H.Harness(p.timing_config, p.device, gpu_ctx=ctx).run(on_item, p.timing_items):
        measurements.extend(rows)
    return measurements


def _static_documents(p: BenchPlan, out_dir: Path, progress: PhaseProgress) -> tuple[dict[str, str], dict[str, str]]:
    """The CPU main job's static sections, written as JSON documents beside the report. A failure is
    recorded in `skipped` and the job goes on (the correctness results stand)."""
    ops = p.request.op
    todo: list[tuple[str, Callable]] = []
    if p.inspect_targets:
        req = inspect_job.InspectRequest(ops=ops, targets=p.inspect_targets, quick=p.quick)
        todo.append(("inspect", lambda: inspect_job.inspect(req, progress("inspect"))))
    if p.traffic:
        treq = traffic_job.TrafficRequest(ops=ops, quick=p.quick)
        todo.append(("traffic", lambda: traffic_job.traffic(treq, progress("traffic"))))
    docs, skipped = {}, {}
    for name, job in todo:
        try:
            doc = job().as_dict()
        except Exception as exc:  # reported in the result; the other sections stand
            skipped[name] = f"{type(exc).__name__}: {exc}"
            continue
        path = out_dir / f"{name}.json"
        write_json(doc, path)
        docs[name] = str(path)
    return docs, skipped


def finding(name: str, doc: dict) -> str:
    """What an inspect or traffic document found, in one line (the terminal summary's and the dashboard's)."""
    rows = doc.get("rows", [])
    if name == "inspect":
        ok = [r for r in rows if r.get("ok")]
        narrow = [r for r in ok if r["widest_load_bits"] < 128 or r["widest_store_bits"] < 128]
        return (f"{len(rows)} kernel x target x case rows compiled for {', '.join(doc.get('targets', []))}: "
                f"{len(rows) - len(ok)} failed, {sum(1 for r in ok if r.get('spills'))} spill, {len(narrow)} with "
                "a global access under 128 bits (or none: TMA)")
    if name == "traffic":
        counted = [r for r in rows if not r.get("error") and r.get("ratio_min")]
        at_min = [r for r in counted if r["ratio_min"] <= 1.01]
        text = (f"{len(rows)} op x mode x case rows counted: {len(at_min)} within 1% of the minimum bytes, "
                f"{len(counted) - len(at_min)} above, {len(rows) - len(counted)} failed")
        if len(counted) > len(at_min):
            worst = max(counted, key=lambda r: r["ratio_min"])
            text += f" (most: {worst['op']} {worst['mode']} {worst['ratio_min']:.1f}x)"
        return text
    return f"{len(rows)} rows"


def run(request: BenchRequest, on_progress: PhaseProgress | None = None, bench_plan: BenchPlan | None = None
        ) -> BenchResult:
    """Run the main job (see the module docstring); `on_progress(phase)` gives each phase's ProgressFn
    (:data:`PHASES`). Raises RequestError for a bad request."""
    p = bench_plan or plan(request)
    progress = phases(on_progress)
    info = collect_run_info(p.device, label=request.label, timing=p.timing, device_model=p.gpu.key)
    info.extra = {"status": STATUS_INCOMPLETE, "sweep": "quick" if p.quick else "full"}
    stored = StoredRun(info)
    store_path, st = _open_store(request)
    results: list = []
    with st:
        run_id = st.begin_run(info)  # the store marks it incomplete until finish_run (and on an exception)
        if p.checks:
            results = _correctness(p, progress)
            stored.correctness = [CorrectnessRow.from_check(r) for r in results]
            st.add_correctness(run_id, stored.correctness)
        if p.timing_items:
            stored.measurements = _timing(p, st, info, progress)
        report_dir = Path(request.report or DEFAULT_REPORT).parent
        docs, skipped = _static_documents(p, report_dir, progress) if p.device == "cpu" else ({}, {})
        for name, doc_path in docs.items():  # kept with the run, so `wavefront report` alone shows them
            st.add_document(run_id, name, json.loads(Path(doc_path).read_text()))
        info.extra = {**info.extra, "status": STATUS_COMPLETE}
        st.update_run(info)
        st.finish_run(run_id)
    report_path = None
    if request.report is not None:
        try:
            report_path = str(write_report(request.report, store_path, [*request.doc, *docs.values()]))
        except (ValueError, OSError) as exc:
            raise RequestError("report", str(exc)) from None
    findings = {name: finding(name, json.loads(Path(path).read_text())) for name, path in docs.items()}
    return BenchResult(p, runtime.describe(p.device), run_id, None if request.store is None else str(store_path),
                       report_path, docs, results, stored, skipped, findings)
