"""`wavefront report`: the self-contained HTML dashboard from the results store and other tools' JSON."""

from __future__ import annotations

from typing import Annotated

import typer

from wavefront.cli._output import console, fail, write_json

SCHEMA = "wavefront.report/1"


def report(
    store: Annotated[str, typer.Option(help="Results store (SQLite) to read.")] = "wavefront-results.sqlite",
    out: Annotated[str, typer.Option("--out", "-o", help="HTML file to write.")] = "artifacts/wavefront-report.html",
    doc: Annotated[list[str] | None, typer.Option(
        "--doc", help="A JSON document to tabulate (wavefront inspect/traffic --json; repeatable).")] = None,
    device: Annotated[list[str] | None, typer.Option(
        "--device", help="Device-table rows to draw rooflines for (repeatable; default all).")] = None,
    title: Annotated[str, typer.Option(help="Page title.")] = "wavefront dashboard",
    export_json: Annotated[str | None, typer.Option("--export-json", help="Also export the store's runs as JSON.")]
    = None,
    export_csv: Annotated[str | None, typer.Option("--export-csv", help="Also export measurements as CSV.")] = None,
    json_out: Annotated[str | None, typer.Option("--json", help="Write the result document ('-': stdout).")] = None,
) -> None:
    """Write the dashboard: roofline per device (modeled; measured points from GPU runs), speedups vs each
    baseline, history across runs, correctness, and the inspect/traffic tables given with --doc."""
    from pathlib import Path

    from wavefront.workbench.bench.store import ResultStore, StoreError, write_document
    from wavefront.workbench.hardware import GPUS, get_gpu
    from wavefront.workbench.report import write_report

    devices = None
    if device:
        try:
            devices = [get_gpu(d).key for d in device]
        except ValueError as exc:
            fail(f"--device: {exc}")
    store_exists = Path(store).exists()
    try:
        path = write_report(out, store if store_exists else None, doc or [], title=title, devices=devices)
        n_runs = 0
        if store_exists:
            with ResultStore(store, create=False) as st:
                n_runs = len(st.runs())
                if export_json:
                    write_document(st, export_json)
                if export_csv:
                    st.export_csv(export_csv)
    except (StoreError, ValueError, OSError) as exc:
        fail(str(exc))
    if json_out != "-":
        if not store_exists:
            console.print(f"[yellow]note:[/] no results store at {store}: the dashboard shows the modeled charts only")
        console.print(f"dashboard: {path} ({n_runs} stored run(s), {len(devices or GPUS)} device roofline(s))")
    if json_out:
        write_json({"schema": SCHEMA, "report": str(path), "store": store if store_exists else None,
                    "n_runs": n_runs, "devices": devices or list(GPUS), "documents": doc or [],
                    "export_json": export_json, "export_csv": export_csv}, json_out)


def register(app: typer.Typer) -> None:
    app.command("report")(report)
