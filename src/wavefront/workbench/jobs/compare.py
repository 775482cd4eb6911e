"""``wavefront compare``: two stored runs (or two git revisions benchmarked now, interleaved), per case the
speedup of B over A with a bootstrap interval, a Mann-Whitney p and a verdict; ``--calibrate``: the
verdicts' rates on synthetic samples.

    from wavefront.workbench.jobs import compare
    compare.compare(compare.CompareRequest("1", "2")).as_dict()                     # wavefront.compare/1
    compare.calibrate(compare.CalibrateRequest(trials=500)).as_dict()               # the same schema
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from wavefront.workbench.bench import calibration
from wavefront.workbench.bench import compare as bench_compare
from wavefront.workbench.bench.compare import SCHEMA, CompareRequest, CompareResult
from wavefront.workbench.document import encode
from wavefront.workbench.jobs.request import ProgressFn

__all__ = ["SCHEMA", "CalibrateRequest", "CalibrationReport", "CompareRequest", "CompareResult", "calibrate",
           "compare"]


def compare(request: CompareRequest, on_progress: ProgressFn | None = None) -> CompareResult:
    """B against A (bench.compare.run). GitError, StoreError and ValueError carry one-line messages."""
    return bench_compare.run(request, on_progress)


@dataclass(frozen=True)
class CalibrateRequest:
    trials: int = 500  # per scenario


@dataclass
class CalibrationReport:
    """The verdicts' calibration: per synthetic scenario, how often each verdict came out."""

    SCHEMA: ClassVar[str] = SCHEMA

    results: list[calibration.CalibrationResult]

    def markdown(self) -> str:
        return calibration.markdown_table(self.results)

    def as_dict(self) -> dict:
        """The ``wavefront compare --calibrate --json`` document."""
        return {"schema": SCHEMA, "calibration": encode(self.results)}


def calibrate(request: CalibrateRequest) -> CalibrationReport:
    return CalibrationReport(calibration.calibrate(trials=request.trials))
