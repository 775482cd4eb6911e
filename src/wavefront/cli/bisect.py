"""`wavefront bisect --good REV --bad REV --op NAME`: the commit that made a case slower (the job is
wavefront.workbench.bench.bisect.run)."""

from __future__ import annotations

from typing import Annotated

import torch
import typer

from wavefront.cli._common import DType, JsonOut, Mode, Provider, command, write_json
from wavefront.cli._output import console, err_console, fail
from wavefront.workbench.bench.gitwork import GitError
from wavefront.workbench.jobs import bisect as job


def bisect(
    good: Annotated[str, typer.Option("--good", help="A revision that is fast.")],
    bad: Annotated[str, typer.Option("--bad", help="A later revision that is slow.")],
    op: Annotated[str | None, typer.Option("--op", help="The op to time at each commit.")] = None,
    case: Annotated[str | None, typer.Option("--case", help="Its case (default: the first bench case on a GPU, "
                                                            "'npow2' on CPU).")] = None,
    mode: Annotated[Mode, typer.Option(help="The mode to time.")] = Mode.fwd,
    dtype: Annotated[DType, typer.Option(help="The input dtype.")] = DType.bf16,
    provider: Annotated[Provider, typer.Option(help="The provider to time.")] = Provider.wavefront,
    reps: Annotated[int, typer.Option(min=1, help="Samples per commit.")] = 30,
    command_: Annotated[str | None, typer.Option(
        "--command", help="Instead of --op: a shell command run in each checkout that prints duration samples "
                          "on its last line.")] = None,
    threshold: Annotated[float, typer.Option(min=0.0, help="Slowdown that counts as a regression (0.05 = 5%).")]
    = 0.05,
    repo: Annotated[str, typer.Option(help="The repository.")] = ".",
    json_out: JsonOut = None,
) -> None:
    """Find the first commit between --good and --bad where the case regresses: git bisect run in a
    temporary worktree, with the dynamic gate's rule as the test. Exits 1 if no commit was singled out."""
    request = job.BisectRequest(good, bad, op=op, case=case, mode=mode.value, dtype=dtype.value,
                              provider=provider.value, reps=reps, command=command_, threshold=threshold, repo=repo)
    show = json_out != "-"
    try:
        request.measure_command()  # validate before any git work
        if op is not None and not torch.cuda.is_available():
            err_console.print("[yellow]note:[/] no GPU: commits are timed under the CPU interpreter "
                              "(not a performance figure)", soft_wrap=True)
        result = job.bisect(request, (lambda done, total, what: err_console.print(f"[dim]{what}[/]")) if show else None)
    except (GitError, job.MeasureError, ValueError) as exc:
        fail(str(exc))
    if show:
        for s in result.steps:
            console.print(f"{s.sha[:10]} {s.verdict:5} median {s.median_us or float('nan'):.2f} us "
                          f"ratio {s.ratio or float('nan'):.3f} {s.note}", soft_wrap=True)
        if result.found:
            console.print(f"[bold]first bad commit:[/] {result.first_bad} {result.subject}", soft_wrap=True)
        else:
            console.print(f"[yellow]{result.message}[/]", soft_wrap=True)
    if json_out:
        write_json(result.as_dict(), json_out)
    if result.exit_code:
        raise typer.Exit(result.exit_code)


def register(app: typer.Typer) -> None:
    command(app, "bisect")(bisect)
