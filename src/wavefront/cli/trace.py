"""`wavefront trace analyze` and `wavefront trace diff`: profiler-trace analysis on the command line."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer

from wavefront.cli._output import console, err_console, fail, write_json

app = typer.Typer(name="trace", no_args_is_help=True, add_completion=False,
                  help="Analyze torch.profiler (Kineto/Chrome JSON) traces: breakdown, kernels, launches, ranks.")

TRACE_SUFFIXES = (".json", ".json.gz")
SHORT_LABELS = {"compute": "compute", "comm_overlapped": "comm hidden", "comm_exposed": "comm exposed",
                "memory": "memcpy", "idle_host_bound": "idle host", "idle_other": "idle other"}


def expand_paths(items: list[str]) -> list[Path]:
    """Files as given; a directory stands for the trace files in it (sorted)."""
    out: list[Path] = []
    for item in items:
        p = Path(item)
        if p.is_dir():
            found = sorted(f for f in p.iterdir() if f.is_file() and f.name.endswith(TRACE_SUFFIXES))
            if not found:
                fail(f"{item}: the directory holds no *.json or *.json.gz trace")
            out.extend(found)
        elif p.is_file():
            out.append(p)
        else:
            fail(f"{item}: no such trace file or directory")
    return out


def _analyze(paths: list[Path], device, short_us, top, align, quiet: bool):
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn

    from wavefront.workbench.trace import TraceLoadError, analyze

    with Progress(TextColumn("[bold]loading[/] {task.description}"), BarColumn(), DownloadColumn(),
                  TimeElapsedColumn(), console=err_console, disable=quiet, transient=True) as progress:
        tasks: dict[str, int] = {}

        def report(path: str, done: int, total: int) -> None:
            if path not in tasks:
                tasks[path] = progress.add_task(Path(path).name, total=total)
            progress.update(tasks[path], completed=done)

        try:
            return analyze(paths, device=device, short_us=short_us, top=top, align=align, progress=report)
        except TraceLoadError as exc:
            fail(str(exc))
        except ValueError as exc:
            fail(str(exc))


def _ms(us: float) -> str:
    return f"{us / 1e3:,.3f}"


def _print_rank(r, top: int) -> None:
    from rich.table import Table

    from wavefront.workbench.trace.breakdown import CATEGORIES

    title = (f"rank {r.rank if r.rank is not None else '?'}  {Path(r.path).name}  host={r.host}  "
             f"device={r.device_name or 'none'}  domain={r.domain}")
    console.rule(title)
    for w in r.warnings:
        console.print(f"[yellow]warning:[/] {w}")
    for n in r.notes:
        console.print(f"[dim]{n}[/]")
    t = Table(title="step breakdown, ms (the six pieces sum to the step time)")
    t.add_column("step")
    t.add_column("step", justify="right")
    for c in CATEGORIES:
        t.add_column(SHORT_LABELS[c], justify="right")
    for s in r.steps:
        t.add_row(str(s.step if s.step is not None else "all"), _ms(s.dur_us), *[_ms(s.us(c)) for c in CATEGORIES])
    totals = r.totals()
    if len(r.steps) > 1:
        t.add_row("total", _ms(totals["step_us"]), *[_ms(totals[f"{c}_us"]) for c in CATEGORIES], style="bold")
    if totals["step_us"] > 0:
        t.add_row("share", "100%", *[f"{100 * totals[f'{c}_us'] / totals['step_us']:.1f}%" for c in CATEGORIES],
                  style="dim")
    console.print(t)
    for label, rows in (("kernel families" if r.domain == "device" else "CPU operator families", r.kernels.families),
                        ("kernels" if r.domain == "device" else "top-level CPU operators", r.kernels.kernels)):
        kt = Table(title=f"top {label} by total time")
        kt.add_column("name", no_wrap=True, overflow="ellipsis", max_width=max(24, console.width - 76))
        for col in ("class", "count", "total ms", "share", "mean us", "median us", "p90 us"):
            kt.add_column(col, justify="left" if col == "class" else "right")
        for k in rows[:top]:
            kt.add_row(k.name, k.cls, str(k.count), _ms(k.total_us), f"{100 * k.share:.1f}%", f"{k.mean_us:.1f}",
                       f"{k.median_us:.1f}", f"{k.p90_us:.1f}")
        console.print(kt)
    if r.kernels.roofline:
        rt = Table(title=f"roofline ({r.kernels.gpu or 'no device: FLOPs and bytes only'})")
        for col in ("op", "shapes", "dtype", "count", "median us", "GFLOP", "MB", "FLOP/B", "TFLOP/s", "% of roof",
                    "bound"):
            rt.add_column(col, justify="left" if col in ("op", "shapes", "dtype", "bound") else "right",
                          no_wrap=col == "op", overflow="ellipsis", max_width=32)
        for p in r.kernels.roofline[:top]:
            rt.add_row(p.op, p.shapes[:40], p.dtype, str(p.count), f"{p.median_us:.1f}", f"{p.flops / 1e9:.3f}",
                       f"{p.bytes_moved / 1e6:.3f}", f"{p.intensity:.1f}", f"{p.achieved_tflops:.3g}",
                       "-" if p.pct_of_roof is None else f"{p.pct_of_roof:.3g}", p.bound or "-")
        console.print(rt)
    for n in r.kernels.notes:
        if r.domain == "device":
            console.print(f"[dim]{n}[/]")
    if r.launch is not None:
        ls = r.launch
        d = ls.delay_us
        console.print(f"launch delay (runtime call start -> first device start, {d.n} launches): median "
                      f"{d.p50:.1f} us, p90 {d.p90:.1f} us, p99 {d.p99:.1f} us, max {d.max:.1f} us; "
                      f"{ls.n_graph_launches} graph launch(es) running {ls.graph_kernels} kernel(s)")
        o = ls.op_delay_us
        console.print(f"CPU op start -> its first device start ({o.n} op calls): median {o.p50:.1f} us, "
                      f"p90 {o.p90:.1f} us, max {o.max:.1f} us")
        console.print(f"short kernels (< {ls.short_us:g} us): {ls.n_short}/{ls.n_kernels} "
                      f"({100 * ls.short_count_fraction:.1f}% of kernels, {100 * ls.short_time_fraction:.1f}% of "
                      f"kernel time); unlinked device events: {ls.unlinked_device_events}")
        if ls.per_step:
            mean_launch = sum(s.launch_cpu_us for s in ls.per_step) / len(ls.per_step)
            mean_sync = sum(s.sync_cpu_us for s in ls.per_step) / len(ls.per_step)
            console.print(f"CPU time per step in launch APIs: {mean_launch:,.1f} us (mean), in sync APIs: "
                          f"{mean_sync:,.1f} us")


def _print_multirank(mr) -> None:
    from rich.table import Table

    console.rule("multi-rank")
    console.print(f"clock alignment: {mr.alignment}; matched collectives: {mr.n_matched_collectives}"
                  + (f"; residual spread of aligned collective ends {mr.alignment_residual_us:.1f} us"
                     if mr.alignment_residual_us is not None else ""))
    for w in mr.warnings:
        console.print(f"[yellow]warning:[/] {w}")
    t = Table(title="step time per rank (ms)")
    t.add_column("step")
    for rank in mr.ranks:
        t.add_column(f"rank {rank}", justify="right")
    t.add_column("skew ms", justify="right")
    t.add_column("slowest", justify="right")
    for s in mr.steps:
        t.add_row(str(s.step if s.step is not None else "all"), *[_ms(s.dur_us_by_rank[r]) for r in mr.ranks],
                  _ms(s.skew_us), str(s.slowest_rank))
    console.print(t)
    w = Table(title="time waiting in collectives for the last rank to arrive (ms)")
    w.add_column("rank")
    w.add_column("total", justify="right")
    w.add_column("entered last (times)", justify="right")
    for rank in mr.ranks:
        w.add_row(str(rank), _ms(mr.wait_total_us[rank]), str(mr.last_arrivals[rank]))
    console.print(w)


@app.command("analyze")
def analyze_cmd(
    traces: Annotated[list[str], typer.Argument(help="Trace files (.json / .json.gz), one per rank, or directories.")],
    device: Annotated[str | None, typer.Option(help="Device-table row for the roofline (h100, mi300x, ...); "
                                                    "default: the GPU named in the trace.")] = None,
    short_us: Annotated[float, typer.Option("--short-us", help="Kernels shorter than this are 'short'.")] = 10.0,
    top: Annotated[int, typer.Option(help="Rows per kernel table.")] = 15,
    align: Annotated[str, typer.Option(help="Clock alignment across ranks: auto, ends or none.")] = "auto",
    figures_out: Annotated[str | None, typer.Option("--figures", help="Write dashboard figure specs (JSON).")] = None,
    annotate_out: Annotated[str | None, typer.Option("--annotate", help="Write a copy of the (single) trace with "
                                                     "the analysis as extra tracks, for Perfetto.")] = None,
    json_out: Annotated[str | None, typer.Option("--json", help="Write the result document ('-': stdout).")] = None,
) -> None:
    """Per-step breakdown (sums to the step time), kernel table and roofline, launch statistics, and
    multi-rank skew and collective waits."""
    if align not in ("auto", "ends", "none"):
        fail(f"--align must be auto, ends or none; got {align!r}")
    if short_us <= 0 or top <= 0:
        fail("--short-us and --top must be positive")
    paths = expand_paths(traces)
    if annotate_out and len(paths) != 1:
        fail(f"--annotate takes exactly one trace file; got {len(paths)}")
    t0 = time.perf_counter()
    result = _analyze(paths, device, short_us, top, align, quiet=json_out == "-")
    wall_s = time.perf_counter() - t0
    if json_out != "-":
        for w in result.warnings:
            console.print(f"[yellow]warning:[/] {w}")
        for r in result.ranks:
            _print_rank(r, top)
        if result.multirank is not None:
            _print_multirank(result.multirank)
        console.print(f"[dim]analyzed {len(result.ranks)} trace(s) in {wall_s:.1f} s (wall time of this analysis "
                      "on this machine's CPU)[/]")
    if annotate_out:
        from wavefront.workbench.trace.annotate import write_annotated

        info = write_annotated(paths[0], annotate_out)
        if json_out != "-":
            console.print(f"wrote {annotate_out}: {info['copied']:,} events copied, {info['added']:,} analysis "
                          "events added (open it in ui.perfetto.dev)")
    if figures_out:
        from wavefront.workbench.trace.figures import figures

        write_json({"schema": "wavefront.trace.figures/1", "figures": figures(result)}, figures_out)
    if json_out:
        write_json(result.as_dict() | {"inputs": [str(p) for p in paths], "analysis_wall_s": wall_s}, json_out)


@app.command("diff")
def diff_cmd(
    a: Annotated[str, typer.Argument(help="Baseline: a trace file or a directory of rank traces.")],
    b: Annotated[str, typer.Argument(help="Candidate: a trace file or a directory of rank traces.")],
    top: Annotated[int, typer.Option(help="Kernel families compared.")] = 15,
    alpha: Annotated[float, typer.Option(help="Significance level of the tests.")] = 0.01,
    json_out: Annotated[str | None, typer.Option("--json", help="Write the result document ('-': stdout).")] = None,
) -> None:
    """B against A, per step: step time, each breakdown category and the top kernel families, each with
    a verdict (faster / slower / same / unknown) from bootstrap CI + Mann-Whitney."""
    from rich.table import Table

    from wavefront.workbench.trace.diff import diff

    if not 0 < alpha < 1:
        fail(f"--alpha must be in (0, 1); got {alpha}")
    quiet = json_out == "-"
    pa, pb = expand_paths([a]), expand_paths([b])
    ra = _analyze(pa, None, 10.0, 50, "auto", quiet)
    rb = _analyze(pb, None, 10.0, 50, "auto", quiet)
    result = diff(ra, rb, top=top, alpha=alpha)
    if not quiet:
        for w in ra.warnings + rb.warnings + result.warnings:
            console.print(f"[yellow]warning:[/] {w}")
        t = Table(title=f"B vs A per step ({result.n_steps_a} steps in A, {result.n_steps_b} in B; "
                        "ratio = median B / median A)")
        t.add_column("kind")
        t.add_column("quantity", no_wrap=True, overflow="ellipsis", max_width=max(24, console.width - 80))
        for col in ("median A ms", "median B ms", "ratio", "95% CI", "p", "verdict"):
            t.add_column(col, justify="left" if col == "verdict" else "right")
        colors = {"faster": "green", "slower": "red", "same": "white", "unknown": "yellow"}
        for r in result.rows:
            t.add_row(r.kind, r.key, _ms(r.median_a_us), _ms(r.median_b_us),
                      "-" if r.ratio is None else f"{r.ratio:.3f}",
                      "-" if r.ci_low is None else f"[{r.ci_low:.3f}, {r.ci_high:.3f}]",
                      "-" if r.p_value is None else f"{r.p_value:.2g}",
                      f"[{colors[r.verdict]}]{r.verdict}[/]" + (f" [dim]({r.note})[/]" if r.note else ""))
        console.print(t)
    if json_out:
        write_json(result.as_dict() | {"a": [str(p) for p in pa], "b": [str(p) for p in pb]}, json_out)


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="trace")
