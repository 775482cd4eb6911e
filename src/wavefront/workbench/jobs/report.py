"""``wavefront report``: the HTML dashboard of a results store and JSON documents.

    from wavefront.workbench.jobs import report
    report.report(report.ReportRequest(out="artifacts/wavefront-report.html")).as_dict()   # wavefront.report/1
"""

from __future__ import annotations

from wavefront.workbench import report as dashboard
from wavefront.workbench.report import SCHEMA, ReportRequest, ReportResult

__all__ = ["SCHEMA", "ReportRequest", "ReportResult", "report"]


def report(request: ReportRequest) -> ReportResult:
    """Write the dashboard (and the exports asked for). StoreError / DocumentError / ValueError carry one-line
    messages for bad input."""
    return dashboard.run(request)
