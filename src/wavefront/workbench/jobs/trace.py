"""``wavefront trace analyze`` and ``wavefront trace diff``: trace files in, a TraceAnalysis
(wavefront.trace.analyze/2) or a TraceDiff (wavefront.trace.diff/1) out. numpy-only: no torch import.

    from wavefront.workbench.jobs import trace
    trace.analyze(trace.AnalyzeRequest(("rank0.json.gz", "rank1.json.gz"), device="mi300x")).as_dict()
    trace.diff(trace.DiffRequest(("before.json",), ("after.json",))).as_dict()   # names both sides' files
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from wavefront.workbench.jobs.request import ProgressFn, no_progress
from wavefront.workbench.trace import analysis
from wavefront.workbench.trace.diff import SCHEMA as DIFF_SCHEMA
from wavefront.workbench.trace.diff import TraceDiff
from wavefront.workbench.trace.diff import diff as diff_analyses
from wavefront.workbench.trace.figures import FIGURES_SCHEMA, figures

#: The trace analysis behind ``trace diff`` tabulates this many kernel families (``--top`` then picks).
DIFF_ANALYSIS_TOP = 50


@dataclass(frozen=True)
class AnalyzeRequest:
    paths: tuple[str | Path, ...]  # one trace file per rank
    device: str | None = None  # device-table row for the roofline; None: the GPU the trace names
    short_us: float = 10.0
    top: int = 15
    align: str = "auto"  # auto | ends | none
    workers: int | None = None
    annotate_to: str | None = None  # write an annotated copy of the (single) trace here
    hta_compatible: bool = False
    step_pattern: str | None = None


def analyze(request: AnalyzeRequest, on_progress: ProgressFn | None = None) -> analysis.TraceAnalysis:
    """Every analysis of the traces; `on_progress(done, total, path)` after each file."""
    report = on_progress or no_progress
    done = [0]

    def one_file(path: str, _bytes_done: int, _bytes_total: int) -> None:
        done[0] += 1
        report(done[0], len(request.paths), path)

    return analysis.analyze(list(request.paths), device=request.device, short_us=request.short_us, top=request.top,
                            align=request.align, workers=request.workers, annotate_to=request.annotate_to,
                            hta_compatible=request.hta_compatible, step_pattern=request.step_pattern,
                            progress=one_file)


def figures_document(result: analysis.TraceAnalysis) -> dict:
    """The dashboard's figure specs of an analysis (``--figures``)."""
    return {"schema": FIGURES_SCHEMA, "figures": figures(result)}


@dataclass(frozen=True)
class DiffRequest:
    a: tuple[str | Path, ...]  # the baseline's trace files
    b: tuple[str | Path, ...]  # the candidate's
    top: int = 15
    alpha: float = 0.01


@dataclass
class DiffResult:
    """Both analyses and their diff; ``as_dict()`` is the diff's document (which names both sides' files)."""

    SCHEMA: ClassVar[str] = DIFF_SCHEMA

    a: analysis.TraceAnalysis
    b: analysis.TraceAnalysis
    diff: TraceDiff

    @property
    def warnings(self) -> list[str]:
        return self.a.warnings + self.b.warnings + self.diff.warnings

    def as_dict(self) -> dict:
        return self.diff.as_dict()


def diff(request: DiffRequest, on_progress: ProgressFn | None = None) -> DiffResult:
    """B against A, per step (trace.diff); `on_progress` counts the files of both sides."""
    report = on_progress or no_progress
    total = len(request.a) + len(request.b)
    ra = analyze(AnalyzeRequest(request.a, top=DIFF_ANALYSIS_TOP), lambda d, t, w: report(d, total, w))
    rb = analyze(AnalyzeRequest(request.b, top=DIFF_ANALYSIS_TOP),
                 lambda d, t, w: report(len(request.a) + d, total, w))
    return DiffResult(ra, rb, diff_analyses(ra, rb, top=request.top, alpha=request.alpha))
