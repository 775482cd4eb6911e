"""`wavefront inspect`, `wavefront traffic`, `wavefront roofline`: machine code, bytes and roofs without a GPU.
The jobs are wavefront.workbench.jobs.inspect, .traffic and .roofline; this module declares options and
renders tables that never cut a number (text columns wrap, always-empty columns are hidden)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from wavefront.cli._common import (
    ALL_TARGETS,
    Bars,
    DType,
    JsonOut,
    OpsOption,
    TargetsOption,
    command,
    note,
    request_errors,
    table,
    write_json,
)
from wavefront.cli._output import console
from wavefront.cli._tables import configs_table, inspect_table
from wavefront.workbench.jobs import inspect as inspect_job
from wavefront.workbench.jobs import roofline as roofline_job
from wavefront.workbench.jobs import traffic as traffic_job
from wavefront.workbench.jobs.ops import split_targets
from wavefront.workbench.static.inspect import LEGEND


def inspect_cmd(op: OpsOption = None, targets: TargetsOption = ALL_TARGETS,
                dtype: Annotated[DType, typer.Option(help="Input dtype of the bench cases.")] = DType.bf16,
                asm: Annotated[Path | None, typer.Option("--asm", help="Also write each kernel's PTX/SASS or AMDGCN "
                                                                       "here.")] = None,
                workers: Annotated[int | None, typer.Option(min=1, help="Compile worker processes (default: CPU "
                                                                        "count, <= 8).")] = None,
                all_rows: Annotated[bool, typer.Option("--all", help="One terminal row per case (default: one per "
                                                                     "kernel x target, its worst case).")] = False,
                configs: Annotated[bool, typer.Option("--configs", help="Instead of compiling: list the distinct "
                                                      "launch configurations the targets choose at the bench shapes, "
                                                      "each with the small problem that runs it on the interpreter "
                                                      "(docs/gpu-configs.md).")] = False,
                json_out: JsonOut = None) -> None:
    """Compile every registered op's kernels at its bench shapes for GPU targets (no GPU needed) and report
    registers, spills, shared memory/LDS, occupancy, the widest global load/store, matrix instructions and
    the design (TMA, setmaxnreg, wgmma wait depth)."""
    show = json_out != "-"
    if configs:
        with request_errors():
            found = inspect_job.gpu_configs(inspect_job.ConfigsRequest(
                ops=tuple(op or ()), targets=split_targets(targets), dtype=dtype.value))
        if show:
            console.print(configs_table(found))
            runnable, chosen = found.coverage
            note("run them: python -m pytest -n 0 tests/kernels/test_gpu_configs.py -m 'slow or not slow'")
            console.print(f"{runnable} of {chosen} configurations have a small problem; not run: "
                          f"{len(found.excluded)} variant(s) without an interpreter", soft_wrap=True)
        if json_out:
            write_json(found.as_dict(), json_out)
        return
    with request_errors(), Bars(show) as bars:
        req = inspect_job.InspectRequest(ops=tuple(op or ()), targets=split_targets(targets), dtype=dtype.value,
                                  asm_dir=str(asm) if asm else None, workers=workers)
        report = inspect_job.inspect(req, bars.phase("compile"))
    if show:
        console.print(inspect_table(report, all_rows))
        console.print(f"[dim]{LEGEND}[/]", highlight=False)
        for r in report.failed:
            console.print(f"[red]failed to compile:[/] {escape(r.key)}: {escape(str(r.error))}", highlight=False)
        n_spill = sum(r.spills for r in report.rows)
        console.print(f"{len(report.rows)} kernel x target x case rows, {len(report.failed)} failed to compile, "
                      f"{n_spill} with spills", highlight=False)
    if json_out:
        write_json(report.as_dict(), json_out)
    if report.failed:
        raise typer.Exit(1)


def _ratio(x: float | None) -> str:
    return "-" if x is None or x != x else f"{x:.2f}"


def traffic_table(report):
    """Bytes the op moves (kernels + host work) against its minimum and eager; raw counts in --json."""
    rows = []
    for r in report.rows:
        dims = "x".join(str(v) for v in r.dims.values())
        if r.error:
            rows.append([f"{r.op} {r.mode} {r.case}", dims, "-", "-", "-", "-", "-", f"[red]{escape(r.error)}[/]"])
            continue
        per_row = _ratio(r.marginal_ratio)
        if r.marginal_ratio is not None and r.marginal_ratio > 1.005:
            per_row = f"[yellow]{per_row}[/]"
        rows.append([f"{r.op} {r.mode} {r.case}", dims, f"{r.bytes_moved:,}", f"{r.min_bytes:,}", _ratio(r.ratio_min),
                     per_row, _ratio(r.ratio_eager), ""])
    return table(f"bytes moved ({report.dtype}; counted by the Triton interpreter)",
                 ["op mode case", "dims", "ours B", "min B", "ours/min", "per row", "eager/ours", "error"], rows,
                 numeric=["dims", "ours B", "min B", "ours/min", "per row", "eager/ours"],
                 droppable=["dims", "eager/ours"])


def traffic_cmd(op: OpsOption = None,
                dtype: Annotated[DType, typer.Option(help="Input dtype.")] = DType.bf16,
                marginal: Annotated[bool, typer.Option(help="Also run taller cases for the per-row ratio.")] = True,
                json_out: JsonOut = None) -> None:
    """Count the bytes each op's kernels load and store (instrumented Triton interpreter) at small versions
    of its bench cases; compare with the op's minimum and with eager PyTorch."""
    show = json_out != "-"
    with request_errors(), Bars(show) as bars:
        request = traffic_job.TrafficRequest(ops=tuple(op or ()), dtype=dtype.value, marginal=marginal)
        report = traffic_job.traffic(request, bars.phase("traffic"))
    if show:
        console.print(traffic_table(report))
        note("ours: kernel + host bytes; ours/min: over the minimum at this case; per row: extra bytes per extra row "
             "over the minimum's. CPU interpreter: wall times are not performance figures.")
    if json_out:
        write_json(report.as_dict(), json_out)
    if any(r.error for r in report.rows):
        raise typer.Exit(1)


def _opt(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def roofline_table(report):
    """One line per op x mode x case; columns without a value in any row (no traffic, no measurement) hidden."""
    g = report.device
    rows = [[f"{p.op} {p.mode} {p.case}", f"{p.intensity:.2f}", p.compute_roof, p.bound, f"{p.min_bytes / 1e6:.1f}",
             f"{p.attainable_us:.1f}", _opt(p.kernel_attainable_us, ".1f"), _opt(p.measured_us, ".1f"),
             "-" if p.pct_of_roof is None else f"{p.pct_of_roof:.0f}%"] for p in report.points]
    return table(f"roofline on {g.name} ({report.dtype}, modeled)",
                 ["op mode case", "FLOP/B", "roof", "bound", "min MB", "roof us", "kernel us", "measured us",
                  "% of roof"], rows,
                 numeric=["FLOP/B", "min MB", "roof us", "kernel us", "measured us", "% of roof"],
                 droppable=["roof", "min MB"])


def roofline_cmd(
    device: Annotated[str, typer.Option(help="A device-table name: a100, h100, h200, b200, mi300x, mi325x, "
                                              "mi250x, w7900.")] = "h100",
    op: OpsOption = None,
    dtype: Annotated[DType, typer.Option(help="Input dtype.")] = DType.bf16,
    traffic: Annotated[Path | None, typer.Option(help="A `wavefront traffic --json` document: adds the roof "
                                                      "for the bytes the kernels really move.")] = None,
    inspect_json: Annotated[Path | None, typer.Option("--inspect", help="A `wavefront inspect --json` document: "
                                                      "which ops use matrix units (else read from Triton's IR).")]
        = None,
    measured: Annotated[Path | None, typer.Option(help="Measured times (JSON records with op, case, mode, "
                                                       "dtype, device, dur_us) from real GPU runs.")] = None,
    store: Annotated[Path | None, typer.Option(help="A results store: take the measured times of its run "
                                                    "--run (a GPU run of `wavefront bench`).")] = None,
    run: Annotated[str, typer.Option(help="The stored run to read with --store.")] = "latest",
    json_out: JsonOut = None,
) -> None:
    """Arithmetic intensity, attainable time on a device of the table and, given measured times, the
    achieved percentage of the roof, for every bench case of every registered op."""
    req = roofline_job.RooflineRequest(device=device, ops=tuple(op or ()), dtype=dtype.value,
                               traffic=str(traffic) if traffic else None,
                               inspect=str(inspect_json) if inspect_json else None,
                               measured=str(measured) if measured else None, store=str(store) if store else None,
                               run=run)
    with request_errors():
        report = roofline_job.roofline(req)
    if json_out != "-":
        console.print(roofline_table(report))
        g = report.device
        note(f"Modeled from the device table's dense peaks ({g.hbm_tbps} TB/s, vector FP32 {g.fp32_tflops} TFLOPS, "
             f"{report.dtype} matrix {g.bf16_tflops} TFLOPS): not a measurement. roof us: attainable time.")
    if json_out:
        write_json(report.as_dict(), json_out)


def register(app: typer.Typer) -> None:
    command(app, "inspect")(inspect_cmd)
    command(app, "traffic")(traffic_cmd)
    command(app, "roofline")(roofline_cmd)
