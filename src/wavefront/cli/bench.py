"""`wavefront bench`: the main job (wavefront.workbench.jobs.bench) with its options, progress and summary.
Every row goes to the store, the dashboard and --json; the terminal gets the plan, failures and a summary."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from wavefront.cli._common import (
    Bars,
    Device,
    DType,
    JsonOut,
    Mode,
    OpsOption,
    Profiler,
    Provider,
    command,
    note,
    output_option,
    request_errors,
    table,
    values,
    write_json,
)
from wavefront.cli._output import console, err_console, fail
from wavefront.workbench.bench.records import CPU_LABEL
from wavefront.workbench.jobs import bench as job
from wavefront.workbench.jobs import profile as profile_job
from wavefront.workbench.jobs.ops import split_targets

_FULL_HELP = ("On a CPU, run the full sweep: every non-slow correctness case in every dtype, every bench case "
              "compiled and counted (about 17 min and 7.5 GiB peak on 2 CPU cores). Default: the quick sweep, one "
              "case per op in every dtype and one representative case per op for inspect and traffic (about 2 "
              "min, under 2 GiB).")
ModeOpt = Annotated[list[Mode] | None, typer.Option("--mode", help="Only this mode (repeatable; default all).")]
ProviderOpt = Annotated[list[Provider] | None, typer.Option("--provider", help="Only this provider (repeatable; "
                                                                               "default all).")]
DTypeOpt = Annotated[list[DType] | None, typer.Option("--dtype", help="Only this dtype (repeatable). Correctness: "
                                                                      "default every dtype; timing: bf16.")]
CaseOpt = Annotated[list[str] | None, typer.Option("--case", help="Only cases with this name (repeatable).")]
DeviceOpt = Annotated[Device | None, typer.Option(help="Default: cuda when present.")]
ModelOpt = Annotated[str | None, typer.Option("--device-model", help="Device-table row for the modeled roofline "
                                                                     "and % of peak (default: the GPU, h100 on CPU).")]
FullOpt = Annotated[bool, typer.Option("--full", help=_FULL_HELP)]
SlowOpt = Annotated[bool, typer.Option("--slow", help="Include the correctness cases marked slow.")]
RepsOpt = Annotated[int, typer.Option(min=1, help="Timed repetitions per measurement (>= 30 on a GPU).")]
WarmupOpt = Annotated[int, typer.Option(min=0, help="Untimed warm-up calls.")]
BudgetOpt = Annotated[float | None, typer.Option("--budget-s", min=0.001, help="Stop timing after this many "
                                                                               "seconds (the rest: skipped).")]
CpuTimingOpt = Annotated[bool, typer.Option("--cpu-timing", help="On CPU, also time the small cases (labelled: "
                                                                 "not performance figures).")]
SkipOpt = Annotated[bool, typer.Option("--skip-correctness", help="Time only.")]
MemcheckOpt = Annotated[bool, typer.Option("--memcheck", help="Run the correctness phase under memcheck (interpreted "
                                                              "kernels' accesses bounds-checked; docs/memcheck.md).")]
StoreOpt = Annotated[str, output_option("--store", help="Results store (SQLite file).")]
NoStoreOpt = Annotated[bool, typer.Option("--no-store", help="Keep nothing (the report reads a temporary store).")]
ReportOpt = Annotated[str, output_option("--report", help="Where to write the HTML dashboard.")]
NoReportOpt = Annotated[bool, typer.Option("--no-report", help="Do not write the dashboard.")]
DocOpt = Annotated[list[str] | None, typer.Option("--doc", help="A JSON document to tabulate in the report "
                                                                "(wavefront inspect/traffic --json; repeatable).")]
TargetsOpt = Annotated[str, typer.Option("--inspect-targets", help="On CPU, compile the kernels for these targets "
                                                                   "for the report (comma-separated; 'none' skips).")]
TrafficOpt = Annotated[bool, typer.Option("--traffic/--no-traffic", help="On CPU, count each kernel's bytes "
                                                                         "(instrumented interpreter) for the report.")]
LabelOpt = Annotated[str, typer.Option(help="A label stored with the run.")]

ProfileOpt = Annotated[Profiler | None, typer.Option(help="Instead of measuring, run the chosen cases once under "
                                                          "this profiler (on PATH; a GPU) and read its output back.")]
ProfileDirOpt = Annotated[str | None, typer.Option("--profile-dir", help="Default: profiles/<tool> by the store.")]


def _profile(request, json_out) -> None:
    with request_errors():
        profile_job.check_can_profile(request.tool, request.device)
        try:
            result = profile_job.run_profile(request)
        except RuntimeError as exc:
            fail(str(exc), 1)
    if json_out != "-":
        console.print(f"{request.tool}: {len(result.files)} file(s) in {escape(request.out_dir)}", highlight=False)
        for line in result.next_steps:
            console.print(f"next: {escape(line)}", highlight=False)
    if json_out:
        write_json(result.as_dict(), json_out)


def _failures_table(failures):
    def fmt(c, attr):
        return f"{getattr(c, attr):.2e}" if c is not None else "-"

    rows = []
    for r in failures:
        fwd, bwd = r.worst("fwd"), r.worst("bwd")
        rows.append([f"{r.op}/{r.case}/{r.dtype}", fmt(fwd, "err_ours"), fmt(fwd, "bound"), fmt(bwd, "err_ours"),
                     fmt(bwd, "bound"), escape(r.error) if r.error else "error above bound"])
    return table("correctness failures", ["case", "fwd err", "fwd bound", "bwd err", "bwd bound", "why"], rows,
                 numeric=["fwd err", "fwd bound", "bwd err", "bwd bound"], droppable=["fwd bound", "bwd bound"])


def _timing_summary(measurements, on_gpu: bool) -> None:
    ok = [m for m in measurements if m.ok]
    bad = [m for m in measurements if not m.ok]
    console.print(f"timing: {len(ok)} measured, {len(bad)} not ({', '.join(sorted({m.status for m in bad})) or '-'})"
                  + ("" if on_gpu else f"; {CPU_LABEL}"), highlight=False)
    errors = [m for m in bad if m.status == "error"]
    if errors:
        console.print(table("timing errors", ["item", "why"],
                            [[f"{m.op}/{m.case}/{m.mode}/{m.provider}", escape(m.reason)] for m in errors]))


def summary_lines(result) -> list[str]:
    """The end of a run: what it found, one line per section, then where the details are."""
    p, rt = result.plan, result.runtime
    lines = []
    if result.results:
        n = len(result.results)
        lines.append(f"correctness: {n - len(result.failures)}/{n} correct against the float64 reference, forward "
                     f"and backward ({rt['backend']}, {rt['arch']})")
    for name, text in result.findings.items():
        lines.append(f"{name}: {text}")
    bounds = [pt.bound for pt in p.modeled]
    lines.append(f"roofline (modeled on {p.gpu.name}): {len(bounds)} points, {bounds.count('memory')} memory-bound, "
                 f"{bounds.count('compute')} compute-bound")
    return lines


def _summary(result) -> None:
    p = result.plan
    if result.failures:
        console.print(_failures_table(result.failures))
    for line in summary_lines(result):
        console.print(line, highlight=False)  # wrapped at word boundaries, never mid-word
    if result.run.measurements:
        _timing_summary(result.run.measurements, p.device == "cuda")
    for name, why in result.skipped.items():
        err_console.print(f"[yellow]{name} skipped:[/] {escape(why)}", highlight=False)
    if p.device == "cpu":
        note("CPU interpreter: wall times are correctness runs, not performance figures.")
    where = [f"dashboard {result.report}"] if result.report else []
    where.append(f"run {result.run_id} in {result.store}" if result.store else "nothing stored (--no-store)")
    if result.documents:
        where.append("documents " + ", ".join(result.documents.values()))
    console.print("details: " + "; ".join(where), highlight=False)


def bench(op: OpsOption = None, mode: ModeOpt = None, provider: ProviderOpt = None, dtype: DTypeOpt = None,
          case: CaseOpt = None, device: DeviceOpt = None, device_model: ModelOpt = None, full: FullOpt = False,
          slow: SlowOpt = False, reps: RepsOpt = 30, warmup: WarmupOpt = 5, budget_s: BudgetOpt = None,
          cpu_timing: CpuTimingOpt = False, skip_correctness: SkipOpt = False,
          store: StoreOpt = "wavefront-results.sqlite", no_store: NoStoreOpt = False,
          report: ReportOpt = "artifacts/wavefront-report.html", no_report: NoReportOpt = False, doc: DocOpt = None,
          inspect_targets: TargetsOpt = "sm_90,gfx942", traffic: TrafficOpt = True, label: LabelOpt = "",
          memcheck: MemcheckOpt = False, profile: ProfileOpt = None, profile_dir: ProfileDirOpt = None,
          json_out: JsonOut = None) -> None:
    """The main job: every registered op against its float64 reference (forward and backward), the
    modeled roofline on a target device, on a GPU timings of wavefront vs eager vs torch.compile vs
    Liger-Kernel, and on a CPU the machine code and bytes moved; results go to the store and the
    dashboard. Says up front what will run; prints failures and a summary. Exits 1 if a case fails.
    With --profile, the chosen cases run under a vendor profiler instead (nothing measured or stored)."""
    if profile is not None:
        chosen = profile_job.selection(op or (), values(mode), values(provider), values(dtype), case or ())
        out_dir = profile_dir or str(Path(store).parent / "profiles" / profile.value)
        _profile(profile_job.ProfileRequest(profile.value, out_dir, chosen, device.value if device else "cuda"),
                 json_out)
        return

    show = json_out != "-"
    with request_errors():
        request = job.BenchRequest(
            op=tuple(op or ()), mode=values(mode), provider=values(provider), dtype=values(dtype),
            case=tuple(case or ()), device=device.value if device else None, device_model=device_model, full=full,
            slow=slow, reps=reps, warmup=warmup, budget_s=budget_s, cpu_timing=cpu_timing,
            skip_correctness=skip_correctness, store=None if no_store else store, report=None if no_report else report,
            doc=tuple(doc or ()), inspect_targets=split_targets(inspect_targets, "inspect_targets"), traffic=traffic,
            label=label, memcheck=memcheck)
        bench_plan = job.plan(request)
        if show:
            for line in bench_plan.describe():
                err_console.print(line, highlight=False)  # wrapped at word boundaries, never mid-word
        try:
            with Bars(show) as bars:
                result = job.run(request, bars.phase, bench_plan)
        except KeyboardInterrupt:
            fail("interrupted: the run stays marked incomplete in the store (the gate refuses it)", 130)
    if show:
        _summary(result)
    if json_out:
        write_json(result.as_dict(), json_out)
    if result.exit_code:
        raise typer.Exit(result.exit_code)


def register(app: typer.Typer) -> None:
    command(app, "bench")(bench)
