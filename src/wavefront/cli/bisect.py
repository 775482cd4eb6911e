"""`wavefront bisect --good REV --bad REV --op NAME`: the commit that made a case slower."""

from __future__ import annotations

from typing import Annotated

import typer

from wavefront.cli._output import console, err_console, fail, write_json

SCHEMA = "wavefront.bisect/1"


def bisect(
    good: Annotated[str, typer.Option("--good", help="A revision that is fast.")],
    bad: Annotated[str, typer.Option("--bad", help="A later revision that is slow.")],
    op: Annotated[str | None, typer.Option("--op", help="The op to time at each commit.")] = None,
    case: Annotated[str | None, typer.Option("--case", help="Its case (default: the first bench case on a GPU, "
                                                            "'npow2' on CPU).")] = None,
    mode: Annotated[str, typer.Option(help="fwd, bwd or fwd_bwd.")] = "fwd",
    dtype: Annotated[str, typer.Option(help="fp32, bf16 or fp16.")] = "bf16",
    provider: Annotated[str, typer.Option(help="wavefront, eager or torch_compile.")] = "wavefront",
    reps: Annotated[int, typer.Option(help="Samples per commit.")] = 30,
    command: Annotated[str | None, typer.Option(
        "--command", help="Instead of --op: a shell command run in each checkout that prints duration samples "
                          "on its last line.")] = None,
    threshold: Annotated[float, typer.Option(help="Slowdown that counts as a regression (0.05 = 5%).")] = 0.05,
    repo: Annotated[str, typer.Option(help="The repository.")] = ".",
    json_out: Annotated[str | None, typer.Option("--json", help="Write the result document ('-': stdout).")] = None,
) -> None:
    """Find the first commit between --good and --bad where the case regresses: git bisect run in a
    temporary worktree, with the dynamic gate's rule as the test. Exits 1 if no commit was singled out."""
    import torch

    from wavefront.workbench.bench import bisect as B
    from wavefront.workbench.bench.gitwork import GitError

    if (op is None) == (command is None):
        fail("give exactly one of --op NAME or --command CMD")
    if threshold < 0:
        fail(f"--threshold must be >= 0; got {threshold}")
    if command is not None:
        check = B.shell_command(command)
    else:
        from wavefront.ops import REGISTRY

        if op not in REGISTRY:
            fail(f"--op: unknown op {op!r}; registered ops: {', '.join(sorted(REGISTRY))}")
        if mode not in ("fwd", "bwd", "fwd_bwd"):
            fail(f"--mode must be fwd, bwd or fwd_bwd; got {mode!r}")
        case = case or (REGISTRY[op].bench_cases[0].name if torch.cuda.is_available() else "npow2")
        check = B.op_command(op, case, mode, dtype, provider, reps)
        if not torch.cuda.is_available():
            err_console.print("[yellow]note:[/] no GPU: commits are timed under the CPU interpreter "
                              "(not a performance figure)")
    show = json_out != "-"
    try:
        result = B.bisect(repo, good, bad, check, threshold=threshold,
                          progress=(lambda msg: err_console.print(f"[dim]{msg}[/]")) if show else None)
    except (GitError, B.MeasureError, ValueError) as exc:
        fail(str(exc))
    if show:
        for s in result.steps:
            console.print(f"{s.sha[:10]} {s.verdict:5} median {s.median_us or float('nan'):.2f} us "
                          f"ratio {s.ratio or float('nan'):.3f} {s.note}")
        if result.found:
            console.print(f"[bold]first bad commit:[/] {result.first_bad} {result.subject}")
        else:
            console.print(f"[yellow]{result.message}[/]")
    if json_out:
        write_json({"schema": SCHEMA, **result.as_dict()}, json_out)
    if not result.found:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("bisect")(bisect)
