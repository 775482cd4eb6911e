"""`wavefront bench`: every registered op against its float64 reference, forward and backward."""

from __future__ import annotations

from typing import Annotated

import typer

from wavefront.cli._output import console, fail, write_json

SCHEMA = "wavefront.bench.correctness/1"


def _parse_dtypes(names: list[str] | None):
    import torch

    if not names:
        return None
    table = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
             "fp16": torch.float16, "float16": torch.float16}
    out = []
    for n in names:
        if n not in table:
            fail(f"--dtype must be one of fp32, bf16, fp16; got {n!r}")
        out.append(table[n])
    return out


def run_correctness(ops: list[str] | None, dtypes, device: str, include_slow: bool, show_progress: bool = True):
    """Check every (op, case, dtype); returns the list of CaseCheck, in registry order."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from wavefront.ops._spec import dtype_name
    from wavefront.workbench.correctness import check_case, iter_checks

    todo = list(iter_checks(ops, dtypes, device, include_slow))
    results = []
    with Progress(TextColumn("[bold]correctness"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.description}"), console=console, disable=not show_progress,
                  transient=True) as progress:
        task = progress.add_task("", total=len(todo))
        for spec, case, dtype in todo:
            progress.update(task, description=f"{spec.name}/{case.name}/{dtype_name(dtype)}")
            results.append(check_case(spec, case, dtype, device))
            progress.advance(task)
    return results


def correctness_table(results, title: str):
    from rich.table import Table

    table = Table(title=title, show_lines=False)
    for col in ("op", "case", "dtype", "fwd err ours", "fwd err eager", "bwd err ours", "bwd err eager", "result"):
        table.add_column(col, justify="right" if "err" in col else "left", overflow="fold")
    for r in results:
        fwd, bwd = r.worst("fwd"), r.worst("bwd")

        def fmt(c, attr):
            return f"{getattr(c, attr):.2e}" if c is not None else "-"

        verdict = "[green]pass[/]" if r.passed else ("[red]error[/]" if r.error else "[red]FAIL[/]")
        table.add_row(r.op, r.case, r.dtype, fmt(fwd, "err_ours"), fmt(fwd, "err_eager"), fmt(bwd, "err_ours"),
                      fmt(bwd, "err_eager"), verdict)
    return table


def bench(
    op: Annotated[list[str] | None, typer.Option("--op", help="Only this op (repeatable).")] = None,
    dtype: Annotated[list[str] | None, typer.Option("--dtype", help="fp32, bf16 or fp16 (repeatable).")] = None,
    device: Annotated[str | None, typer.Option(help="cuda or cpu (default: cuda when present).")] = None,
    slow: Annotated[bool, typer.Option("--slow", help="Include the cases marked slow.")] = False,
    json_out: Annotated[str | None, typer.Option("--json", help="Write the result document ('-': stdout).")] = None,
) -> None:
    """Run every registered op against its float64 reference, forward and backward, with eager PyTorch's
    error in the same dtype as the yardstick; print the table and exit non-zero if any case fails."""
    import torch

    from wavefront import runtime
    from wavefront.ops import REGISTRY

    for name in op or []:
        if name not in REGISTRY:
            fail(f"--op: unknown op {name!r}; registered ops: {', '.join(sorted(REGISTRY))}")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    info = runtime.describe(device)
    results = run_correctness(op, _parse_dtypes(dtype), device, slow, show_progress=json_out != "-")
    n_fail = sum(not r.passed for r in results)
    if json_out != "-":
        console.print(correctness_table(results, f"correctness vs float64 reference on {info['backend']} "
                                                 f"({info['arch']})"))
        if info["backend"].startswith("cpu"):
            console.print("[dim]CPU interpreter: wall times are correctness runs, not performance figures.[/]")
        console.print(f"{len(results) - n_fail}/{len(results)} passed")
    if json_out:
        write_json({"schema": SCHEMA, "runtime": info, "n_cases": len(results), "n_failed": n_fail,
                    "results": [r.as_dict() for r in results]}, json_out)
    if n_fail:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("bench")(bench)
