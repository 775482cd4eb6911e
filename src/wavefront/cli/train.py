"""`wavefront train`: train a Hugging Face model with and without wavefront kernels and report KPIs.

    torchrun --nproc_per_node=2 -m wavefront train --compare --parallel fsdp2
    wavefront train --nproc-per-node 2 --compare          # the same, launching torchrun itself
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Annotated

import typer
from rich.markup import escape

from wavefront.cli._output import console, err_console, fail, write_json

SCHEMA = "wavefront.train/1"


def _fmt(value, spec: str = ".3g", none: str = "n/a") -> str:
    return none if value is None else format(value, spec)


def kpi_table(result):
    from rich.table import Table

    variants = [v for v in result.variants if v.summary]
    table = Table(title=f"wavefront train {result.run_id}: {result.config['model']}, {result.provenance['parallel']} "
                        f"x{result.provenance['world_size']}, {result.provenance['device_name']}")
    table.add_column("KPI")
    for v in variants:
        table.add_column(v.variant, justify="right")
    if result.comparison:
        table.add_column("wavefront / baseline", justify="right")
    c = result.comparison or {}
    rows = [
        ("tokens/s (total)", "tokens_per_s", ".4g", c.get("tokens_per_s_ratio")),
        ("tokens/s per device", "tokens_per_s_per_device", ".4g", None),
        ("step time mean (s)", "step_s_mean", ".4g", c.get("step_s_ratio")),
        ("  forward (s)", "fwd_s", ".3g", None),
        ("  backward (s)", "bwd_s", ".3g", None),
        ("  exposed comm (s)", "comm_s", ".3g", None),
        ("  optimizer (s)", "opt_s", ".3g", None),
        ("MFU", "mfu", ".3e", None),
        ("HFU", "hfu", ".3e", None),
        ("peak memory (MB)", "peak_mem_bytes", None, c.get("peak_mem_ratio")),
        ("$/step", "cost_per_step", ".3g", None),
        ("$/Mtok", "cost_per_mtok", ".3g", None),
        ("energy/step (J)", "energy_per_step_j", ".3g", None),
        ("final loss", "final_loss", ".5f", None),
    ]
    for label, key, spec, ratio in rows:
        cells = []
        for v in variants:
            val = getattr(v.summary, key)
            cells.append(_fmt(val / 1e6, ".1f") if key == "peak_mem_bytes" else _fmt(val, spec))
        if result.comparison:
            cells.append(_fmt(ratio, ".3f", ""))
        table.add_row(label, *cells)
    return table


def _print_notes(result) -> None:
    s = next((v.summary for v in result.variants if v.summary), None)
    if s is None:
        return
    console.print(f"[dim]peak: {s.peak.source}[/]")
    console.print(f"[dim]memory: {s.peak_mem_kind}; price: {s.price_source}; energy: {s.energy_kind}[/]")
    for note in s.notes:
        console.print(f"[dim]{note}[/]")
    for v in result.variants:
        if v.patch_report:
            counts = ", ".join(f"{k} x{n}" for k, n in v.patch_report["counts"].items()) or "nothing"
            console.print(f"[dim]patched: {counts}[/]")
            for u in v.patch_report["unmatched"]:
                console.print(f"[dim]  not patched: {u['op']}: {u['reason']}[/]")
        for path in v.trace_paths:
            console.print(f"[dim]trace: {path}[/]")
        if v.resumed_from_step is not None:
            console.print(f"[dim]{v.variant}: resumed after step {v.resumed_from_step}[/]")
    if result.comparison and result.comparison.get("max_abs_loss_diff") is not None:
        console.print(f"[dim]loss curves: max |wavefront - baseline| = "
                      f"{result.comparison['max_abs_loss_diff']:.3g}[/]")
    if result.store:
        console.print(f"[dim]KPIs stored in {result.store} (tables train_runs, train_steps), run {result.run_id}[/]")


def _launch(nproc: int) -> None:
    """Re-run this command under torchrun with `nproc` processes; relay its output, minus torchrun's own
    tracebacks (the workers already printed one clear line each)."""
    argv = sys.argv[1:]
    clean: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg == "--nproc-per-node":
            skip = True
            continue
        if arg.startswith("--nproc-per-node="):
            continue
        clean.append(arg)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           "-m", "wavefront", *clean]
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)
    in_agent_report = False
    for line in proc.stderr:
        if line.startswith("Traceback") or "ChildFailedError" in line:
            in_agent_report = True
        if not in_agent_report and "distributed/elastic" not in line and "distributed.elastic" not in line:
            sys.stderr.write(line)
    code = proc.wait()
    if code:
        fail(f"training failed (torchrun exit code {code}); the rank messages above say why", code)


def train(
    model: Annotated[str, typer.Option(help="Preset (tiny-llama, llama3.2-1b, ...) or a local directory with "
                                            "config.json.")] = "tiny-llama",
    data: Annotated[str, typer.Option(help="'synthetic', or a local .txt / .npy / .bin token file.")] = "synthetic",
    token_dtype: Annotated[str, typer.Option(help="Token width of a .bin file: uint16 or uint32.")] = "uint16",
    seq_len: Annotated[int, typer.Option(help="Tokens per sequence.")] = 32,
    global_batch: Annotated[int, typer.Option(help="Sequences per optimizer step over all ranks.")] = 8,
    micro_batch: Annotated[int, typer.Option(help="Sequences per forward/backward per rank.")] = 2,
    steps: Annotated[int, typer.Option(help="Optimizer steps.")] = 10,
    warmup_steps: Annotated[int, typer.Option(help="First steps left out of the summary KPIs.")] = 1,
    lr: Annotated[float, typer.Option(help="AdamW learning rate.")] = 1e-3,
    seed: Annotated[int, typer.Option(help="Seed of the weights and the synthetic corpus.")] = 0,
    parallel: Annotated[str, typer.Option(help="auto, single, ddp or fsdp2.")] = "auto",
    activation_checkpointing: Annotated[bool, typer.Option("--activation-checkpointing",
                                                           help="Recompute each layer in backward.")] = False,
    dtype: Annotated[str, typer.Option(help="auto (bf16 autocast on GPU, fp32 on CPU), fp32 or bf16.")] = "auto",
    attn_implementation: Annotated[str, typer.Option(help="sdpa or eager (models without sdpa use eager).")] = "sdpa",
    compare: Annotated[bool, typer.Option("--compare", help="Run unpatched, then wavefront-patched, back to "
                                                           "back on the same data.")] = False,
    no_patch: Annotated[bool, typer.Option("--no-patch", help="Train the unpatched model only.")] = False,
    patch_ops: Annotated[str | None, typer.Option(help="Comma-separated ops to patch (default: wavefront.patch "
                                                       "defaults), e.g. rms_norm,rope.")] = None,
    strict_patch: Annotated[bool, typer.Option("--strict-patch", help="Fail when a requested op cannot be "
                                                                      "patched.")] = False,
    checkpoint_dir: Annotated[str | None, typer.Option(help="Directory for DCP checkpoints.")] = None,
    checkpoint_every: Annotated[int, typer.Option(help="Save every N steps (and at the end).")] = 0,
    resume: Annotated[bool, typer.Option("--resume", help="Continue from the newest checkpoint.")] = False,
    profile_steps: Annotated[str | None, typer.Option(help="Trace steps with torch.profiler: STEP or "
                                                           "FIRST-LAST.")] = None,
    out: Annotated[str, typer.Option(help="Directory for traces.")] = "runs/train",
    store: Annotated[str, typer.Option(help="Results store for the KPIs ('' to skip).")] = "wavefront-results.sqlite",
    gpu: Annotated[str | None, typer.Option(help="Device-table key (h100, mi300x, ...) overriding "
                                                 "detection.")] = None,
    peak_tflops: Annotated[float | None, typer.Option(help="Dense peak TFLOP/s per device for MFU.")] = None,
    price_per_hour: Annotated[float | None, typer.Option(help="$ per device-hour.")] = None,
    timeout: Annotated[float, typer.Option(help="Collective timeout in seconds.")] = 300.0,
    nproc_per_node: Annotated[int | None, typer.Option(help="Launch torchrun with this many processes.")] = None,
    inject_failure: Annotated[str | None, typer.Option(help="Testing aid: RANK:STEP raises on that rank.")] = None,
    inject_nan: Annotated[int | None, typer.Option(help="Testing aid: make the loss NaN at this step.")] = None,
    json_out: Annotated[str | None, typer.Option("--json", help="Write the result document ('-': stdout).")] = None,
) -> None:
    """Train with torch.distributed (single, DDP, FSDP2) and report tokens/s, MFU/HFU, memory, step-time
    split, $/step and energy/step; --compare runs baseline and wavefront-patched back to back."""
    from wavefront.workbench.distributed.train.config import (
        ConfigError,
        TrainConfig,
        parse_rank_step,
        parse_step_range,
    )

    if nproc_per_node is not None:
        if nproc_per_node < 1:
            fail(f"--nproc-per-node must be >= 1, got {nproc_per_node}")
        if "WORLD_SIZE" in os.environ:
            fail("--nproc-per-node launches torchrun itself; drop it when already running under torchrun")
        _launch(nproc_per_node)
        return
    if compare and no_patch:
        fail("--compare and --no-patch exclude each other")
    try:
        options = {}
        if patch_ops is not None:
            from wavefront.patching.report import OPS

            wanted = {o.strip() for o in patch_ops.split(",") if o.strip()}
            options = {op: op in wanted for op in OPS}
            unknown = wanted - set(OPS)
            if unknown:
                raise ConfigError(f"--patch-ops: unknown op(s) {', '.join(sorted(unknown))}; ops: {', '.join(OPS)}")
        cfg = TrainConfig(
            model=model, data=data, token_dtype=token_dtype, seq_len=seq_len, global_batch=global_batch,
            micro_batch=micro_batch, steps=steps, warmup_steps=warmup_steps, lr=lr, seed=seed, parallel=parallel,
            activation_checkpointing=activation_checkpointing, dtype=dtype, attn_implementation=attn_implementation,
            variants=("baseline", "wavefront") if compare else (("baseline",) if no_patch else ("wavefront",)),
            patch_options=options, strict_patch=strict_patch, checkpoint_dir=checkpoint_dir,
            checkpoint_every=checkpoint_every, resume=resume,
            profile_steps=parse_step_range(profile_steps) if profile_steps else None, out_dir=out,
            store=store or None, gpu=gpu, peak_tflops=peak_tflops, price_per_hour=price_per_hour, timeout_s=timeout,
            inject_failure=parse_rank_step(inject_failure) if inject_failure else None, inject_nan=inject_nan)
        from wavefront.workbench.distributed.train.harness import world_size_from_env

        cfg.validate(world_size_from_env())
    except ConfigError as e:
        if int(os.environ.get("RANK", "0")) == 0:
            fail(escape(str(e)))
        raise typer.Exit(2) from None
    _run(cfg, json_out)


def _run(cfg, json_out: str | None) -> None:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from wavefront.workbench.distributed.train import harness

    rank = int(os.environ.get("RANK", "0"))
    progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TextColumn("{task.fields[info]}"), TimeElapsedColumn(), console=err_console,
                        disable=rank != 0, transient=False)
    tasks: dict[str, int] = {}

    def on_step(variant, rec, total) -> None:
        if variant not in tasks:
            tasks[variant] = progress.add_task(variant, total=total, info="")
        progress.update(tasks[variant], completed=rec.step + 1,
                        info=f"loss {rec.loss:.4f}  {rec.tokens_per_s:,.0f} tok/s")

    try:
        with progress:
            result = harness.run(cfg, on_step=on_step)
    except harness.TrainFailure as e:
        err_console.print(f"[bold red]error:[/] {escape(str(e))}", soft_wrap=True)
        sys.stdout.flush()
        sys.stderr.flush()
        harness.shutdown(failed=True)
        # A failed peer may have left collectives pending; exit without waiting on the process group.
        os._exit(e.exit_code)
    if rank == 0:
        if json_out != "-":
            console.print(kpi_table(result))
            _print_notes(result)
        if json_out:
            write_json({"schema": SCHEMA, **result.as_dict()}, json_out)
    harness.shutdown(failed=False)


def register(app: typer.Typer) -> None:
    app.command("train")(train)
