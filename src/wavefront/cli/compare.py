"""`wavefront compare A B`: per-case A/B statistics of two stored runs, or of two git revisions (the job is
wavefront.workbench.bench.compare.run)."""

from __future__ import annotations

from typing import Annotated

import typer

from wavefront.cli._common import Bars, JsonOut, Mode, OpsOption, Provider, command, table, values, write_json
from wavefront.cli._output import console, err_console, fail
from wavefront.workbench.bench.gitwork import GitError
from wavefront.workbench.bench.store import StoreError
from wavefront.workbench.jobs import compare as job

_COLORS = {"faster": "green", "slower": "red", "same": "white", "unknown": "yellow"}


def _table(deltas, title: str):
    rows = []
    for d in deltas:
        c, ci = d.comparison, d.speedup_ci
        rows.append([f"{d.op} {d.case} {d.mode} {d.dtype} {d.provider}", f"{d.speedup:.3f}x" if d.speedup else "-",
                     f"[{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "-", f"{c.p_value:.2g}" if c else "-",
                     f"[{_COLORS[d.verdict]}]{d.verdict}[/]", d.note])
    return table(title, ["case", "speedup B/A", "95% CI", "p", "verdict", "note"], rows,
                 numeric=["speedup B/A", "95% CI", "p"], droppable=["p"])


def _calibrate(trials: int, json_out: str | None) -> None:
    report = job.calibrate(job.CalibrateRequest(trials=trials))
    if json_out != "-":
        console.print(report.markdown(), soft_wrap=True)
    if json_out:
        write_json(report.as_dict(), json_out)


def compare(
    run_a: Annotated[str | None, typer.Argument(help="Run A: a run id, 'latest~1', a label, a results JSON/SQLite "
                                                     "file, or with --git a git revision.")] = None,
    run_b: Annotated[str | None, typer.Argument(help="Run B (same forms as A).")] = None,
    git_revs: Annotated[bool, typer.Option("--git", help="A and B are git revisions: benchmark both now, "
                                                         "interleaved.")] = False,
    op: OpsOption = None,
    case: Annotated[list[str] | None, typer.Option("--case", help="With --git: case names (default: each op's "
                                                                  "bench cases on a GPU, 'npow2' on CPU).")] = None,
    mode: Annotated[list[Mode] | None, typer.Option("--mode", help="With --git: modes (default fwd).")] = None,
    provider: Annotated[list[Provider] | None, typer.Option("--provider", help="Only these providers "
                                                                               "(repeatable).")] = None,
    rounds: Annotated[int, typer.Option(min=1, help="With --git: interleaved rounds.")] = 6,
    reps_per_round: Annotated[int, typer.Option("--reps-per-round", min=1, help="With --git: samples per round.")]
    = 10,
    repo: Annotated[str, typer.Option(help="With --git: the repository.")] = ".",
    store: Annotated[str, typer.Option(help="Results store to read runs from.")] = "wavefront-results.sqlite",
    calibrate: Annotated[bool, typer.Option("--calibrate", help="Print the verdicts' calibration on synthetic "
                                                                "samples instead.")] = False,
    trials: Annotated[int, typer.Option(min=1, help="With --calibrate: trials per scenario.")] = 500,
    json_out: JsonOut = None,
) -> None:
    """Per case: speedup of B over A with a bootstrap 95% interval, Mann-Whitney p-value and a verdict
    (faster / slower / same / unknown)."""
    if calibrate:
        return _calibrate(trials, json_out)
    if run_a is None or run_b is None:
        fail("give two runs: wavefront compare RUN_A RUN_B (or --git REV_A REV_B, or --calibrate)")

    show = json_out != "-"
    request = job.CompareRequest(run_a, run_b, git=git_revs, ops=tuple(op or ()), cases=tuple(case or ()),
                               modes=values(mode), providers=values(provider), rounds=rounds,
                               reps_per_round=reps_per_round, repo=repo, store=store)
    try:
        with Bars(show and git_revs) as bars:
            result = job.compare(request, bars.phase("compare"))
    except (GitError, StoreError, ValueError) as exc:
        fail(str(exc))
    if show:
        if result.deltas:
            console.print(_table(result.deltas, f"A = {run_a} vs B = {run_b}"))
        for n in result.notes:
            err_console.print(f"[yellow]note:[/] {n}", soft_wrap=True, highlight=False)
        console.print(", ".join(f"{k} {v}" for k, v in result.counts.items()))
    if json_out:
        write_json(result.as_dict(), json_out)


def register(app: typer.Typer) -> None:
    command(app, "compare")(compare)
