"""``wavefront bisect``: the first commit between good and bad where a case regresses (git bisect run in a
temporary worktree, the dynamic gate's rule as the test).

    from wavefront.workbench.jobs import bisect
    bisect.bisect(bisect.BisectRequest("v0.1", "HEAD", op="softmax")).as_dict()      # wavefront.bisect/1
"""

from __future__ import annotations

from wavefront.workbench.bench import bisect as bench_bisect
from wavefront.workbench.bench.bisect import SCHEMA, BisectRequest, BisectResult, MeasureError
from wavefront.workbench.jobs.request import ProgressFn

__all__ = ["SCHEMA", "BisectRequest", "BisectResult", "MeasureError", "bisect"]


def bisect(request: BisectRequest, on_progress: ProgressFn | None = None) -> BisectResult:
    """Bisect as the request says; each step is reported as `on_progress(0, 0, what)` (the number of steps is
    not known ahead). Raises ValueError, GitError or MeasureError with one-line messages."""
    say = (lambda what: on_progress(0, 0, what)) if on_progress else None
    return bench_bisect.run(request, say)
