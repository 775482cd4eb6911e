"""`wavefront trace analyze` and `wavefront trace diff`: options, rendering and exit codes over the jobs
:func:`wavefront.workbench.jobs.trace.analyze` and :func:`~wavefront.workbench.jobs.trace.diff` (no torch import:
``python -m wavefront.cli.trace`` runs where only the ``trace`` extra is installed)."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer
from rich import box
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from wavefront.cli._common import VerbGroup, command, write_json
from wavefront.cli._output import JsonOut, console, err_console, output_option
from wavefront.workbench.jobs import trace as job
from wavefront.workbench.trace import TraceLoadError
from wavefront.workbench.trace.report import blocks, diff_table

app = typer.Typer(name="trace", no_args_is_help=True, add_completion=False, cls=VerbGroup,
                  help="Analyze torch.profiler, jax.profiler, nsys and rocprofv3 traces: breakdown, kernels, ranks.")
TRACE_SUFFIXES = (".json", ".json.gz", ".sqlite", "_trace.csv")  # rocprofv3: <pid>_kernel_trace.csv and the rest


class Align(str, Enum):
    auto = "auto"
    ends = "ends"
    none = "none"


def _fail(message: str) -> None:
    """One line on stderr, exit status 2 (bad input or usage), never a traceback."""
    err_console.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True, highlight=False)
    raise typer.Exit(2)


def expand_paths(items: list[str]) -> list[Path]:
    """Files as given; a directory stands for the trace files under it (sorted; the TensorBoard profile
    plugin's ``plugins/profile/<run>/*.trace.json.gz`` layout included)."""
    out: list[Path] = []
    for item in items:
        p = Path(item)
        if p.is_dir():
            found = sorted(f for f in p.rglob("*") if f.is_file() and f.name.endswith(TRACE_SUFFIXES))
            if not found:
                _fail(f"{item}: the directory holds no *.json[.gz], *.sqlite or rocprofv3 *_trace.csv trace")
            out.extend(found)
        elif p.is_file():
            out.append(p)
        else:
            _fail(f"{item}: no such trace file or directory")
    return out


def _run(job, request, n_files: int, quiet: bool):
    """A trace job under a progress bar (one step per file); its errors are one line, exit 2."""
    # auto_refresh=False: no refresh thread while the analysis forks its worker processes
    with Progress(TextColumn("[bold]analyzing[/] {task.description}"), BarColumn(), TimeElapsedColumn(),
                  console=err_console, disable=quiet or not err_console.is_terminal, transient=True,
                  auto_refresh=False) as progress:
        task = progress.add_task(f"{n_files} trace file(s)", total=n_files)
        progress.refresh()
        try:
            return job(request, lambda done, total, what: progress.update(task, completed=done, refresh=True))
        except (TraceLoadError, ValueError, OSError) as exc:
            _fail(str(exc))


def fit_table(spec, width: int) -> Table:
    """A rich table of a report table that never cuts a number: every numeric column gets the width of its
    widest cell; the least useful columns are dropped whole until that fits ``width``; text columns share
    what is left (at least 8 characters, names shortened with an ellipsis)."""
    cols = list(range(len(spec.columns)))

    def full(i: int) -> int:
        c = spec.columns[i]
        return max([len(row[i]) for row in spec.rows] + [max(map(len, c.header.split()), default=0)])

    def least(i: int) -> int:
        return full(i) if spec.columns[i].numeric else min(full(i), 8)

    dropped = []
    while sum(least(i) for i in cols) + 3 * len(cols) + 1 > width:  # text, padding, divider per column
        droppable = [i for i in cols if spec.columns[i].priority < 100]
        if not droppable:
            break
        worst = min(droppable, key=lambda i: spec.columns[i].priority)
        cols.remove(worst)
        dropped.append(spec.columns[worst].header)
    widths = {i: least(i) for i in cols}
    spare = width - sum(widths.values()) - 3 * len(cols) - 1
    for i in cols:  # text columns grow to their content, left to right, while room is left
        grow = min(max(0, spare), full(i) - widths[i])
        widths[i] += grow
        spare -= grow
    title = spec.title + (f" [dim](not shown at this width: {', '.join(dropped)}; see --json)[/]" if dropped else "")
    t = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False)
    for i in cols:
        c = spec.columns[i]
        header = c.header if len(c.header) <= widths[i] else c.header.replace(" ", "\n")  # headers wrap
        t.add_column(header, justify="right" if c.numeric else "left", no_wrap=True, overflow="ellipsis",
                     width=widths[i])
    for n, row in enumerate(spec.rows):
        t.add_row(*[escape(row[i]) for i in cols], style="bold" if n in spec.bold_rows else None)
    return t


def render(parts) -> None:
    """The report's blocks (:func:`wavefront.workbench.trace.report.blocks`) on the console."""
    for b in parts:
        if b.kind == "rule":
            console.rule(escape(b.text))
        elif b.kind == "warning":
            console.print(f"[yellow]warning:[/] {escape(b.text)}")
        elif b.kind == "note":
            console.print(f"[dim]{escape(b.text)}[/]")
        elif b.kind == "line":
            console.print(escape(b.text))
        else:
            console.print(fit_table(b.table, console.width))


@command(app, "analyze")
def analyze_cmd(
    traces: Annotated[list[str], typer.Argument(help="Trace files (.json[.gz], .sqlite, *_trace.csv), one per rank.")],
    device: Annotated[str | None, typer.Option(help="Device-table row for the roofline (h100, mi300x, ...); "
                                                    "default: the GPU named in the trace.")] = None,
    short_us: Annotated[float, typer.Option("--short-us", min=0.001, help="Kernels shorter are 'short'.")] = 10.0,
    top: Annotated[int, typer.Option(min=1, help="Rows per kernel table.")] = 15,
    align: Annotated[Align, typer.Option(help="Clock alignment across ranks.")] = Align.auto,
    workers: Annotated[int | None, typer.Option(min=1, help="Processes (default: the CPUs available).")] = None,
    hta_compatible: Annotated[bool, typer.Option("--hta-compatible", help="Also report HTA 0.5.0's temporal "
                                                 "breakdown and overlap, by its definitions.")] = False,
    figures_out: Annotated[str | None, output_option("--figures", help="Write dashboard figure specs (JSON).")] = None,
    annotate_out: Annotated[str | None, output_option("--annotate", help="Write a copy of the (single) trace with "
                                                      "the analysis as extra tracks, for Perfetto.")] = None,
    step_pattern: Annotated[str | None, typer.Option(help="NVTX/ROCTx step-range regex (group 1: N).")] = None,
    json_out: JsonOut = None,
) -> None:
    """Per-step breakdown (sums to the step time), kernel table and roofline, launch statistics, and
    multi-rank skew and collective waits."""
    paths = expand_paths(traces)
    if annotate_out and len(paths) != 1:
        _fail(f"--annotate takes exactly one trace file; got {len(paths)}")
    request = job.AnalyzeRequest(tuple(paths), device=device, short_us=short_us, top=top, align=align.value,
                                 workers=workers, annotate_to=annotate_out, hta_compatible=hta_compatible,
                                 step_pattern=step_pattern)
    result = _run(job.analyze, request, len(paths), json_out == "-")
    if json_out != "-":
        render(blocks(result, top))
        if result.annotation:
            console.print(f"wrote {escape(annotate_out or '')}: {result.annotation['copied']:,} events copied, "
                          f"{result.annotation['added']:,} analysis events added (open it in ui.perfetto.dev)")
        console.print(f"[dim]analyzed {len(result.ranks)} trace(s) in {result.wall_s:.1f} s (wall time of this "
                      "analysis on this machine's CPU)[/]")
    try:
        if figures_out:
            write_json(job.figures_document(result), figures_out)
        if json_out:
            write_json(result.as_dict(), json_out)
    except OSError as exc:
        _fail(f"cannot write the output: {exc}")


@command(app, "diff")
def diff_cmd(
    a: Annotated[str, typer.Argument(help="Baseline: a trace file or a directory of rank traces.")],
    b: Annotated[str, typer.Argument(help="Candidate: a trace file or a directory of rank traces.")],
    top: Annotated[int, typer.Option(min=1, help="Kernel families compared.")] = 15,
    alpha: Annotated[float, typer.Option(min=1e-9, max=0.5, help="Significance level of the tests.")] = 0.01,
    json_out: JsonOut = None,
) -> None:
    """B against A, per step: step time, each breakdown category and the top kernel families, each with
    a verdict (faster / slower / same / unknown) from bootstrap CI + Mann-Whitney."""
    quiet = json_out == "-"
    pa, pb = expand_paths([a]), expand_paths([b])
    result = _run(job.diff, job.DiffRequest(tuple(pa), tuple(pb), top=top, alpha=alpha), len(pa) + len(pb), quiet)
    if not quiet:
        for w in result.warnings:
            console.print(f"[yellow]warning:[/] {escape(w)}")
        console.print(fit_table(diff_table(result.diff), console.width))
    if json_out:
        write_json(result.as_dict(), json_out)


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="trace")


if __name__ == "__main__":
    app(prog_name="wavefront trace")
