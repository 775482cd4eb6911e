"""One call from trace files to every analysis: :func:`analyze` returns a :class:`TraceAnalysis`
(dataclasses) whose ``as_dict()`` is the ``wavefront.trace.analyze/2`` document (:data:`SCHEMA`).

Each file is parsed once. Ranks are analyzed in parallel processes (``workers``, default: the CPUs this
process may use), each returning its :class:`RankAnalysis`; a single large uncompressed file is read in
parallel byte ranges instead.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import numpy.ma  # noqa: F401 - np.percentile imports it: once in the parent, not in every forked worker

from wavefront.workbench.document import encode
from wavefront.workbench.trace.annotate import load_annotated
from wavefront.workbench.trace.breakdown import (
    CATEGORIES,
    StepBreakdown,
    build_timeline,
    cpu_comm_rows,
    find_steps,
)
from wavefront.workbench.trace.classify import COMM, DeviceClasses, classify_device, family
from wavefront.workbench.trace.compat import hta_equivalent
from wavefront.workbench.trace.decode import pool_context
from wavefront.workbench.trace.errors import TraceLoadError
from wavefront.workbench.trace.kernels import KernelReport, family_time_by_step, kernel_table, roofline
from wavefront.workbench.trace.launch import LaunchStats, launch_stats
from wavefront.workbench.trace.load import load_trace
from wavefront.workbench.trace.model import KIND_KERNEL, KIND_NAMES, NO_ID, Trace
from wavefront.workbench.trace.multirank import (
    XLA_IDENTITY,
    CollectiveInstances,
    MultiRankReport,
    RankSteps,
    multirank,
)
from wavefront.workbench.trace.rocprof import group_paths

SCHEMA = "wavefront.trace.analyze/2"  # 2: every time also in exact integer nanoseconds (*_ns)
_BACKEND_PREFIXES = ("gloo:", "nccl:", "rccl:", "mpi:", "ucc:")


@dataclass
class RankAnalysis:
    path: str
    rank: int | None
    world_size: int | None
    host: str | None
    device_name: str | None
    domain: str  # "device" | "cpu"
    complete: bool
    n_events: int
    steps: list[StepBreakdown]
    kernels: KernelReport
    launch: LaunchStats | None
    classification: dict[str, Any]  # class -> {rule: count}
    family_step_us: dict[str, list[float]]  # per family, time per step (for diffs)
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    collectives: CollectiveInstances | None = None
    hta: dict[str, Any] | None = None  # HTA 0.5.0's definitions on this trace (hta_compatible=True, device traces)
    source: str = "json"  # what wrote the file: "json" (torch.profiler / jax.profiler), "nsys", "rocprofv3"

    def totals(self) -> dict[str, Any]:
        """Breakdown categories summed over steps, and the step total."""
        ns = {c: sum(s.ns(c) for s in self.steps) for c in CATEGORIES} | {"step": sum(s.dur_ns for s in self.steps)}
        return {f"{k}_us": v / 1000 for k, v in ns.items()} | {f"{k}_ns": v for k, v in ns.items()}

    def as_dict(self) -> dict[str, Any]:
        return {"path": self.path, "rank": self.rank, "world_size": self.world_size, "host": self.host,
                "device_name": self.device_name, "source": self.source,
                "domain": self.domain, "complete": self.complete, "n_events": self.n_events,
                "notes": self.notes, "warnings": self.warnings, "classification": self.classification,
                "steps": [s.as_dict() for s in self.steps], "totals": self.totals(),
                "kernels": encode(self.kernels), "launch": encode(self.launch),
                "hta_equivalent": self.hta}


@dataclass
class TraceAnalysis:
    ranks: list[RankAnalysis]
    multirank: MultiRankReport | None
    warnings: list[str] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)
    wall_s: float | None = None  # this analysis on this machine's CPU
    annotation: dict[str, Any] | None = None  # what annotate_to wrote

    SCHEMA: ClassVar[str] = SCHEMA

    def as_dict(self) -> dict[str, Any]:
        """The ``wavefront.trace.analyze/2`` document (docs/json/trace.md)."""
        return {"schema": SCHEMA, "warnings": self.warnings, "ranks": [r.as_dict() for r in self.ranks],
                "multirank": encode(self.multirank), "inputs": self.inputs,
                "analysis_wall_s": self.wall_s, "annotation": self.annotation}


def _identity(args: dict[str, Any] | None) -> tuple[Any, ...] | None:
    """(process group, collective, sequence number) from record_param_comms args, when all are there."""
    if not args:
        return None
    group = args.get("Process Group Name", args.get("pg_id"))
    kind, seq = args.get("Collective name"), args.get("Seq")
    if group is None or kind is None or seq is None:
        return None
    return (str(group), str(kind), int(seq) if str(seq).lstrip("-").isdigit() else str(seq))


def _collectives(trace: Trace, classes: DeviceClasses | None) -> CollectiveInstances:
    """The rank's collective instances: type, identity (from the kernel's own collective args, else its
    launching op's), start and end."""
    names = trace.names
    if len(trace.device) and classes is not None:  # classified exactly when there are device events
        rows = np.flatnonzero((classes.cls == COMM) & (trace.device.kind == KIND_KERNEL))
        kinds, identities = [], []
        if len(rows) and np.all(trace.device.run_id[rows] != NO_ID):  # XLA: the execution, the op, its turn
            return _xla_collectives(trace, rows)
        for row in rows.tolist():
            op = int(classes.op_row[row])
            args = trace.kernel_comm_args.get(int(trace.device.correlation[row]))
            if args is None and op >= 0:
                args = trace.op_comm_args.get(int(trace.cpu.external_id[op]))
            identities.append(_identity(args))
            if args and args.get("Collective name") is not None:
                kinds.append(str(args["Collective name"]))
            elif op >= 0 and names[int(trace.cpu.name[op])] != "record_param_comms":
                kinds.append(names[int(trace.cpu.name[op])])
            else:
                kinds.append(family(names[int(trace.device.name[row])]))
        return CollectiveInstances(kinds, identities, trace.device.ts_ns[rows], trace.device.end_ns[rows])
    comm = cpu_comm_rows(trace)
    backend = np.array([names[i].startswith(_BACKEND_PREFIXES) for i in trace.cpu.name.tolist()], dtype=bool)
    rows = np.flatnonzero(comm & backend) if np.any(comm & backend) else np.flatnonzero(comm)
    ext = trace.cpu.external_id[rows].tolist()
    return CollectiveInstances([names[int(i)] for i in trace.cpu.name[rows].tolist()],
                               [_identity(trace.op_comm_args.get(int(x))) for x in ext], trace.cpu.ts_ns[rows],
                               trace.cpu.end_ns[rows])


def _xla_collectives(trace: Trace, rows: np.ndarray) -> CollectiveInstances:
    """XLA collectives (jax.profiler) with their identity: the run id of the program execution (the same on
    every rank), the HLO op, and its turn among that op's instances in the execution."""
    names = trace.name_of(trace.device.name[rows])
    seen: dict[tuple[Any, ...], int] = {}
    identities: list[tuple[Any, ...] | None] = []
    for run, name in zip(trace.device.run_id[rows].tolist(), names, strict=True):
        turn = seen[(run, name)] = seen.get((run, name), -1) + 1
        identities.append((XLA_IDENTITY, run, name, turn))
    return CollectiveInstances([family(n) for n in names], identities, trace.device.ts_ns[rows],
                               trace.device.end_ns[rows])


def analyze_trace(trace: Trace, *, device: str | None = None, short_us: float = 10.0, top: int = 20,
                  hta_compatible: bool = False) -> RankAnalysis:
    """Every single-rank analysis of one loaded trace (with HTA's definitions too, on request)."""
    classes = classify_device(trace) if len(trace.device) else None
    timeline = build_timeline(trace, classes)
    steps, note = find_steps(trace)
    notes = [note] if note else []
    if timeline.domain == "cpu":
        notes.append("no device events (CPU-only trace): the breakdown is of CPU operators across threads")
    breakdowns = timeline.breakdowns(steps)
    kernels = kernel_table(trace, classes, top=top)
    launch = None
    if classes is not None:
        points, gpu_key, rf_notes = roofline(trace, classes, device, top=top)
        kernels.roofline, kernels.gpu = points, gpu_key
        kernels.notes.extend(rf_notes)
        launch = launch_stats(trace, classes, steps, short_us)
        if trace.n_sync_events:
            notes.append(f"{trace.n_sync_events} GPU-side sync record(s) (cuda_sync) kept out of busy time")
    classification = classes.counts() if classes is not None else {}
    kinds = {KIND_NAMES[k]: int(n) for k, n in zip(*np.unique(trace.device.kind, return_counts=True), strict=True)}
    if kinds:
        notes.append("device events: " + ", ".join(f"{n} {k}" for k, n in kinds.items()))
    hta = None
    if hta_compatible and classes is not None:
        try:
            hta = hta_equivalent(trace, classes)
        except ValueError as exc:
            notes.append(f"HTA-equivalent figures not computed: {exc}")
    elif hta_compatible:
        notes.append("HTA-equivalent figures need device events: none in this trace")
    return RankAnalysis(trace.path, trace.rank, trace.world_size, trace.meta.get("host_name"), trace.device_name,
                        timeline.domain, trace.complete, trace.n_events, breakdowns, kernels, launch, classification,
                        family_time_by_step(trace, steps), notes, list(trace.warnings),
                        _collectives(trace, classes), hta, trace.meta.get("source", "json"))


@dataclass(frozen=True)
class _Options:
    device: str | None
    short_us: float
    top: int
    hta_compatible: bool
    range_workers: int
    step_pattern: str | None = None


def _analyze_file(path: str, opts: _Options) -> RankAnalysis | str:
    """One rank, in a worker process: its analysis, or why it could not be read."""
    try:
        trace = load_trace(path, workers=opts.range_workers, step_pattern=opts.step_pattern)
    except (TraceLoadError, OSError) as exc:
        return f"skipped {path}: {exc}"
    return analyze_trace(trace, device=opts.device, short_us=opts.short_us, top=opts.top,
                         hta_compatible=opts.hta_compatible)


def default_workers() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def analyze(paths: Sequence[str | Path], *, device: str | None = None, short_us: float = 10.0, top: int = 20,
            align: str = "auto", workers: int | None = None, annotate_to: str | Path | None = None,
            hta_compatible: bool = False, progress: Callable[[str, int, int], None] | None = None,
            step_pattern: str | None = None) -> TraceAnalysis:
    """Load and analyze one trace per rank. A file that cannot be read becomes a warning (the others are
    still analyzed); TraceLoadError only when no file could be read at all. ``annotate_to`` writes a copy
    of the (single) trace with the analysis as extra tracks (:mod:`annotate`), from the same parse.
    ``progress(path, bytes_done, bytes_total)`` reports each file. ``step_pattern``: a regular expression
    naming the NVTX / ROCTx ranges that are steps in Nsight Systems exports and rocprofv3 traces (its first
    group, if any, the step number); default ``ProfilerStep#N``."""
    if not paths:
        raise ValueError("paths: expected at least one trace file")
    paths = group_paths(paths)  # a rocprofv3 process's CSV files are one rank
    if align not in ("auto", "ends", "none"):
        raise ValueError(f"align must be 'auto', 'ends' or 'none', got {align!r}")
    if annotate_to is not None and len(paths) != 1:
        raise ValueError(f"annotate_to: takes exactly one trace file; got {len(paths)}")
    if step_pattern is not None:
        try:
            re.compile(step_pattern)
        except re.error as exc:
            raise ValueError(f"step_pattern: expected a regular expression, got {step_pattern!r} ({exc})") from None
    t0 = time.perf_counter()
    workers = max(1, workers or default_workers())
    opts = _Options(device, short_us, top, hta_compatible, max(1, workers // len(paths)), step_pattern)
    annotation = None
    if annotate_to is not None:
        trace, annotation = load_annotated(paths[0], annotate_to)
        outcomes: list[RankAnalysis | str] = [analyze_trace(trace, device=device, short_us=short_us, top=top,
                                                            hta_compatible=hta_compatible)]
    elif len(paths) == 1 or workers == 1:
        outcomes = []
        for p in paths:
            outcomes.append(_analyze_file(str(p), opts))
            _report(progress, p)
    else:
        outcomes = _in_pool(paths, opts, workers, progress)
    warnings = [o for o in outcomes if isinstance(o, str)]
    ranks = [o for o in outcomes if isinstance(o, RankAnalysis)]
    if not ranks:
        if len(warnings) == 1:
            raise TraceLoadError(warnings[0].removeprefix(f"skipped {paths[0]}: "))
        raise TraceLoadError("no trace could be read: " + "; ".join(warnings))
    mr = _multirank(ranks, align, warnings)
    return TraceAnalysis(ranks, mr, warnings, [str(p) for p in paths], time.perf_counter() - t0, annotation)


def _in_pool(paths: Sequence[str | Path], opts: _Options, workers: int,
             progress: Callable[[str, int, int], None] | None) -> list[RankAnalysis | str]:
    """One worker process per file (up to ``workers`` at once); if the pool breaks (a worker killed, out
    of memory), the files are analyzed here one after the other."""
    try:
        with ProcessPoolExecutor(max_workers=min(workers, len(paths)), mp_context=pool_context()) as pool:
            futures = [pool.submit(_analyze_file, str(p), opts) for p in paths]
            outcomes = []
            for p, fut in zip(paths, futures, strict=True):
                outcomes.append(fut.result())
                _report(progress, p)
            return outcomes
    except BrokenProcessPool:
        serial = _Options(opts.device, opts.short_us, opts.top, opts.hta_compatible, 1, opts.step_pattern)
        return [_analyze_file(str(p), serial) for p in paths]


def _report(progress: Callable[[str, int, int], None] | None, path: str | Path) -> None:
    if progress is not None:
        size = os.path.getsize(path) if os.path.exists(path) else 0
        progress(str(path), size, size)


def _multirank(ranks: list[RankAnalysis], align: str, warnings: list[str]) -> MultiRankReport | None:
    given_ids = [r.rank for r in ranks]
    sizes = {r.world_size for r in ranks if r.world_size is not None}
    if len(sizes) > 1:
        warnings.append(f"traces disagree on world_size: {sorted(sizes)}: they probably come from different runs")
    elif sizes and next(iter(sizes)) > len(ranks):
        given = sorted(i for i in given_ids if i is not None)
        warnings.append(f"world_size is {next(iter(sizes))} but {len(ranks)} rank file(s) were given"
                        + (f" (rank(s) {given})" if given else "") + ": the analysis covers only these ranks")
    if len(ranks) < 2:
        return None
    ids = [i for i in given_ids if i is not None]
    if len(ids) != len(given_ids):
        warnings.append("some traces carry no distributedInfo rank: ranks are numbered in file order")
        ids = list(range(len(ranks)))
    if len(set(ids)) != len(ids):
        dup = sorted({i for i in ids if ids.count(i) > 1})
        warnings.append(f"rank(s) {dup} appear in more than one file: multi-rank analysis skipped")
        return None
    domains = {r.domain for r in ranks}
    if len(domains) > 1:
        warnings.append("some ranks have device events and some do not: multi-rank analysis skipped")
        return None
    rank_steps = [RankSteps(rid, r.host, [(s.step, s.start_ns, s.dur_ns) for s in r.steps],
                            r.collectives or CollectiveInstances.empty())
                  for rid, r in zip(ids, ranks, strict=True)]
    return multirank(rank_steps, align)
