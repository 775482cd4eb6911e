"""`wavefront inspect`, `wavefront traffic`, `wavefront roofline`: machine code, bytes and roofs without a GPU."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from wavefront.cli._output import console, err_console, fail, write_json

_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def wide_console():
    """The shared console on a terminal; a 200-column one when piped (CI logs), so tables never truncate."""
    from rich.console import Console

    return console if console.is_terminal else Console(width=200)


def parse_dtype(name: str):
    import torch

    if name not in _DTYPES:
        fail(f"--dtype must be one of {', '.join(_DTYPES)}; got {name!r}")
    return getattr(torch, _DTYPES[name])


def check_ops(ops: list[str] | None) -> None:
    from wavefront.ops import REGISTRY

    for name in ops or []:
        if name not in REGISTRY:
            fail(f"--op: unknown op {name!r}; registered ops: {', '.join(sorted(REGISTRY))}")


def parse_targets(text: str) -> list[str]:
    from wavefront import runtime

    targets = [t.strip() for t in text.split(",") if t.strip()]
    if not targets:
        fail("--targets: give at least one target")
    for t in targets:
        if t not in runtime.ARCHS or runtime.ARCHS[t].family == "cpu":
            fail(f"--targets: unknown target {t!r}; choose from {', '.join(runtime.DEFAULT_TARGETS)}")
    return targets


def use_interpreter() -> None:
    """Traffic is counted under the interpreter, also on a GPU machine: turn it on before any kernel module
    is imported (kernel modules load lazily, on an op's first call)."""
    import os

    from wavefront import runtime

    if not runtime.interpreting():
        os.environ["TRITON_INTERPRET"] = "1"


def _progress(label: str, enabled: bool):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn(f"[bold]{label}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TextColumn("{task.description}"), console=err_console, disable=not enabled, transient=True)


def run_inspect(ops, targets, dtype, show_progress: bool, asm_dir=None, workers=None):
    from wavefront.workbench.static.inspect import inspect_ops

    with _progress("compile", show_progress) as progress:
        task = progress.add_task("", total=None)

        def on_progress(done: int, total: int, what: str) -> None:
            progress.update(task, completed=done, total=total, description=what)

        return inspect_ops(ops, targets, dtype, workers=workers, asm_dir=asm_dir, on_progress=on_progress)


def run_traffic(ops, dtype, show_progress: bool, marginal: bool = True):
    from wavefront.workbench.static.traffic import traffic_ops

    with _progress("traffic", show_progress) as progress:
        task = progress.add_task("", total=None)

        def on_progress(done: int, total: int, what: str) -> None:
            progress.update(task, completed=done, total=total, description=what)

        return traffic_ops(ops, dtype, marginal=marginal, on_progress=on_progress)


def _bits(b: int | None) -> str:
    return str(b) if b else "-"


_LIMITER = {"registers": "regs", "shared": "smem", "warps": "max", "blocks": "blocks", "none": "",
            "does-not-fit": "no fit"}


def inspect_table(report):
    """One section per op/mode/case/kernel, one line per target."""
    from rich.table import Table

    table = Table(title=f"compiled kernels at bench shapes ({report.dtype}); occupancy: warps/SM on NVIDIA, "
                        "waves/SIMD on AMD", title_justify="left")
    for col in ("target", "warps", "regs", "spill B", "smem B", "occupancy", "ld", "st", "matrix"):
        table.add_column(col, justify="left" if col in ("target", "matrix") else "right", no_wrap=True)
    group = None
    for r in report.rows:
        if (r.op, r.mode, r.case, r.kernel) != group:
            group = (r.op, r.mode, r.case, r.kernel)
            table.add_section()
            table.add_row(f"[bold]{r.op} {r.mode}[/] {r.case} [dim]{r.kernel}[/]", *[""] * 8, end_section=False)
        if not r.ok:
            table.add_row(f"  {r.target}", f"[red]FAILED: {r.error}[/]", *[""] * 7)
            continue
        regs = str(r.regs) if r.sgprs is None else f"{r.regs}v {r.sgprs}s" + (f" {r.agprs}a" if r.agprs else "")
        spill = f"[red]{r.spill_bytes}[/]" if r.spills else "0"
        ld = _bits(r.widest_load_bits) if r.widest_load_bits >= 128 else f"[yellow]{_bits(r.widest_load_bits)}[/]"
        st = _bits(r.widest_store_bits) if r.widest_store_bits >= 128 else f"[yellow]{_bits(r.widest_store_bits)}[/]"
        occ = f"{r.occupancy:.0%} {r.active:g} {_LIMITER.get(r.occupancy_limiter, r.occupancy_limiter)}"
        table.add_row(f"  {r.target}", str(r.num_warps), regs, spill, str(r.shared_bytes), occ, ld, st,
                      ",".join(r.matrix_families) or "-")
    return table


def inspect_cmd(
    op: Annotated[list[str] | None, typer.Option("--op", help="Only this op (repeatable).")] = None,
    targets: Annotated[str, typer.Option(help="Comma-separated compile targets.")] =
        "sm_80,sm_90,sm_100,gfx90a,gfx942,gfx1100",
    dtype: Annotated[str, typer.Option(help="Input dtype of the bench cases: fp32, bf16 or fp16.")] = "bf16",
    asm: Annotated[Path | None, typer.Option("--asm", help="Also write each kernel's PTX/SASS or AMDGCN here.")]
        = None,
    workers: Annotated[int | None, typer.Option(help="Compile worker processes (default: CPU count, <= 8).")]
        = None,
    json_out: Annotated[str | None, typer.Option("--json", help="Write the result document ('-': stdout).")] = None,
) -> None:
    """Compile every registered op's kernels at its bench shapes for GPU targets (no GPU needed) and report
    registers, spills, shared memory/LDS, occupancy, the widest global load/store and matrix instructions."""
    check_ops(op)
    target_list = parse_targets(targets)
    if workers is not None and workers < 1:
        fail(f"--workers must be >= 1, got {workers}")
    report = run_inspect(op, target_list, parse_dtype(dtype), show_progress=json_out != "-", asm_dir=asm,
                         workers=workers)
    if json_out != "-":
        wide_console().print(inspect_table(report))
        n_spill = sum(r.spills for r in report.rows)
        console.print(f"{len(report.rows)} kernel x target rows, {len(report.failed)} failed to compile, "
                      f"{n_spill} with spills")
    if json_out:
        write_json(report.as_dict(), json_out)
    if report.failed:
        raise typer.Exit(1)


def _fmt_ratio(x: float | None) -> str:
    if x is None or x != x:
        return "-"
    return f"{x:.2f}"


def traffic_table(report):
    from rich.table import Table

    table = Table(title=f"bytes moved ({report.dtype}; counted by the Triton interpreter)")
    for col in ("op", "mode", "case", "rows x cols", "kernel B", "unique B", "host B", "min B", "ours/min",
                "per row", "eager B", "eager/ours"):
        table.add_column(col, justify="left" if col in ("op", "mode", "case") else "right")
    for r in report.rows:
        dims = "x".join(str(v) for v in r.dims.values())
        if r.error:
            table.add_row(r.op, r.mode, r.case, dims, f"[red]{r.error}[/]", *[""] * 7)
            continue
        ratio = _fmt_ratio(r.ratio_min)
        per_row = _fmt_ratio(r.marginal_ratio)
        if r.marginal_ratio is not None and r.marginal_ratio > 1.005:
            per_row = f"[yellow]{per_row}[/]"
        table.add_row(r.op, r.mode, r.case, dims, f"{r.kernel_bytes:,}", f"{r.unique_bytes:,}", f"{r.host_bytes:,}",
                      f"{r.min_bytes:,}", ratio, per_row, f"{r.eager_bytes:,}", _fmt_ratio(r.ratio_eager))
    return table


def traffic_cmd(
    op: Annotated[list[str] | None, typer.Option("--op", help="Only this op (repeatable).")] = None,
    dtype: Annotated[str, typer.Option(help="fp32, bf16 or fp16.")] = "bf16",
    marginal: Annotated[bool, typer.Option(help="Also run taller cases for the per-row (marginal) ratio.")] = True,
    json_out: Annotated[str | None, typer.Option("--json", help="Write the result document ('-': stdout).")] = None,
) -> None:
    """Count the bytes each op's kernels load and store (instrumented Triton interpreter) at small versions
    of its bench cases; compare with the op's minimum and with eager PyTorch."""
    check_ops(op)
    use_interpreter()
    report = run_traffic(op, parse_dtype(dtype), show_progress=json_out != "-", marginal=marginal)
    if json_out != "-":
        wide_console().print(traffic_table(report))
        console.print("[dim]ours/min: (kernel + host bytes) / minimum at this case; per row: extra bytes per extra "
                      "row over the minimum's. CPU interpreter: wall times are not performance figures.[/]")
    if json_out:
        write_json(report.as_dict(), json_out)
    if any(r.error for r in report.rows):
        raise typer.Exit(1)


def roofline_table(report):
    from rich.table import Table

    g = report.device
    table = Table(title=f"roofline on {g.name}: {g.hbm_tbps} TB/s, vector FP32 {g.fp32_tflops} TFLOPS, "
                        f"{report.dtype} matrix {g.bf16_tflops} TFLOPS (dense, modeled)")
    for col in ("op", "mode", "case", "FLOP/B", "roof", "bound", "min MB", "attainable us", "kernel us",
                "measured us", "% of roof"):
        table.add_column(col, justify="left" if col in ("op", "mode", "case", "roof", "bound") else "right")
    for p in report.points:
        table.add_row(p.op, p.mode, p.case, f"{p.intensity:.2f}", p.compute_roof, p.bound, f"{p.min_bytes / 1e6:.1f}",
                      f"{p.attainable_us:.1f}",
                      f"{p.kernel_attainable_us:.1f}" if p.kernel_attainable_us is not None else "-",
                      f"{p.measured_us:.1f}" if p.measured_us is not None else "-",
                      f"{p.pct_of_roof:.0f}%" if p.pct_of_roof is not None else "-")
    return table


def roofline_cmd(
    device: Annotated[str, typer.Option(help="A device-table name: a100, h100, h200, b200, mi300x, mi325x, "
                                              "mi250x, w7900.")] = "h100",
    op: Annotated[list[str] | None, typer.Option("--op", help="Only this op (repeatable).")] = None,
    dtype: Annotated[str, typer.Option(help="fp32, bf16 or fp16.")] = "bf16",
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
    json_out: Annotated[str | None, typer.Option("--json", help="Write the result document ('-': stdout).")] = None,
) -> None:
    """Arithmetic intensity, attainable time on a device of the table and, given measured times, the
    achieved percentage of the roof, for every bench case of every registered op."""
    from wavefront.workbench.hardware import get_gpu
    from wavefront.workbench.static import roofline as rl

    check_ops(op)
    try:
        gpu = get_gpu(device)
    except ValueError as exc:
        fail(f"--device: {exc}")
    docs = {}
    for name, path in (("traffic", traffic), ("inspect", inspect_json)):
        if path is not None:
            try:
                docs[name] = json.loads(Path(path).read_text())
            except (OSError, ValueError) as exc:
                fail(f"--{name}: cannot read {path}: {exc}")
    try:
        times = rl.load_measured(measured) if measured else None
    except (OSError, ValueError) as exc:
        fail(f"--measured: {exc}")
    if store is not None:
        from wavefront.workbench.bench.store import StoreError

        try:
            times = {**(times or {}), **rl.measured_from_store(store, run)}
        except (StoreError, ValueError) as exc:
            fail(f"--store: {exc}")
    matrix = (rl.matrix_ops_from_inspect(docs["inspect"]) if "inspect" in docs
              else rl.detect_matrix_ops(op, target=gpu.arch))
    report = rl.roofline(gpu, op, parse_dtype(dtype), matrix_ops=matrix, traffic=docs.get("traffic"), measured=times)
    if json_out != "-":
        wide_console().print(roofline_table(report))
        console.print("[dim]Modeled from the device table's dense peaks: not a measurement.[/]")
    if json_out:
        write_json(report.as_dict(), json_out)


def register(app: typer.Typer) -> None:
    app.command("inspect")(inspect_cmd)
    app.command("traffic")(traffic_cmd)
    app.command("roofline")(roofline_cmd)
