"""The HTML dashboard: ``build_report_data`` gathers, ``render_html`` renders, ``write_report`` does both;
``run`` is the ``wavefront report`` job (a :class:`ReportRequest` in, a :class:`ReportResult` out, whose
``as_dict()`` is the verb's ``--json`` document)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from wavefront.workbench.bench.store import ResultStore, write_document
from wavefront.workbench.hardware import GPUS, get_gpu

SCHEMA = "wavefront.report/1"
DEFAULT_RESULTS_DIR = "benchmarks/results"


def write_report(
    dest: str | Path,
    store_path: str | Path | None,
    documents=(),
    *,
    title: str = "wavefront dashboard",
    devices=None,
    results_dir: str | Path | None = DEFAULT_RESULTS_DIR,
) -> Path:
    """Write the self-contained dashboard to `dest`; returns the path. Raises StoreError for a store that is
    missing or not a results store, DocumentError for a document the dashboard does not show."""
    return _write(dest, store_path, documents, title=title, devices=devices, results_dir=results_dir)[0]


def _write(dest, store_path, documents, *, title, devices, results_dir):
    from wavefront.workbench.report.data import build_report_data  # lazy: torch-free import
    from wavefront.workbench.report.html import render_html  # lazy: torch-free import

    data = build_report_data(store_path, list(documents), title=title, devices=devices, results_dir=results_dir)
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(render_html(data), encoding="utf-8")
    return dest, data


@dataclass(frozen=True)
class ReportRequest:
    out: str | Path = "artifacts/wavefront-report.html"
    store: str | Path | None = "wavefront-results.sqlite"  # None: no store (modeled charts and documents alone)
    documents: tuple[str | Path, ...] = ()
    devices: tuple[str, ...] | None = None  # device-table keys; None: all
    title: str = "wavefront dashboard"
    results_dir: str | Path | None = DEFAULT_RESULTS_DIR
    export_json: str | Path | None = None
    export_csv: str | Path | None = None


@dataclass
class ReportResult:
    SCHEMA: ClassVar[str] = SCHEMA

    report: Path
    store: str | None
    n_runs: int
    n_left_out: int  # incomplete or failed runs, listed but kept out of the charts
    devices: list[str]
    documents: list[str]  # every document shown: given, stored with a run, or committed results
    export_json: str | None = None
    export_csv: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "report": str(self.report),
            "store": self.store,
            "n_runs": self.n_runs,
            "n_left_out": self.n_left_out,
            "devices": self.devices,
            "documents": self.documents,
            "export_json": self.export_json,
            "export_csv": self.export_csv,
        }


def run(request: ReportRequest) -> ReportResult:
    """Write the dashboard (and the exports asked for). StoreError / DocumentError / ValueError carry one-line
    messages for bad input."""
    devices = [get_gpu(d).key for d in request.devices] if request.devices else None
    path, data = _write(
        request.out,
        request.store,
        request.documents,
        title=request.title,
        devices=devices,
        results_dir=request.results_dir,
    )
    if request.store is not None and (request.export_json or request.export_csv):
        with ResultStore(request.store, create=False) as st:
            if request.export_json:
                write_document(st, request.export_json)
            if request.export_csv:
                st.export_csv(request.export_csv)
    return ReportResult(
        path,
        str(request.store) if request.store is not None else None,
        len(data.runs),
        sum(s != "complete" for s in data.statuses.values()),
        devices or list(GPUS),
        [d.source for d in data.documents],
        str(request.export_json) if request.export_json else None,
        str(request.export_csv) if request.export_csv else None,
    )
