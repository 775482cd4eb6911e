"""`wavefront comm` and `wavefront overlap`: options, rendering and exit codes over the jobs in
wavefront.workbench.distributed.comm / .overlap. Both run on every rank: under torchrun (`torchrun
--nproc_per_node=2 -m wavefront comm`) or on N local ranks started here with `--nproc N`; rank 0 prints and
writes the files."""

from __future__ import annotations

import os
from enum import Enum
from typing import Annotated

import typer
from rich.table import Table

from wavefront.cli._common import Bars, JsonOut, command, output_option, write_json
from wavefront.cli._output import console, fail
from wavefront.workbench.distributed.comm import COLLECTIVES, CPU_NOTE, CommRequest
from wavefront.workbench.distributed.launch import LaunchError, spawn, under_launcher
from wavefront.workbench.distributed.overlap import OverlapRequest
from wavefront.workbench.jobs import comm as job

Collective = Enum("Collective", {k: k for k in ("all_reduce", "all_gather", "reduce_scatter", "broadcast",
                                                "all_to_all", "send_recv")}, type=str)
Mode = Enum("Mode", {k: k for k in ("in-place", "out-of-place", "both")}, type=str)
CommDType = Enum("CommDType", {k: k for k in ("fp32", "bf16", "fp16", "fp8")}, type=str)
Backend = Enum("Backend", {k: k for k in ("auto", "nccl", "gloo")}, type=str)


def _start(rank_main, request, json_out: str | None, nproc: int | None, verb: str) -> None:
    """Validate, then run `rank_main((request, json_out))` here (under a launcher) or on `nproc` ranks."""
    try:
        request.validate(int(os.environ["WORLD_SIZE"]) if under_launcher() else nproc)
        if under_launcher():
            rank_main((request, json_out))
            return
        if not nproc:
            fail(f"not started by a launcher: run under torchrun (torchrun --nproc_per_node=2 -m wavefront {verb} "
                 "...) or pass --nproc N")
        spawn(rank_main, (request, json_out), nproc)
    except ValueError as exc:
        fail(str(exc))
    except LaunchError as exc:
        fail(str(exc), exc.exit_code)


def _comm_rank(args) -> None:
    request, json_out = args
    with Bars(json_out != "-") as bars:
        result = job.comm(request, bars.phase("comm"))
    if result is None:
        return
    if json_out:
        write_json(result.as_dict(), json_out)
    if json_out != "-":
        _render_comm(result)
    if result.report.failures:
        raise SystemExit(1)


def _render_comm(result) -> None:
    info, report = result.runtime, result.report
    table = Table(title=f"collectives on {info['backend']} ({info['device']}, {info['world_size']} ranks)")
    for col in ("collective", "mode", "n", "S bytes", "time us", "algbw GB/s", "busbw GB/s", "check"):
        table.add_column(col, justify="left" if col in ("collective", "mode", "check") else "right")
    for r in report.results:
        table.add_row(r.collective, r.mode, str(r.group_size), str(r.size_bytes), f"{r.time_us:.1f}",
                      f"{r.algbw_gbps:.3f}", f"{r.busbw_gbps:.3f}", "[green]ok[/]" if r.correct else "[red]WRONG[/]")
    console.print(table)
    fits = Table(title="alpha-beta fit: t = alpha + factor(n) * S / busbw")
    for col in ("collective", "n", "alpha us", "busbw GB/s", "points", "max rel err"):
        fits.add_column(col, justify="left" if col == "collective" else "right")
    for f in report.fits:
        fits.add_row(f.collective, str(f.group_size), f"{f.alpha_us:.1f}", f"{f.busbw_gbps:.3f}", str(f.n_points),
                     f"{f.max_rel_error:.0%}")
    console.print(fits)
    for name, why in report.unsupported.items():
        console.print(f"[yellow]unsupported[/] {name}: {why}")
    for note in result.notes:
        console.print(f"[dim]{note}[/]")
    if report.failures:
        console.print(f"[red]{len(report.failures)} case(s) returned wrong results:[/] {', '.join(report.failures)}")


def comm(
    op: Annotated[list[Collective] | None, typer.Option("--op", help="Collective (repeatable; default: all).")] = None,
    min_bytes: Annotated[int, typer.Option(min=1, help="Smallest message S in bytes (nccl-tests S).")] = 8,
    max_bytes: Annotated[int | None, typer.Option(min=1, help="Largest S in bytes (default 1 GiB on GPU, 4 MiB on "
                                                              "CPU; capped at a quarter of free memory).")] = None,
    mode: Annotated[Mode, typer.Option(help="Buffer placement.")] = Mode.both,
    dtype: Annotated[CommDType, typer.Option(help="Element type (fp8: e4m3).")] = CommDType.fp32,
    group_size: Annotated[list[int] | None, typer.Option("--group-size", min=1, help="Ranks per group (repeatable; "
                                                         "default: the powers of two up to the world size).")] = None,
    warmup: Annotated[int, typer.Option(min=0, help="Untimed operations per case.")] = 3,
    iters: Annotated[int, typer.Option(min=1, help="Operations per timed block.")] = 10,
    repeats: Annotated[int, typer.Option(min=1, help="Timed blocks per case (median reported).")] = 3,
    backend: Annotated[Backend, typer.Option(help="auto: nccl with GPUs, else gloo.")] = Backend.auto,
    calibration: Annotated[str | None, output_option("--calibration", help="Where to store the alpha-beta fit "
                                                     "for `wavefront plan --calibration` ('' to skip).")]
    = "comm-calibration.json",
    nproc: Annotated[int | None, typer.Option(min=1, help="Start N local ranks here instead of torchrun.")] = None,
    json_out: JsonOut = None,
) -> None:
    """Benchmark collectives (time, algbw, busbw with nccl-tests conventions), check every result, fit
    t = alpha + factor*S/busbw per collective and group size, and store the fit for the planner."""
    request = CommRequest(
        ops=tuple(o.value for o in op) if op else COLLECTIVES, min_bytes=min_bytes, max_bytes=max_bytes,
        mode=mode.value, dtype=dtype.value, group_sizes=tuple(group_size) if group_size else None, warmup=warmup,
        iters=iters, repeats=repeats, backend=backend.value, calibration=calibration or None)
    _start(_comm_rank, request, json_out, nproc, "comm")


def _overlap_rank(args) -> None:
    request, json_out = args
    result = job.overlap(request)
    if result is None:
        return
    if json_out:
        write_json(result.as_dict(), json_out)
    if json_out != "-":
        _render_overlap(result)


def _render_overlap(result) -> None:
    info, fit, proxy = result.runtime, result.all_reduce_fit, result.proxy
    t = Table(title=f"overlap probe: all_reduce vs matmuls ({info['backend']}, {info['world_size']} ranks)")
    for col in ("S bytes", "compute ms", "comm ms", "both ms", "exposed ms", "overlap eff"):
        t.add_column(col, justify="right")
    for p in result.probes:
        t.add_row(str(p.size_bytes), f"{p.compute_ms:.2f}", f"{p.comm_ms:.2f}", f"{p.both_ms:.2f}",
                  f"{p.exposed_comm_ms:.2f}", f"{p.overlap_efficiency:.0%}")
    console.print(t)
    b = Table(title=f"DDP bucket cap on a {result.model} proxy ({proxy['proxy_params']:,} params, "
                    f"{proxy['n_tensors']} tensors, dims / {proxy['shrink']}, {proxy['n_layers']} layers)")
    for col in ("bucket MiB", "buckets", "step ms", "no_sync ms", "backward ms", "exposed ms", "predicted ms"):
        b.add_column(col, justify="right")
    for r in result.buckets:
        pred = f"{r.predicted_exposed_ms:.2f}" if r.predicted_exposed_ms is not None else "-"
        b.add_row(f"{r.bucket_cap_mib:g}", str(r.n_buckets), f"{r.step_ms:.2f}", f"{r.no_sync_ms:.2f}",
                  f"{r.backward_ms:.2f}", f"{r.exposed_ms:.2f}", pred)
    console.print(b)
    if fit is not None:
        console.print(f"prediction uses the all_reduce fit of this run: alpha {fit.alpha_us:.1f} us, "
                      f"busbw {fit.busbw_gbps:.3f} GB/s")
    if info.get("cpu_note"):
        console.print(f"[dim]{CPU_NOTE}[/]")


def overlap(
    size_bytes: Annotated[list[int] | None, typer.Option("--size-bytes", min=1, help="All-reduce sizes for the "
                                                         "probe (repeatable; default 64 KiB and 1 MiB).")] = None,
    matmul_n: Annotated[int, typer.Option(min=1, help="Matrix size of the compute loop.")] = 256,
    matmul_iters: Annotated[int, typer.Option(min=1, help="Matmuls per compute loop.")] = 20,
    model: Annotated[str, typer.Option(help="Preset whose gradient sizes the DDP proxy copies.")] = "llama3-8b",
    bucket_mib: Annotated[list[float] | None, typer.Option("--bucket-mib", help="DDP bucket caps in MiB (torch's "
                                                           "bucket_cap_mb; repeatable; default 0.25 1 4 25).")] = None,
    shrink: Annotated[int, typer.Option(min=1, help="Divide every matrix dimension of the preset by this.")] = 16,
    layers: Annotated[int, typer.Option(min=1, help="Proxy layers.")] = 4,
    tokens: Annotated[int, typer.Option(min=1, help="Tokens per proxy step.")] = 64,
    steps: Annotated[int, typer.Option(min=1, help="Timed rounds (medians reported).")] = 7,
    backend: Annotated[Backend, typer.Option(help="auto: nccl with GPUs, else gloo.")] = Backend.auto,
    nproc: Annotated[int | None, typer.Option(min=1, help="Start N local ranks here instead of torchrun.")] = None,
    json_out: JsonOut = None,
) -> None:
    """Measure exposed communication and overlap efficiency of a collective running beside compute, and
    the effect of DDP's bucket cap on exposed gradient all-reduce, measured and predicted."""
    defaults = OverlapRequest()
    request = OverlapRequest(
        size_bytes=tuple(size_bytes or defaults.size_bytes), matmul_n=matmul_n, matmul_iters=matmul_iters, model=model,
        bucket_mib=tuple(bucket_mib or defaults.bucket_mib), shrink=shrink, layers=layers, tokens=tokens, steps=steps,
        backend=backend.value)
    _start(_overlap_rank, request, json_out, nproc, "overlap")


def register(app: typer.Typer) -> None:
    command(app, "comm")(comm)
    command(app, "overlap")(overlap)
