"""`wavefront gate`: regression gates for CI, one clear line per regression, exit 1 on any, exit 2 on bad
input (the job and its baseline policy are wavefront.workbench.jobs.gate)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from wavefront.cli._common import (
    ALL_TARGETS,
    Bars,
    JsonOut,
    TargetsOption,
    command,
    output_option,
    request_errors,
    write_json,
)
from wavefront.cli._output import console, err_console
from wavefront.workbench.jobs.gate import GateRequest, run
from wavefront.workbench.jobs.ops import split_targets


def _render(result) -> None:
    for r in result.halves:
        for note in r.notes:
            console.print(f"[dim]{r.name}: {note}[/]", soft_wrap=True)
        for f in r.findings:  # one line each, never wrapped: CI logs are grepped
            err_console.print(f"[bold red]REGRESSION[/] {r.name}: {f.line()}", soft_wrap=True, highlight=False)
        verdict = "[green]pass[/]" if r.passed else f"[red]FAIL ({len(r.findings)} regressions)[/]"
        console.print(f"gate {r.name}: {verdict} ({r.compared} baseline rows compared)")


def gate_cmd(
    static: Annotated[bool, typer.Option("--static", help="The static half: inspect + traffic against a "
                                                          "committed baseline (no GPU needed).")] = False,
    baseline: Annotated[list[Path] | None, typer.Option(
        help="A baseline (repeatable). A static baseline (benchmarks/baselines/static.json) feeds the static "
             "half; a results document or store (wavefront report --export-json, wavefront-results.sqlite) "
             "feeds the perf half.")] = None,
    current: Annotated[str, typer.Option(help="The run the perf half judges: a run id, 'latest', a label, a "
                                              "results JSON file or an SQLite store.")] = "latest",
    store: Annotated[Path, typer.Option(help="Results store that --current refers to.")] = Path(
        "wavefront-results.sqlite"),
    threshold: Annotated[float, typer.Option(min=0.0, help="Perf half: slowdown that fails a case (beyond its "
                                                           "noise band too).")] = 0.05,
    markdown: Annotated[Path | None, output_option("--markdown", help="Write the perf half's markdown summary "
                                                                      "here.")] = None,
    update: Annotated[bool, typer.Option("--update", help="Rewrite the static baseline from the present state "
                                                          "(deliberately accepting every change).")] = False,
    targets: TargetsOption = ALL_TARGETS,
    inspect_json: Annotated[Path | None, typer.Option("--inspect", help="Use this `wavefront inspect --json` "
                                                                        "document instead of compiling.")] = None,
    traffic_json: Annotated[Path | None, typer.Option("--traffic", help="Use this `wavefront traffic --json` "
                                                                        "document instead of counting.")] = None,
    json_out: JsonOut = None,
) -> None:
    """Fail (exit 1, one line per regression) when, against the static baseline, a kernel spills, narrows
    its loads or stores, grows its registers by more than 10%, loses occupancy or matrix instructions,
    stops compiling, or moves more bytes; or when, against a perf baseline, a case slows beyond both the
    threshold and its noise band or its peak memory grows. Both halves run in one command. Bad input
    (an unreadable baseline, a malformed document, an interrupted run) exits 2."""
    show = json_out != "-"
    with request_errors():
        request = GateRequest(static=static, baseline=tuple(str(b) for b in baseline or ()), current=current,
                              store=str(store), threshold=threshold, update=update, targets=split_targets(targets),
                              inspect=str(inspect_json) if inspect_json else None,
                              traffic=str(traffic_json) if traffic_json else None)
        with Bars(show) as bars:
            result = run(request, bars.phase)
    if result.perf_markdown is not None and markdown is not None:
        markdown.parent.mkdir(parents=True, exist_ok=True)
        markdown.write_text(result.perf_markdown)
    if show:
        _render(result)
    if json_out:
        write_json(result.as_dict(), json_out)
    if result.exit_code:
        raise typer.Exit(result.exit_code)


def register(app: typer.Typer) -> None:
    command(app, "gate")(gate_cmd)
