"""`wavefront compare A B`: per-case A/B statistics of two stored runs, or of two git revisions."""

from __future__ import annotations

from typing import Annotated

import typer

from wavefront.cli._output import console, err_console, fail, write_json

SCHEMA = "wavefront.compare/1"


def _table(deltas, title: str):
    from rich.table import Table

    table = Table(title=title)
    for c in ("op", "case", "mode", "dtype", "provider", "speedup B/A", "95% CI", "p", "verdict", "note"):
        table.add_column(c, overflow="fold")
    colors = {"faster": "green", "slower": "red", "same": "white", "unknown": "yellow"}
    for d in deltas:
        c, ci = d.comparison, d.speedup_ci
        table.add_row(d.op, d.case, d.mode, d.dtype, d.provider, f"{d.speedup:.3f}x" if d.speedup else "-",
                      f"[{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "-", f"{c.p_value:.2g}" if c else "-",
                      f"[{colors[d.verdict]}]{d.verdict}[/]", d.note)
    return table


def compare(
    run_a: Annotated[str | None, typer.Argument(help="Run A: a run id, 'latest~1', a label, a results JSON/SQLite "
                                                     "file, or with --git a git revision.")] = None,
    run_b: Annotated[str | None, typer.Argument(help="Run B (same forms as A).")] = None,
    git_revs: Annotated[bool, typer.Option("--git", help="A and B are git revisions: benchmark both now, "
                                                         "interleaved.")] = False,
    op: Annotated[list[str] | None, typer.Option("--op", help="With --git: ops to time (repeatable; default all).")]
    = None,
    case: Annotated[list[str] | None, typer.Option("--case", help="With --git: case names (default: each op's "
                                                                  "bench cases on a GPU, 'npow2' on CPU).")] = None,
    mode: Annotated[list[str] | None, typer.Option("--mode", help="With --git: modes (default fwd).")] = None,
    provider: Annotated[list[str] | None, typer.Option("--provider", help="Only these providers (repeatable).")]
    = None,
    rounds: Annotated[int, typer.Option(help="With --git: interleaved rounds.")] = 6,
    reps_per_round: Annotated[int, typer.Option("--reps-per-round", help="With --git: samples per round.")] = 10,
    repo: Annotated[str, typer.Option(help="With --git: the repository.")] = ".",
    store: Annotated[str, typer.Option(help="Results store to read runs from.")] = "wavefront-results.sqlite",
    calibrate: Annotated[bool, typer.Option("--calibrate", help="Print the verdicts' calibration on synthetic "
                                                                "samples instead.")] = False,
    trials: Annotated[int, typer.Option(help="With --calibrate: trials per scenario.")] = 500,
    json_out: Annotated[str | None, typer.Option("--json", help="Write the result document ('-': stdout).")] = None,
) -> None:
    """Per case: speedup of B over A with a bootstrap 95% interval, Mann-Whitney p-value and a verdict
    (faster / slower / same / unknown)."""
    show = json_out != "-"
    if calibrate:
        from wavefront.workbench.bench.calibration import calibrate as run_calibration
        from wavefront.workbench.bench.calibration import markdown_table

        if trials < 1:
            fail(f"--trials must be >= 1; got {trials}")
        results = run_calibration(trials=trials)
        if show:
            console.print(markdown_table(results))
        if json_out:
            write_json({"schema": SCHEMA, "calibration": [r.as_dict() for r in results]}, json_out)
        return
    if run_a is None or run_b is None:
        fail("give two runs: wavefront compare RUN_A RUN_B (or --git REV_A REV_B, or --calibrate)")
    from wavefront.workbench.bench import compare as C

    if git_revs:
        cases = _probe_cases(op, case, mode, provider)
        from wavefront.cli.bench import _progress
        from wavefront.workbench.bench.gitwork import GitError

        try:
            with _progress("compare", show) as progress:
                task = progress.add_task("", total=rounds * len(cases) * 2)
                a, b, deltas = C.compare_revisions(repo, run_a, run_b, cases, rounds=rounds,
                                                   reps_per_round=reps_per_round,
                                                   progress=lambda i, n, s: progress.update(task, completed=i,
                                                                                            description=s))
        except (GitError, ValueError) as exc:
            fail(str(exc))
    else:
        from wavefront.workbench.bench.store import StoreError, open_run

        try:
            a, b = open_run(run_a, store), open_run(run_b, store)
        except StoreError as exc:
            fail(str(exc))
        deltas = C.compare_runs(a, b, providers=provider)
    notes = C.comparability_notes(a, b)
    counts = C.verdict_counts(deltas)
    if show:
        console.print(_table(deltas, f"A = {run_a} vs B = {run_b}"))
        for n in notes:
            err_console.print(f"[yellow]note:[/] {n}")
        console.print(", ".join(f"{k} {v}" for k, v in counts.items()))
    if json_out:
        write_json({"schema": SCHEMA, "a": a.info.as_dict(), "b": b.info.as_dict(), "notes": notes, "counts": counts,
                    "cases": [d.as_dict() for d in deltas]}, json_out)


def _probe_cases(ops, case_names, modes, providers):
    import torch

    from wavefront.ops import REGISTRY
    from wavefront.workbench.bench.compare import ProbeCase

    for name in ops or []:
        if name not in REGISTRY:
            fail(f"--op: unknown op {name!r}; registered ops: {', '.join(sorted(REGISTRY))}")
    on_gpu = torch.cuda.is_available()
    out = []
    for name in ops or REGISTRY:
        spec = REGISTRY[name]
        names = case_names or ([c.name for c in spec.bench_cases] if on_gpu else ["npow2"])
        for c in names:
            for m in modes or ["fwd"]:
                for p in providers or ["wavefront"]:
                    out.append(ProbeCase(name, c, m, "bf16", p))
    return out


def register(app: typer.Typer) -> None:
    app.command("compare")(compare)
