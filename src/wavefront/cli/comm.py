"""`wavefront comm` (collective benchmark + calibration) and `wavefront overlap` (overlap probe, DDP buckets).

Both run on every rank of a torch.distributed job: under torchrun (`torchrun --nproc_per_node=2 -m
wavefront comm`), or started here with `--nproc N` (local processes, gloo on CPU / nccl on GPUs).
Rank 0 prints and writes the files.
"""

from __future__ import annotations

import datetime as _dt
import os
import socket
from typing import Annotated

import typer

from wavefront.cli._output import console, err_console, fail, write_json

SCHEMA = "wavefront.comm/1"
OVERLAP_SCHEMA = "wavefront.overlap/1"
CPU_NOTE = "CPU gloo: timings check the method on this machine; not a GPU or network performance figure."


def _under_launcher() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _init(backend: str):
    """Initialise the default process group from the environment; returns the device."""
    import torch
    import torch.distributed as dist

    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    local = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:
        # Each rank gets an equal share of the cores instead of every rank spinning up all of them.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", 1))))
    dist.init_process_group(backend, device_id=device if device.type == "cuda" else None)
    return device


def _spawned(local_rank: int, world: int, port: int, fn_name: str, args: dict) -> None:
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(local_rank),
                       "LOCAL_RANK": str(local_rank), "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world)})
    globals()[fn_name](args)


def _launch(fn_name: str, args: dict, nproc: int | None) -> None:
    if _under_launcher():
        globals()[fn_name](args)
        return
    if not nproc:
        fail("not started by a launcher: run under torchrun (torchrun --nproc_per_node=2 -m wavefront "
             f"{args['verb']} ...) or pass --nproc N")
    if nproc < 1:
        fail(f"--nproc must be >= 1, got {nproc}")
    import torch.multiprocessing as mp

    try:
        mp.spawn(_spawned, args=(nproc, _free_port(), fn_name, args), nprocs=nproc, join=True)
    except mp.ProcessRaisedException as exc:
        last = [line for line in str(exc).strip().splitlines() if line.strip()][-1]
        fail(f"a rank failed: {last}")
    except mp.ProcessExitedException as exc:
        if exc.exit_code not in (0, None):
            raise typer.Exit(exc.exit_code) from None


def _memory_cap_bytes(device, world: int) -> int:
    """Largest S worth trying: a quarter of the free memory per rank (the buffers need about 2 x S)."""
    import torch

    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free // 4)
    try:
        avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        avail = 1 << 30
    return int(avail // (4 * max(1, world)))


def _comm_worker(args: dict) -> None:
    import torch.distributed as dist

    from wavefront.workbench.distributed import comm as bench
    from wavefront.workbench.planner.comm_model import Calibration, save_calibration

    device = _init(args["backend"])
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        max_bytes = args["max_bytes"] or (1 << 30 if device.type == "cuda" else 4 << 20)
        cap = _memory_cap_bytes(device, world)
        if max_bytes > cap and rank == 0:
            err_console.print(f"[yellow]--max-bytes {max_bytes} exceeds a quarter of free memory; using {cap}[/]")
        sizes = bench.sizes_pow2(args["min_bytes"], min(max_bytes, cap))
        pow2 = {g for g in (2 ** k for k in range(1, world.bit_length())) if world % g == 0}
        groups = args["group_sizes"] or sorted(pow2 | {world})
        groups = [g for g in groups if g >= 2]
        if not groups:
            raise ValueError("collectives need at least 2 ranks (world size is 1)")
        for g in groups:
            if world % g:
                raise ValueError(f"--group-size {g} does not divide the world size {world}")
        modes = ("in-place", "out-of-place") if args["mode"] == "both" else (args["mode"],)
        per_op = sum(len([m for m in bench.MODES[c] if m in modes] or [1]) for c in args["ops"])
        n_cases = per_op * len(groups) * len(sizes)
        progress = None
        if rank == 0 and args["json"] != "-":
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            bar = Progress(TextColumn("[bold]comm"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                           TextColumn("{task.description}"), console=err_console, transient=True)
            task = bar.add_task("", total=n_cases)
            bar.start()

            def progress(desc: str) -> None:
                bar.update(task, description=desc, advance=1)
        try:
            report = bench.run_benchmark(args["ops"], sizes, group_sizes=groups, modes=modes, dtype=args["dtype"],
                                         warmup=args["warmup"], iters=args["iters"], repeats=args["repeats"],
                                         device=device, progress=progress)
        finally:
            if progress is not None:
                bar.stop()
        info = bench.runtime_info(device)
        if rank == 0:
            _report_comm(args, info, report, sizes, groups)
            if args["calibration"]:
                note = CPU_NOTE if device.type == "cpu" else ""
                cal = Calibration(info["backend"], info["device"], world, info["domain"],
                                  _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                                  info["torch_version"], report.fits, report.unsupported, note)
                save_calibration(cal, args["calibration"])
                if args["json"] != "-":
                    console.print(f"calibration ({info['domain']}-node, {len(report.fits)} fits) -> "
                                  f"{args['calibration']}")
        failed = bool(report.failures)
    finally:
        dist.destroy_process_group()
    if failed:
        raise SystemExit(1)


def _report_comm(args, info, report, sizes, groups) -> None:
    from rich.table import Table

    doc = {"schema": SCHEMA, "runtime": info,
           "config": {"ops": list(args["ops"]), "sizes_bytes": sizes, "group_sizes": groups, "mode": args["mode"],
                      "dtype": args["dtype"], "warmup": args["warmup"], "iters": args["iters"],
                      "repeats": args["repeats"]},
           **report.as_dict(), "calibration": args["calibration"]}
    if args["json"]:
        write_json(doc, args["json"])
    if args["json"] == "-":
        return
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
    if info.get("cpu_note"):
        console.print(f"[dim]{CPU_NOTE}[/]")
    if report.failures:
        console.print(f"[red]{len(report.failures)} case(s) returned wrong results:[/] {', '.join(report.failures)}")


def comm(
    op: Annotated[list[str] | None, typer.Option(
        "--op", help="Collective (repeatable): all_reduce, all_gather, reduce_scatter, broadcast, all_to_all, "
                     "send_recv. Default: all.")] = None,
    min_bytes: Annotated[int, typer.Option(help="Smallest message S in bytes (nccl-tests S).")] = 8,
    max_bytes: Annotated[int | None, typer.Option(help="Largest S in bytes (default 1 GiB on GPU, 4 MiB on CPU; "
                                                  "capped at a quarter of free memory).")] = None,
    mode: Annotated[str, typer.Option(help="in-place, out-of-place or both.")] = "both",
    dtype: Annotated[str, typer.Option(help="fp32, bf16, fp16 or fp8 (e4m3).")] = "fp32",
    group_size: Annotated[list[int] | None, typer.Option("--group-size", help="Ranks per group (repeatable; "
                                                          "default: the powers of two up to the world size).")] = None,
    warmup: Annotated[int, typer.Option(help="Untimed operations per case.")] = 3,
    iters: Annotated[int, typer.Option(help="Operations per timed block.")] = 10,
    repeats: Annotated[int, typer.Option(help="Timed blocks per case (median reported).")] = 3,
    backend: Annotated[str, typer.Option(help="auto (nccl with GPUs, else gloo), nccl or gloo.")] = "auto",
    calibration: Annotated[str | None, typer.Option(
        help="Where to store the alpha-beta calibration for `wavefront plan --calibration` ('' to skip).")
    ] = "comm-calibration.json",
    nproc: Annotated[int | None, typer.Option(help="Start N local ranks here instead of under torchrun.")] = None,
    json_out: Annotated[str | None, typer.Option("--json", help="Write the result document ('-': stdout).")] = None,
) -> None:
    """Benchmark collectives (time, algbw, busbw with nccl-tests conventions), check every result, fit
    t = alpha + factor*S/busbw per collective and group size, and store the fit for the planner."""
    from wavefront.workbench.distributed.comm import DTYPES
    from wavefront.workbench.planner.comm_model import COLLECTIVES

    ops = op or list(COLLECTIVES)
    for name in ops:
        if name not in COLLECTIVES:
            fail(f"--op: unknown collective {name!r}; known: {', '.join(COLLECTIVES)}")
    if mode not in ("in-place", "out-of-place", "both"):
        fail(f"--mode must be in-place, out-of-place or both; got {mode!r}")
    if dtype not in DTYPES:
        fail(f"--dtype must be one of {', '.join(DTYPES)}; got {dtype!r}")
    if backend not in ("auto", "nccl", "gloo"):
        fail(f"--backend must be auto, nccl or gloo; got {backend!r}")
    if min_bytes < 1 or (max_bytes is not None and max_bytes < min_bytes):
        fail(f"need 1 <= --min-bytes <= --max-bytes, got {min_bytes}, {max_bytes}")
    if warmup < 0 or iters < 1 or repeats < 1:
        fail("--warmup must be >= 0, --iters and --repeats >= 1")
    args = {"verb": "comm", "ops": ops, "min_bytes": min_bytes, "max_bytes": max_bytes, "mode": mode, "dtype": dtype,
            "group_sizes": group_size, "warmup": warmup, "iters": iters, "repeats": repeats, "backend": backend,
            "calibration": calibration or None, "json": json_out}
    try:
        _launch("_comm_worker", args, nproc)
    except ValueError as exc:
        fail(str(exc))


def _overlap_worker(args: dict) -> None:
    import torch.distributed as dist

    from wavefront.shapes import get_model
    from wavefront.workbench.distributed import comm as bench
    from wavefront.workbench.distributed.overlap import ddp_bucket_sweep, probe_overlap

    device = _init(args["backend"])
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        fit_report = bench.run_benchmark(["all_reduce"], bench.sizes_pow2(4096, 4 << 20), group_sizes=[world],
                                         modes=("in-place",), iters=5, repeats=3, device=device)
        fit = fit_report.fits[0] if fit_report.fits else None
        probes = [probe_overlap(s, matmul_n=args["matmul_n"], matmul_iters=args["matmul_iters"], device=device)
                  for s in args["sizes"]]
        dims = get_model(args["model"])
        buckets, proxy = ddp_bucket_sweep(dims, args["bucket_mb"], shrink=args["shrink"], n_layers=args["layers"],
                                          tokens=args["tokens"], steps=args["steps"], all_reduce=fit, device=device)
        if rank == 0:
            info = bench.runtime_info(device)
            doc = {"schema": OVERLAP_SCHEMA, "runtime": info, "all_reduce_fit": fit.as_dict() if fit else None,
                   "probes": [p.as_dict() for p in probes], "ddp": {"model": dims.name, "proxy": proxy,
                                                                    "buckets": [b.as_dict() for b in buckets]}}
            if args["json"]:
                write_json(doc, args["json"])
            if args["json"] != "-":
                _print_overlap(info, fit, probes, dims.name, proxy, buckets)
    finally:
        dist.destroy_process_group()


def _print_overlap(info, fit, probes, model_name, proxy, buckets) -> None:
    from rich.table import Table

    t = Table(title=f"overlap probe: all_reduce vs matmuls ({info['backend']}, {info['world_size']} ranks)")
    for col in ("S bytes", "compute ms", "comm ms", "both ms", "exposed ms", "overlap eff"):
        t.add_column(col, justify="right")
    for p in probes:
        t.add_row(str(p.size_bytes), f"{p.compute_ms:.2f}", f"{p.comm_ms:.2f}", f"{p.both_ms:.2f}",
                  f"{p.exposed_comm_ms:.2f}", f"{p.overlap_efficiency:.0%}")
    console.print(t)
    b = Table(title=f"DDP bucket_cap_mb on a {model_name} proxy ({proxy['proxy_params']:,} params, "
                    f"{proxy['n_tensors']} tensors, dims / {proxy['shrink']}, {proxy['n_layers']} layers)")
    for col in ("bucket MB", "buckets", "step ms", "no_sync ms", "backward ms", "exposed ms", "predicted ms"):
        b.add_column(col, justify="right")
    for r in buckets:
        pred = f"{r.predicted_exposed_ms:.2f}" if r.predicted_exposed_ms is not None else "-"
        b.add_row(f"{r.bucket_cap_mb:g}", str(r.n_buckets), f"{r.step_ms:.2f}", f"{r.no_sync_ms:.2f}",
                  f"{r.backward_ms:.2f}", f"{r.exposed_ms:.2f}", pred)
    console.print(b)
    if fit is not None:
        console.print(f"prediction uses the all_reduce fit of this run: alpha {fit.alpha_us:.1f} us, "
                      f"busbw {fit.busbw_gbps:.3f} GB/s")
    if info.get("cpu_note"):
        console.print(f"[dim]{CPU_NOTE}[/]")


def overlap(
    size_bytes: Annotated[list[int] | None, typer.Option("--size-bytes", help="All-reduce sizes for the probe "
                                                         "(repeatable; default 64 KiB and 1 MiB).")] = None,
    matmul_n: Annotated[int, typer.Option(help="Matrix size of the compute loop.")] = 256,
    matmul_iters: Annotated[int, typer.Option(help="Matmuls per compute loop.")] = 20,
    model: Annotated[str, typer.Option(help="Preset whose gradient sizes the DDP proxy copies.")] = "llama3-8b",
    bucket_mb: Annotated[list[float] | None, typer.Option("--bucket-mb", help="bucket_cap_mb values (repeatable; "
                                                          "default 0.25, 1, 4, 25).")] = None,
    shrink: Annotated[int, typer.Option(help="Divide every matrix dimension of the preset by this.")] = 16,
    layers: Annotated[int, typer.Option(help="Proxy layers.")] = 4,
    tokens: Annotated[int, typer.Option(help="Tokens per proxy step.")] = 64,
    steps: Annotated[int, typer.Option(help="Timed rounds (medians reported).")] = 7,
    backend: Annotated[str, typer.Option(help="auto, nccl or gloo.")] = "auto",
    nproc: Annotated[int | None, typer.Option(help="Start N local ranks here instead of under torchrun.")] = None,
    json_out: Annotated[str | None, typer.Option("--json", help="Write the result document ('-': stdout).")] = None,
) -> None:
    """Measure exposed communication and overlap efficiency of a collective running beside compute, and
    the effect of DDP's bucket_cap_mb on exposed gradient all-reduce, measured and predicted."""
    from wavefront.shapes import get_model

    try:
        get_model(model)
    except ValueError as exc:
        fail(f"--model: {exc}")
    if backend not in ("auto", "nccl", "gloo"):
        fail(f"--backend must be auto, nccl or gloo; got {backend!r}")
    if min([matmul_n, matmul_iters, shrink, layers, tokens, steps]) < 1:
        fail("--matmul-n, --matmul-iters, --shrink, --layers, --tokens and --steps must be >= 1")
    caps = bucket_mb or [0.25, 1.0, 4.0, 25.0]
    if min(caps) <= 0:
        fail("--bucket-mb values must be > 0")
    args = {"verb": "overlap", "sizes": size_bytes or [64 << 10, 1 << 20], "matmul_n": matmul_n,
            "matmul_iters": matmul_iters, "model": model, "bucket_mb": caps, "shrink": shrink, "layers": layers,
            "tokens": tokens, "steps": steps, "backend": backend, "json": json_out}
    try:
        _launch("_overlap_worker", args, nproc)
    except ValueError as exc:
        fail(str(exc))


def register(app: typer.Typer) -> None:
    app.command("comm")(comm)
    app.command("overlap")(overlap)
