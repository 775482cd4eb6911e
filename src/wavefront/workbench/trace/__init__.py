"""Profiler-trace analysis: from Kineto/Chrome JSON traces (torch.profiler, one file per rank) to a
per-step breakdown that sums to wall time, exposed communication, idle causes, a kernel table with
roofline placement, launch statistics, multi-rank skew and waits, and statistical trace diffs.

Data in, data out: :func:`analyze` returns a :class:`TraceAnalysis` of dataclasses, :func:`diff` a
:class:`TraceDiff`; the CLI (``wavefront trace analyze|diff``) and the dashboard figures sit on top.
Definitions are in the module docstrings and docs/trace.md.
"""

from wavefront.workbench.trace.analysis import RankAnalysis, TraceAnalysis, analyze, analyze_trace
from wavefront.workbench.trace.breakdown import CATEGORIES, StepBreakdown
from wavefront.workbench.trace.diff import TraceDiff, diff
from wavefront.workbench.trace.errors import TraceLoadError
from wavefront.workbench.trace.load import load_trace

__all__ = ["CATEGORIES", "RankAnalysis", "StepBreakdown", "TraceAnalysis", "TraceDiff", "TraceLoadError", "analyze",
           "analyze_trace", "diff", "load_trace"]
