"""`wavefront report`: the self-contained HTML dashboard from the results store and other tools' JSON."""

from __future__ import annotations

from typing import Annotated

import typer

from wavefront.cli._common import JsonOut, command, output_option, write_json
from wavefront.cli._output import console, fail
from wavefront.workbench.bench.store import StoreError
from wavefront.workbench.hardware import get_gpu
from wavefront.workbench.jobs import report as job
from wavefront.workbench.report.tables import DocumentError

Store = Annotated[str, typer.Option(help="Results store (SQLite) to read; it must exist.")]
NoStore = Annotated[bool, typer.Option("--no-store", help="Read no store: the modeled charts and documents.")]
Out = Annotated[str, output_option("--out", "-o", help="HTML file to write.")]
Doc = Annotated[
    list[str] | None,
    typer.Option(
        "--doc",
        help="A JSON document to show (wavefront inspect/traffic/counters --json, an lce_memory result, trace figures, "
        "a trace analysis: its timeline; repeatable). Without it, the documents stored with the newest runs are shown.",
    ),
]
ResultsDir = Annotated[str, typer.Option(help="Committed results to chart (lce_memory_*.json); '' for none.")]
Device = Annotated[
    list[str] | None, typer.Option("--device", help="Device-table rows in the roofline (repeatable; default all).")
]
Title = Annotated[str, typer.Option(help="Page title.")]
ExportJson = Annotated[str | None, output_option("--export-json", help="Also export the store's runs as JSON.")]
ExportCsv = Annotated[str | None, output_option("--export-csv", help="Also export measurements as CSV.")]


def report(
    store: Store = "wavefront-results.sqlite",
    no_store: NoStore = False,
    out: Out = "artifacts/wavefront-report.html",
    doc: Doc = None,
    results_dir: ResultsDir = "benchmarks/results",
    device: Device = None,
    title: Title = "wavefront dashboard",
    export_json: ExportJson = None,
    export_csv: ExportCsv = None,
    json_out: JsonOut = None,
) -> None:
    """Write the dashboard: inspect heat map, traffic bars, one roofline with a device selector, the fused-loss
    memory result, correctness, speedups vs each baseline and history (GPU runs), training KPIs."""
    if no_store and (export_json or export_csv):
        fail("--export-json/--export-csv need a store; drop --no-store")
    for d in device or []:
        try:
            get_gpu(d)
        except ValueError as exc:
            fail(f"--device: {exc}")
    request = job.ReportRequest(
        out=out,
        store=None if no_store else store,
        documents=tuple(doc or ()),
        devices=tuple(device) if device else None,
        title=title,
        results_dir=results_dir or None,
        export_json=export_json,
        export_csv=export_csv,
    )
    try:
        result = job.report(request)
    except StoreError as exc:
        hint = " (run `wavefront bench` first, or pass --no-store)" if str(exc).startswith("no results store") else ""
        fail(f"--store: {exc}{hint}")
    except DocumentError as exc:
        fail(f"--doc {exc}")
    except ValueError as exc:
        fail(str(exc))
    except OSError as exc:
        fail(f"{exc.filename or out}: {exc.strerror or exc}")
    if json_out != "-":
        left = f", {result.n_left_out} incomplete/failed left out" if result.n_left_out else ""
        console.print(
            f"dashboard: {result.report} ({result.n_runs} stored run(s){left}, "
            f"{len(result.documents)} document(s), roofline for {len(result.devices)} device(s))"
        )
    if json_out:
        write_json(result.as_dict(), json_out)


def register(app: typer.Typer) -> None:
    command(app, "report")(report)
