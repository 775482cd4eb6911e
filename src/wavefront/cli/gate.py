"""`wavefront gate`: regression gates for CI, one clear line per regression, non-zero exit on any."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from wavefront.cli._output import console, err_console, fail, write_json


def _read_doc(path: Path, what: str) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        fail(f"--{what}: cannot read {path}: {exc}")


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
    threshold: Annotated[float, typer.Option(help="Perf half: slowdown that fails a case (beyond its noise "
                                                  "band too).")] = 0.05,
    markdown: Annotated[Path | None, typer.Option(help="Write the perf half's markdown summary here.")] = None,
    update: Annotated[bool, typer.Option("--update", help="Rewrite the static baseline from the present state "
                                                          "(deliberately accepting every change).")] = False,
    targets: Annotated[str, typer.Option(help="Comma-separated compile targets.")] =
        "sm_80,sm_90,sm_100,gfx90a,gfx942,gfx1100",
    inspect_json: Annotated[Path | None, typer.Option("--inspect", help="Use this `wavefront inspect --json` "
                                                                        "document instead of compiling.")] = None,
    traffic_json: Annotated[Path | None, typer.Option("--traffic", help="Use this `wavefront traffic --json` "
                                                                        "document instead of counting.")] = None,
    json_out: Annotated[str | None, typer.Option("--json", help="Write the result document ('-': stdout).")] = None,
) -> None:
    """Fail (exit 1, one line per regression) when, against the static baseline, a kernel spills, narrows
    its loads or stores, grows its registers by more than 10%, loses occupancy or matrix instructions,
    stops compiling, or moves more bytes; or when, against a perf baseline, a case slows beyond both the
    threshold and its noise band or its peak memory grows. Both halves run in one command."""
    from wavefront.cli.inspect import parse_targets, run_inspect, run_traffic, use_interpreter
    from wavefront.workbench.static import gate as g

    static_paths = [p for p in baseline or [] if g.is_static_baseline(p)]
    perf_refs = [p for p in baseline or [] if p not in static_paths]
    if static and not static_paths:
        # A static baseline that does not exist yet (to be made with --update, or reported missing).
        absent = [p for p in perf_refs if p.suffix == ".json" and not p.exists()]
        if absent:
            static_paths = absent[:1]
            perf_refs.remove(absent[0])
    if len(static_paths) > 1 or len(perf_refs) > 1:
        fail("--baseline: give at most one static baseline and one perf baseline")
    if static_paths:
        static = True
    if not static and not perf_refs:
        fail("choose a gate half: --static (machine code and bytes) and/or --baseline PERF (timings from "
             "`wavefront bench`)")
    halves = []
    perf_summary: list[str] = []
    if static:
        path = static_paths[0] if static_paths else g.DEFAULT_STATIC_BASELINE
        base = None
        if not update:
            try:
                base = g.load_baseline(path)
            except (FileNotFoundError, ValueError) as exc:
                fail(str(exc))
        target_list = parse_targets(targets)
        quiet = json_out == "-"
        use_interpreter()

        def static_half() -> g.HalfResult:
            import torch

            if inspect_json is not None:
                inspect_doc = _read_doc(inspect_json, "inspect")
            else:
                inspect_doc = run_inspect(None, target_list, torch.bfloat16, show_progress=not quiet).as_dict()
            if traffic_json is not None:
                traffic_doc = _read_doc(traffic_json, "traffic")
            else:
                traffic_doc = run_traffic(None, torch.bfloat16, show_progress=not quiet, marginal=False).as_dict()
            if update:
                g.write_baseline(g.static_snapshot(inspect_doc, traffic_doc), path)
                n = len(inspect_doc["rows"]) + len(traffic_doc["rows"])
                return g.HalfResult("static", notes=[f"baseline rewritten: {path} ({n} rows)"], compared=0)
            return g.static_half(inspect_doc, traffic_doc, base)

        halves.append(static_half)
    if perf_refs:

        def perf_half() -> g.HalfResult:
            result, summary = g.perf_half(str(perf_refs[0]), current, store_path=store, threshold=threshold)
            perf_summary.append(summary)
            return result

        halves.append(perf_half)

    results = g.run_gate(halves)
    doc = g.gate_document(results)
    if perf_summary:
        doc["perf_markdown"] = perf_summary[0]
        if markdown is not None:
            markdown.parent.mkdir(parents=True, exist_ok=True)
            markdown.write_text(perf_summary[0])
    if json_out != "-":
        for r in results:
            for note in r.notes:
                console.print(f"[dim]{r.name}: {note}[/]", soft_wrap=True)
            for f in r.findings:  # one line each, never wrapped: CI logs are grepped
                err_console.print(f"[bold red]REGRESSION[/] {r.name}: {f.line()}", soft_wrap=True, highlight=False)
            verdict = "[green]pass[/]" if r.passed else f"[red]FAIL ({len(r.findings)} regressions)[/]"
            console.print(f"gate {r.name}: {verdict} ({r.compared} baseline rows compared)")
    if json_out:
        write_json(doc, json_out)
    if not doc["passed"]:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("gate")(gate_cmd)
