"""`wavefront train` (options, rendering, exit codes) over wavefront.workbench.distributed.train.harness."""

from __future__ import annotations

import os
import sys
from dataclasses import fields
from enum import Enum
from typing import Annotated

import typer
from rich import progress as rp
from rich.markup import escape
from rich.table import Table

from wavefront.cli._common import JsonOut, command, console, err_console, fail, output_option, write_json
from wavefront.workbench.distributed import launch
from wavefront.workbench.distributed.train import config, readout
from wavefront.workbench.distributed.train.overlap import HELP, kpi_rows
from wavefront.workbench.distributed.train.readout import TIMING_RATIOS, loss_agreement, notes, on_cpu

Parallel, DType, Attn, TokenDType, Fp8, PPSchedule = (Enum(n, {k: k for k in values}, type=str) for n, values in (
    ("Parallel", ("auto", "single", "ddp", "fsdp2", "mesh")), ("DType", ("auto", "fp32", "bf16")),
    ("Attn", ("sdpa", "eager")), ("TokenDType", ("uint16", "uint32")), ("Fp8", ("rowwise", "tensorwise", "blockwise",
    "mxfp8")), ("PPSchedule", ("1f1b", "gpipe", "interleaved-1f1b", "interleaved-zb", "zbv"))))
Store = Annotated[str, output_option("--store", help="Results store for the KPIs ('' to skip).")]


def _deg(text: str, low: int = 1, typ: type = int, panel: str | None = "Device mesh"):
    return Annotated[typ, typer.Option(min=low if typ is int else None, help=text, rich_help_panel=panel)]

#: (label, Summary field, format, comparison key) per table row; peak memory is shown in MB.
ROWS = (("tokens/s (total)", "tokens_per_s", ".4g", "tokens_per_s_ratio"), ("tokens/s per device",
        "tokens_per_s_per_device", ".4g", None), ("step time mean (s)", "step_s_mean", ".4g", "step_s_ratio"),
        ("  forward (s)", "fwd_s", ".3g", None), ("  backward (s)", "bwd_s", ".3g", None),
        ("  exposed comm (s)", "comm_s", ".3g", None), ("  optimizer (s)", "opt_s", ".3g", None),
        ("MFU", "mfu", ".3e", None), ("MFU (fp8 mixed peaks)", "mfu_fp8", ".3e", None), ("HFU", "hfu", ".3e", None),
        ("peak memory (MB)", "peak_mem_bytes", ".1f", "peak_mem_ratio"), ("$/step", "cost_per_step", ".3g", None),
        ("$/Mtok", "cost_per_mtok", ".3g", None), ("energy/step (J)", "energy_per_step_j", ".3g", None),
        ("final loss", "final_loss", ".5f", None),
        ("  token accuracy (fused loss)", "final_token_accuracy", ".4f", None),
        ("  z-loss term (fused loss)", "final_z_loss", ".3g", None),
        ("MoE imbalance (max/mean)", "moe_imbalance", ".3f", None))


def _fmt(value, spec: str, none: str = "n/a", scale: float = 1.0) -> str:
    return none if value is None else format(value * scale, spec)


def kpi_table(result):
    measured = [v for v in result.variants if v.summary]
    ref = measured[0].variant if measured else ""
    cpu = on_cpu(result.provenance)
    table = Table(title=f"wavefront train {result.run_id}: {result.config['model']}, {result.provenance['parallel']} "
                        f"x{result.provenance['world_size']}, {result.provenance['device_name']}"
                        + (" (CPU: times are correctness runs, not performance)" if cpu else ""))
    table.add_column("KPI")
    for name in [v.variant for v in measured] + [f"{n} / {ref}" for n in result.comparisons]:
        table.add_column(name, justify="right")
    for label, key, spec, ratio in ROWS:
        cells = [_fmt(getattr(v.summary, key), spec, scale=1e-6 if key == "peak_mem_bytes" else 1) for v in measured]
        cells += ["not perf" if cpu and ratio in TIMING_RATIOS else _fmt(c.get(ratio) if ratio else None, ".3f", "")
                  for c in result.comparisons.values()]
        table.add_row(label, *cells)
    if result.comparisons:
        table.add_row("max |loss difference|", *[""] * len(measured),
                      *[_fmt(c.get("max_abs_loss_diff"), ".3g", "") for c in result.comparisons.values()])
    for label, cells in kpi_rows([v.summary for v in measured]):  # per mesh dimension, from --profile-steps
        table.add_row(label, *cells, *[""] * len(result.comparisons))
    return table


def train(
    variants: Annotated[str | None, typer.Argument(help="With --compare: comma-separated variants among "
                                                        "baseline|eager, compile, liger, wavefront.")] = None,
    model: _deg("Preset (tiny-llama, ...) or a directory with config.json.", typ=str, panel=None) = "tiny-llama",
    data: Annotated[str, typer.Option(help="'synthetic', or a local .txt / .npy / .bin token file.")] = "synthetic",
    token_dtype: Annotated[TokenDType, typer.Option(help="Token width of a .bin file.")] = TokenDType.uint16,
    global_batch: Annotated[int, typer.Option(min=1, help="Sequences per optimizer step over all ranks.")] = 8,
    micro_batch: Annotated[int, typer.Option(min=1, help="Sequences per forward/backward per rank.")] = 2,
    seq_len: _deg("Tokens per sequence.", panel=None) = 32, steps: _deg("Optimizer steps.", panel=None) = 10,
    warmup_steps: Annotated[int, typer.Option(min=0, help="First steps left out of the summary KPIs.")] = 1,
    lr: Annotated[float, typer.Option(help="AdamW learning rate (> 0).")] = 1e-3,
    seed: Annotated[int, typer.Option(help="Seed of the weights and the synthetic corpus.")] = 0,
    parallel: Annotated[Parallel, typer.Option(help="auto: single, ddp, or mesh given mesh options.")] = Parallel.auto,
    tp: _deg("Tensor (+ sequence) parallel degree.") = 1, pp: _deg("Pipeline-parallel degree.") = 1,
    cp: _deg("Context-parallel degree.") = 1, dp_shard: _deg("FSDP2 shard degree (0: the ranks left over).", 0) = 0,
    dp_replicate: _deg("HSDP replicas of the shard group.") = 1, vpp: _deg("Pipeline stages per rank.") = 1,
    pp_schedule: Annotated[PPSchedule, typer.Option(help="Pipeline schedule.", rich_help_panel="Device mesh")] = "1f1b",
    plan: Annotated[str | None, typer.Option(help="The mesh of a `wavefront plan --json` file ('-': stdin).")] = None,
    plan_rank: _deg("Which plan of --plan (0: the best).", 0) = 0, fsdp_prefetch: _deg(HELP["fsdp_prefetch"], 0) = 0,
    reshard_after_forward: _deg(HELP["reshard_after_forward"], typ=str) = "true",
    async_tp: _deg(HELP["async_tp"], typ=bool) = False, ep: _deg("Expert-parallel degree (MoE models).") = 1,
    recompute: _deg("Recompute: none, full, op (save matmul outputs), every-other.", typ=str, panel=None) = "none",
    activation_checkpointing: _deg("The same as --recompute full.", typ=bool, panel=None) = False,
    dtype: Annotated[DType, typer.Option(help="auto: bf16 autocast on GPU, fp32 on CPU.")] = DType.auto,
    attn_implementation: Annotated[Attn, typer.Option(help="Hugging Face attention implementation.")] = Attn.sdpa,
    fp8: Annotated[Fp8 | None, typer.Option(help="FP8 recipe of the wavefront variant (needs bf16).")] = None,
    fp8_all_gather: _deg("FSDP2 all-gathers the FP8 layers' weights in FP8 (half bf16's bytes).", typ=bool) = False,
    compare: Annotated[bool, typer.Option("--compare", help="Run variants back to back (baseline,wavefront).")] = False,
    no_patch: Annotated[bool, typer.Option("--no-patch", help="Train the unpatched model only.")] = False,
    patch_ops: Annotated[str | None, typer.Option(help="Comma-separated ops to patch, e.g. rms_norm,rope.")] = None,
    strict_patch: Annotated[bool, typer.Option("--strict-patch", help="Fail if an op cannot be patched.")] = False,
    checkpoint_dir: Annotated[str | None, typer.Option(help="Directory for DCP checkpoints.")] = None,
    checkpoint_every: Annotated[int, typer.Option(min=0, help="Save every N steps (and at the end).")] = 0,
    resume: Annotated[bool, typer.Option("--resume", help="Continue from the newest intact checkpoint.")] = False,
    profile_steps: Annotated[str | None, typer.Option(help="Trace steps: STEP or FIRST-LAST.")] = None,
    out: Annotated[str, typer.Option(help="Directory for traces.")] = "runs/train",
    store: Store = "wavefront-results.sqlite",
    gpu: Annotated[str | None, typer.Option(help="Device-table key (h100, mi300x, ...) overriding detection.")] = None,
    peak_tflops: Annotated[float | None, typer.Option(help="Dense peak TFLOP/s per device for MFU.")] = None,
    price_per_hour: Annotated[float | None, typer.Option(help="$ per device-hour.")] = None,
    timeout: Annotated[float, typer.Option(help="Collective timeout in seconds.")] = 300.0,
    nproc_per_node: Annotated[int | None, typer.Option(min=1, help="Launch torchrun with N processes.")] = None,
    inject_failure: Annotated[str | None, typer.Option(help="Testing aid: RANK:STEP raises on that rank.")] = None,
    inject_nan: Annotated[int | None, typer.Option(help="Testing aid: make the loss NaN at this step.")] = None,
    json_out: JsonOut = None,
) -> None:
    """Train (single, DDP, FSDP2 or a TP/PP/FSDP2 mesh) and report tokens/s, MFU, memory, step split, $, energy."""
    if int(os.environ.get("RANK", "0")) == 0 and (why := config.json_dest_problem(json_out)):
        fail(escape(why))
    plan = launch.save_stdin(out, "plan.json") if plan == "-" else plan  # the ranks read the file, not stdin
    argv = launch.replace_option(sys.argv[1:], "--plan", plan) if plan else sys.argv[1:]
    if nproc_per_node is None:
        return _run(_config(dict(locals())), json_out)
    if "WORLD_SIZE" in os.environ:
        fail("--nproc-per-node launches torchrun itself; drop it when already running under torchrun")
    code = launch.relaunch_under_torchrun(argv, nproc_per_node, "--nproc-per-node")
    if code:
        fail(f"training failed (torchrun exit code {code}); the rank messages above say why", code)


def _config(o: dict):
    """The typed request from the options, validated for this launch; exit 2 with one line if bad."""
    o = {k: v.value if isinstance(v, Enum) else v for k, v in o.items()}
    try:
        if o["compare"] and o["no_patch"]:
            raise config.ConfigError("--compare and --no-patch exclude each other")
        if o["variants"] is not None and not o["compare"]:
            raise config.ConfigError(f"unexpected argument {o['variants']!r}: variants are given with --compare")
        same = {f.name: o[f.name] for f in fields(config.TrainConfig) if f.name in o and f.name not in (
            "variants", "patch_options", "profile_steps", "inject_failure", "store")}
        cfg = config.TrainConfig(**same,
            variants=config.parse_variants(o["variants"]) if o["compare"] else (
                ("baseline",) if o["no_patch"] else ("wavefront",)),
            patch_options=config.parse_patch_ops(o["patch_ops"]) if o["patch_ops"] is not None else {},
            profile_steps=config.parse_step_range(o["profile_steps"]) if o["profile_steps"] else None,
            inject_failure=config.parse_rank_step(o["inject_failure"]) if o["inject_failure"] else None,
            out_dir=o["out"], store=o["store"] or None, timeout_s=o["timeout"])
        cfg = config.apply_plan(cfg)
        cfg.validate(int(os.environ.get("WORLD_SIZE", "1")))
    except config.ConfigError as e:
        if int(os.environ.get("RANK", "0")) == 0:
            fail(escape(str(e)))
        raise typer.Exit(2) from None
    return cfg


def _run(cfg, json_out: str | None) -> None:
    # The options, the request and the torchrun relaunch need no torch (test_train_imports.py); the ranks do.
    from wavefront.workbench.distributed.train import harness  # lazy: torch-free import

    rank, order = int(os.environ.get("RANK", "0")), tuple(harness.run_order(cfg.variants))
    progress = rp.Progress(rp.TextColumn("[bold]{task.description}"), rp.BarColumn(), rp.MofNCompleteColumn(),
                           rp.TextColumn("{task.fields[info]}"), rp.TimeElapsedColumn(), rp.TextColumn("eta"),
                           rp.TimeRemainingColumn(), console=err_console, disable=rank != 0)
    tasks: dict[str, int] = {}
    if rank == 0 and len(cfg.variants) > 1:
        err_console.print(f"{len(cfg.variants)} variants x {cfg.steps} steps; an estimate follows each one's step 2")

    def on_step(name, rec, total) -> None:
        if name not in tasks:
            tasks[name] = progress.add_task(name, total=total, info="")
        if rec.step == readout.estimate_step(total) and rank == 0:
            progress.console.print(readout.estimate_line(name, rec.step, rec.step_s, total, order))
        acc = "" if rec.token_accuracy is None else f"  acc {rec.token_accuracy:.3f}"
        progress.update(tasks[name], completed=rec.step + 1,
                        info=f"loss {rec.loss:.4f}{acc}  {rec.tokens_per_s:,.0f} tok/s")

    try:
        with progress:
            result = harness.run(cfg, on_step=on_step)
    except harness.TrainFailure as e:
        err_console.print(f"[bold red]error:[/] {escape(str(e))}", soft_wrap=True)
        sys.stdout.flush(), sys.stderr.flush(), harness.shutdown(failed=True)
        os._exit(e.exit_code)  # a failed peer may have left collectives pending: do not wait on them
    if rank == 0 and json_out != "-":
        for line in loss_agreement(result) if on_cpu(result.provenance) else []:  # on a CPU, what means something
            console.print(f"[bold]{escape(line)}[/]", highlight=False)
        console.print(kpi_table(result))
        for line in notes(result):
            console.print(f"[dim]{escape(line)}[/]")
    if rank == 0 and json_out:
        write_json(result.as_dict(), json_out)
    harness.shutdown(failed=False)


def register(app: typer.Typer) -> None:
    command(app, "train")(train)
