"""`wavefront bench`: the main job. Correctness of every registered op, the modeled roofline on a target
device, timings against the baselines on a GPU, all stored, and the dashboard written."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Annotated

import typer

from wavefront.cli._output import console, err_console, fail, write_json

SCHEMA = "wavefront.bench/1"
DEFAULT_REPORT = "artifacts/wavefront-report.html"


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


def _progress(label: str, show: bool):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn(f"[bold]{label}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TextColumn("{task.description}"), console=err_console, disable=not show, transient=True)


def run_correctness(ops: list[str] | None, dtypes, device: str, include_slow: bool, show_progress: bool = True,
                    case_names: list[str] | None = None):
    """Check every (op, case, dtype); returns the list of CaseCheck, in registry order."""
    from wavefront.ops._spec import dtype_name
    from wavefront.workbench.bench.correctness import check_case, iter_checks

    todo = [(spec, case, dtype) for spec, case, dtype in iter_checks(ops, dtypes, device, include_slow)
            if not case_names or case.name in case_names]
    results = []
    with _progress("correctness", show_progress) as progress:
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


def modeled_table(points, gpu):
    from rich.table import Table

    table = Table(title=f"modeled roofline on {gpu.name} (datasheet figures, bf16; no device was run)")
    for col in ("op", "case", "mode", "MB moved", "FLOP/B", "attainable us", "bound"):
        table.add_column(col, justify="left" if col in ("op", "case", "mode", "bound") else "right")
    for p in points:
        table.add_row(p.op, p.case, p.mode, f"{p.min_bytes / 1e6:.1f}", f"{p.intensity:.2f}", f"{p.attainable_us:.1f}",
                      p.bound)
    return table


def timing_table(rows, gpu_timing: bool):
    from rich.table import Table

    from wavefront.workbench.bench.records import CPU_LABEL

    title = "timings (GPU, device events)" if gpu_timing else f"timings ({CPU_LABEL})"
    table = Table(title=title)
    cols = ["op", "case", "mode", "provider", "median us", "p10-p90 us", "method"]
    if gpu_timing:
        cols += ["GB/s", "% peak BW", "% copy BW", "peak MiB", "speedup of wavefront"]
    cols.append("note")
    for c in cols:
        table.add_column(c, overflow="fold")
    medians = {m.key: m.median_us for m in rows if m.ok}
    for m in rows:
        if not m.ok:
            table.add_row(m.op, m.case, m.mode, m.provider, "-", "-", m.status, *([""] * 5 if gpu_timing else []),
                          m.reason[:80])
            continue
        cells = [m.op, m.case, m.mode, m.provider, f"{m.median_us:.2f}", f"{m.p10_us:.2f}-{m.p90_us:.2f}", m.method]
        if gpu_timing:
            ours = medians.get((*m.case_key, "wavefront"))
            speed = f"{m.median_us / ours:.2f}x" if ours and m.provider != "wavefront" else ""
            cells += [f"{m.gbps:.0f}", _pct(m.pct_peak_bw), _pct(m.pct_copy_bw),
                      f"{m.peak_mem_bytes / 2**20:.0f}" if m.peak_mem_bytes is not None else "", speed]
        table.add_row(*cells, m.reason[:80])
    return table


def _static_documents(ops, inspect_targets: str, traffic: bool, out_dir: Path, show: bool) -> dict[str, str]:
    """The CPU main job's static sections: machine code per target (inspect) and bytes moved (traffic),
    written as JSON documents beside the report. A failure is reported and the job goes on."""
    import torch

    from wavefront.cli.inspect import parse_targets, run_inspect, run_traffic

    docs: dict[str, str] = {}
    out_dir.mkdir(parents=True, exist_ok=True)
    jobs = []
    if inspect_targets.strip().lower() != "none":
        targets = parse_targets(inspect_targets)
        jobs.append(("inspect", lambda: run_inspect(ops, targets, torch.bfloat16, show_progress=show)))
    if traffic:
        jobs.append(("traffic", lambda: run_traffic(ops, torch.bfloat16, show_progress=show)))
    for name, job in jobs:
        try:
            doc = job().as_dict()
        except Exception as exc:  # the correctness results stand; say what is missing and why
            err_console.print(f"[yellow]{name} skipped:[/] {type(exc).__name__}: {exc}")
            continue
        path = out_dir / f"{name}.json"
        write_json(doc, path)
        docs[name] = str(path)
        if show:
            console.print(f"{name}: {len(doc.get('rows', []))} rows -> {path}")
    return docs


def _pct(x) -> str:
    return f"{x:.0f}%" if x is not None else ""


def bench(
    op: Annotated[list[str] | None, typer.Option("--op", help="Only this op (repeatable).")] = None,
    mode: Annotated[list[str] | None, typer.Option("--mode", help="fwd, bwd or fwd_bwd (repeatable; default all).")]
    = None,
    provider: Annotated[list[str] | None, typer.Option(
        "--provider", help="wavefront, eager, torch_compile, liger (repeatable; default all).")] = None,
    dtype: Annotated[list[str] | None, typer.Option(
        "--dtype", help="fp32, bf16 or fp16 (repeatable). Correctness: default every dtype; timing: bf16.")] = None,
    case: Annotated[list[str] | None, typer.Option("--case", help="Only cases with this name (repeatable).")] = None,
    device: Annotated[str | None, typer.Option(help="cuda or cpu (default: cuda when present).")] = None,
    device_model: Annotated[str | None, typer.Option(
        "--device-model", help="Device-table row for the modeled roofline and % of peak (default: the GPU in use, "
                               "h100 on CPU).")] = None,
    slow: Annotated[bool, typer.Option("--slow", help="Include the correctness cases marked slow.")] = False,
    reps: Annotated[int, typer.Option(help="Timed repetitions per measurement (>= 30 on a GPU).")] = 30,
    warmup: Annotated[int, typer.Option(help="Untimed warm-up calls.")] = 5,
    budget_s: Annotated[float | None, typer.Option("--budget-s", help="Stop timing after this many seconds "
                                                                      "(the rest is recorded as skipped).")] = None,
    cpu_timing: Annotated[bool, typer.Option("--cpu-timing", help="On CPU, also time the small cases (labelled: "
                                                                  "not performance figures).")] = False,
    skip_correctness: Annotated[bool, typer.Option("--skip-correctness", help="Time only.")] = False,
    store: Annotated[str, typer.Option(help="Results store (SQLite).")] = "wavefront-results.sqlite",
    no_store: Annotated[bool, typer.Option("--no-store", help="Keep nothing (the report reads a temporary "
                                                              "store).")] = False,
    report: Annotated[str, typer.Option(help="Where to write the HTML dashboard.")] = DEFAULT_REPORT,
    no_report: Annotated[bool, typer.Option("--no-report", help="Do not write the dashboard.")] = False,
    doc: Annotated[list[str] | None, typer.Option(
        "--doc", help="A JSON document to tabulate in the report (wavefront inspect/traffic --json; repeatable).")]
    = None,
    inspect_targets: Annotated[str, typer.Option(
        "--inspect-targets", help="On CPU, compile every kernel for these targets and tabulate the machine code in "
                                  "the report (comma-separated; 'none' to skip; all six: wavefront inspect).")]
    = "sm_90,gfx942",
    traffic: Annotated[bool, typer.Option("--traffic/--no-traffic", help="On CPU, count each kernel's bytes "
                                                                          "(instrumented interpreter) for the report.")]
    = True,
    label: Annotated[str, typer.Option(help="A label stored with the run.")] = "",
    json_out: Annotated[str | None, typer.Option("--json", help="Write the result document ('-': stdout).")] = None,
) -> None:
    """The main job: every registered op against its float64 reference (forward and backward), the
    modeled roofline on a target device, and on a GPU timings of wavefront vs eager vs torch.compile vs
    Liger-Kernel; results go to the store and the dashboard. Exits 1 if any correctness case fails."""
    import torch

    from wavefront import runtime
    from wavefront.ops import REGISTRY
    from wavefront.workbench.bench import harness as H
    from wavefront.workbench.bench.model import model_case
    from wavefront.workbench.bench.provenance import collect_run_info
    from wavefront.workbench.bench.providers import PROVIDERS
    from wavefront.workbench.bench.records import TIMING_CPU, TIMING_GPU, TIMING_NONE, CorrectnessRow, StoredRun
    from wavefront.workbench.bench.runnable import MODES, modes_for
    from wavefront.workbench.bench.store import ResultStore, StoreError
    from wavefront.workbench.hardware import get_gpu, gpu_from_device_name

    for name in op or []:
        if name not in REGISTRY:
            fail(f"--op: unknown op {name!r}; registered ops: {', '.join(sorted(REGISTRY))}")
    for m in mode or []:
        if m not in MODES:
            fail(f"--mode must be one of {', '.join(MODES)}; got {m!r}")
    for p in provider or []:
        if p not in PROVIDERS:
            fail(f"--provider must be one of {', '.join(PROVIDERS)}; got {p!r}")
    if device not in (None, "cpu", "cuda"):
        fail(f"--device must be cuda or cpu; got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        fail("--device cuda: torch sees no GPU on this machine")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    on_gpu = device == "cuda"
    if reps < 1 or (on_gpu and reps < 30):
        fail(f"--reps must be >= 30 on a GPU (>= 1 on CPU); got {reps}")
    try:
        gpu = get_gpu(device_model) if device_model else (
            gpu_from_device_name(torch.cuda.get_device_name()) if on_gpu else get_gpu("h100"))
    except ValueError as exc:
        fail(f"--device-model: {exc}" if device_model else f"{exc}; pass --device-model to pick a table row")
    dtypes = _parse_dtypes(dtype)
    show = json_out != "-"
    timing = TIMING_GPU if on_gpu else (TIMING_CPU if cpu_timing else TIMING_NONE)
    info = collect_run_info(device, label=label, timing=timing, device_model=gpu.key)
    run = StoredRun(info)
    store_path = Path(tempfile.mkdtemp(prefix="wavefront-bench-")) / "run.sqlite" if no_store else Path(store)
    try:
        st = ResultStore(store_path)
    except StoreError as exc:
        fail(str(exc))
    rt = runtime.describe(device)
    results = []
    with st:
        run_id = st.add_run(info)
        if not skip_correctness:
            results = run_correctness(op, dtypes, device, slow, show_progress=show, case_names=case)
            run.correctness = [CorrectnessRow.from_check(r) for r in results]
            st.add_correctness(run_id, run.correctness)
            if show:
                console.print(correctness_table(results, f"correctness vs float64 reference on {rt['backend']} "
                                                         f"({rt['arch']})"))
        modeled = [model_case(REGISTRY[n], c, torch.bfloat16, m, gpu) for n in (op or REGISTRY)
                   for c in REGISTRY[n].bench_cases for m in modes_for(REGISTRY[n]) if not mode or m in mode]
        if show:
            console.print(modeled_table(modeled, gpu))
        if timing != TIMING_NONE:
            cfg = H.BenchConfig(ops=tuple(op) if op else None, modes=tuple(mode or MODES),
                                providers=tuple(provider or PROVIDERS), dtypes=tuple(dtypes or (torch.bfloat16,)),
                                case_set="bench" if on_gpu else "small", case_names=tuple(case) if case else None,
                                reps=reps, warmup=warmup, budget_s=budget_s)
            ctx = None
            if on_gpu:
                with err_console.status("measuring device-to-device copy bandwidth"):
                    ctx = H.gpu_context(torch.device(device), gpu)
                info.copy_gbps, info.flush_bytes = ctx.copy_gbps, ctx.flusher.n_bytes
                st.update_run(info)
            items = H.plan(cfg)
            with _progress("timing", show) as progress:
                task = progress.add_task("", total=len(items))

                def on_item(item, rows):
                    st.add_measurements(run_id, rows)  # committed as it goes: an interrupted run keeps them
                    progress.update(task, description=item.label)
                    progress.advance(task)

                for rows in H.Harness(cfg, device, gpu_ctx=ctx).run(on_item, items):
                    run.measurements.extend(rows)
            if show:
                console.print(timing_table(run.measurements, on_gpu))
    static_docs: dict[str, str] = {}
    if not on_gpu:
        static_docs = _static_documents(op, inspect_targets, traffic, Path(report).parent, show)
    n_fail = sum(not r.passed for r in results)
    if show:
        if not on_gpu:
            console.print("[dim]CPU interpreter: wall times are correctness runs, not performance figures.[/]")
        if results:
            console.print(f"{len(results) - n_fail}/{len(results)} correctness cases passed")
        console.print(f"run {run_id} stored in {store_path}" if not no_store else "nothing stored (--no-store)")
    report_path = None
    if not no_report:
        from wavefront.workbench.report import write_report

        try:
            report_path = write_report(report, store_path, [*(doc or []), *static_docs.values()])
        except (ValueError, OSError) as exc:
            fail(f"report: {exc}")
        if show:
            console.print(f"dashboard: {report_path}")
    if json_out:
        write_json({"schema": SCHEMA, "runtime": rt, "run_id": run_id, "store": None if no_store else str(store_path),
                    "report": str(report_path) if report_path else None, "documents": static_docs,
                    "n_cases": len(results),
                    "n_failed": n_fail, "results": [r.as_dict() for r in results],
                    "modeled": [p.as_dict() for p in modeled], "run": run.as_dict()}, json_out)
    if n_fail:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("bench")(bench)
