"""`wavefront plan`: rank every parallel plan for a model on a cluster; `--validate` reproduces published runs.

Thin over wavefront.workbench.planner (plan, evaluate, validation); no torch import, so it answers fast.
"""

from __future__ import annotations

from typing import Annotated

import typer

from wavefront.cli._output import console, fail, write_json

SCHEMA = "wavefront.plan/1"
VALIDATION_SCHEMA = "wavefront.plan.validation/1"


def _parse_fixed(items: list[str] | None) -> dict:
    from wavefront.workbench.planner import PlanConfig

    fields = PlanConfig.__dataclass_fields__
    out = {}
    for item in items or []:
        key, sep, raw = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in fields:
            fail(f"--fix expects FIELD=VALUE with FIELD one of {', '.join(fields)}; got {item!r}")
        kind = fields[key].type
        try:
            if "bool" in str(kind):
                value = raw.strip().lower() in ("1", "true", "yes", "on")
            elif "int" in str(kind):
                value = int(raw)
            else:
                value = raw.strip()
        except ValueError:
            fail(f"--fix {key}: {raw!r} is not a valid value")
        out[key] = value
    return out


def _model(name, layers, hidden, heads, kv_heads, ffn, vocab, seq_len, gated, tied, attention, dropout, kernels):
    from wavefront.shapes import ModelDims, get_model
    from wavefront.workbench.planner import ModelSpec

    custom = [layers, hidden, heads, ffn, vocab]
    if name:
        try:
            dims = get_model(name)
        except ValueError as exc:
            fail(f"--model: {exc}")
        if any(v is not None for v in custom + [kv_heads]):
            fail("--model and custom dimensions (--layers, --hidden, ...) are exclusive")
    else:
        if any(v is None for v in custom):
            fail("give --model PRESET, or all of --layers --hidden --heads --ffn --vocab for a custom model")
        kv = kv_heads or heads
        if hidden % heads or heads % kv:
            fail(f"--hidden ({hidden}) must be divisible by --heads ({heads}), and --heads by --kv-heads ({kv})")
        dims = ModelDims("custom", hidden, ffn, layers, heads, kv, hidden // heads, vocab, seq_len or 4096,
                         gated_mlp=gated, tied_embeddings=tied, source="command line")
    try:
        return ModelSpec(dims, attention=attention, dropout=dropout, kernels=kernels)
    except ValueError as exc:
        fail(str(exc))


def _fmt_gb(b: float) -> str:
    return f"{b / 1e9:.1f}"


def _plans_tables(result, top: int):
    """Two tables of the best plans, each fitting 80 columns: the KPIs, then where the step time goes."""
    from rich import box
    from rich.table import Table

    shown = result.ranked[:top]
    kpis = Table(title=f"{result.model.name} on {', '.join(c.label for c in result.clusters)}: "
                       f"{len(result.ranked):,} feasible plans, best {len(shown)} by {result.rank_by}",
                 box=box.SIMPLE_HEAD)
    for c in ("#", "plan", "step s", "tok/s/GPU", "MFU", "GB"):
        kpis.add_column(c, justify="left" if c == "plan" else "right", no_wrap=True)
    parts = Table(title="share of step time; cost, modeled energy, days to train", box=box.SIMPLE_HEAD)
    for c in ("#", "compute", "bubble", "tp", "cp", "p2p", "dp", "$/step", "kJ/step", "days"):
        parts.add_column(c, justify="right", no_wrap=True)
    multi = len(result.clusters) > 1
    for i, r in enumerate(shown, start=1):
        t, k = r.time, r.kpis
        label = r.config.label() + (f" @{r.cluster.label}" if multi else "")
        kpis.add_row(str(i), label, f"{t.step_s:.2f}", f"{k.tokens_per_s_per_gpu:,.0f}", f"{k.mfu:.1%}",
                     _fmt_gb(r.memory.total_bytes))

        def share(v, t=t):
            return f"{v / t.step_s:.1%}" if v > 0 else "-"

        parts.add_row(str(i), share(t.compute_s), share(t.bubble_s), share(t.tp_comm_s), share(t.cp_comm_s),
                      share(t.pp_p2p_s), share(t.dp_comm_s),
                      f"{k.dollars_per_step:.2f}" if k.dollars_per_step is not None else "-",
                      f"{k.energy_per_step_j / 1e3:,.0f}", f"{k.time_to_train_days:,.0f}")
    return kpis, parts


def _breakdown_tables(best):
    from rich import box
    from rich.table import Table

    mem, t = best.memory, best.time
    m = Table(title=f"winner memory per GPU ({mem.stage} stage)", box=box.SIMPLE_HEAD)
    m.add_column("part")
    m.add_column("GB", justify="right")
    for name in ("params", "grads", "optimizer", "activations", "transient", "buffers", "overhead", "total"):
        m.add_row(name, _fmt_gb(getattr(mem, f"{name}_bytes")))
    m.add_row("capacity", _fmt_gb(mem.capacity_bytes))
    m.add_row("in flight", f"{mem.inflight_micro_batches} mb")
    s = Table(title=f"winner step time ({t.n_micro} micro-batches)", box=box.SIMPLE_HEAD)
    s.add_column("part")
    s.add_column("s", justify="right")
    s.add_column("share", justify="right")
    for name, value in t.parts().items():
        s.add_row(name, f"{value:.4f}", f"{value / t.step_s:.1%}")
    s.add_row("dp comm before overlap", f"{t.dp_comm_total_s:.4f}", "")
    s.add_row("step", f"{t.step_s:.4f}", "100%")
    return m, s


def _run_validation(paths: list[str], json_out: str | None) -> None:
    from rich.table import Table

    from wavefront.workbench.planner.validation import validate_files

    try:
        reports = validate_files(paths)
    except ValueError as exc:
        fail(str(exc))
    if json_out:
        write_json({"schema": VALIDATION_SCHEMA, "tables": [r.as_dict() for r in reports]}, json_out)
    if json_out == "-":
        return
    for rep in reports:
        table = Table(title=f"{rep.name} ({rep.use}): {rep.title}")
        for c in ("row", "metric", "published", "predicted", "error", "plan", "fits"):
            table.add_column(c, justify="right" if c in ("published", "predicted", "error") else "left",
                             overflow="fold")
        for r in rep.rows:
            table.add_row(r.row, r.metric, f"{r.published:,.3f}", f"{r.predicted:,.3f}", f"{r.rel_error:+.1%}",
                          r.plan, "yes" if r.fits else "no")
        console.print(table)
        for metric in rep.metrics():
            console.print(f"  median |error| {metric}: {rep.median_abs_error(metric):.1%}")


def plan(
    model: Annotated[str | None, typer.Option(help="Model preset (wavefront.shapes), e.g. llama3-70b.")] = None,
    gpus: Annotated[list[str] | None, typer.Option("--gpus", help="COUNTxGPU, e.g. 64xh100 (repeatable: "
                                                   "compare clusters).")] = None,
    gpus_per_node: Annotated[int, typer.Option(help="GPUs per node (scale-up domain).")] = 8,
    intra_gbps: Annotated[float | None, typer.Option(help="Intra-node bus bandwidth, GB/s.")] = None,
    inter_gbps: Annotated[float | None, typer.Option(help="Inter-node bus bandwidth per GPU, GB/s.")] = None,
    intra_latency_us: Annotated[float | None, typer.Option(help="Intra-node collective latency, us.")] = None,
    inter_latency_us: Annotated[float | None, typer.Option(help="Inter-node collective latency, us.")] = None,
    calibration: Annotated[list[str] | None, typer.Option("--calibration", help="`wavefront comm` calibration "
                                                          "file (repeatable: one intra-node, one inter-node).")] = None,
    global_batch_tokens: Annotated[int | None, typer.Option(help="Tokens per optimizer step (default ~4M).")] = None,
    seq_len: Annotated[int | None, typer.Option(help="Sequence length (default: the model's).")] = None,
    micro_batch: Annotated[list[int] | None, typer.Option("--micro-batch", help="Micro-batch sizes to try "
                                                          "(repeatable; default 1 2 4 8).")] = None,
    precision: Annotated[str, typer.Option(help="bf16 or fp8 (linear layers).")] = "bf16",
    optimizer: Annotated[str, typer.Option(help="adamw, adamw-bf16 or sgd.")] = "adamw",
    grad_bytes: Annotated[int, typer.Option(help="Gradient bytes per element: 4 (fp32) or 2 (bf16).")] = 4,
    attention: Annotated[str, typer.Option(help="flash or materialized.")] = "flash",
    dropout: Annotated[bool, typer.Option(help="The model keeps dropout masks.")] = False,
    kernels: Annotated[str, typer.Option(help="fused (norms and gated activations as fused kernels: Megatron, "
                                              "wavefront-patched models) or eager (Hugging Face's eager modules, "
                                              "which keep more activations).")] = "fused",
    no_dp_overlap: Annotated[bool, typer.Option("--no-dp-overlap",
                                                help="Gradient reduction after the backward.")] = False,
    price: Annotated[float | None, typer.Option(help="$ per GPU-hour (default: the device table's).")] = None,
    power_fraction: Annotated[float, typer.Option(help="Board-power fraction drawn while training.")] = 0.75,
    train_tokens: Annotated[float, typer.Option(help="Token budget for time-to-train.")] = 1e12,
    gemm_eff: Annotated[float | None, typer.Option(help="Override the matmul efficiency (fraction of peak).")] = None,
    attn_eff: Annotated[float | None, typer.Option(help="Override the attention efficiency.")] = None,
    hbm_eff: Annotated[float | None, typer.Option(help="Override the HBM bandwidth efficiency.")] = None,
    fix: Annotated[list[str] | None, typer.Option("--fix", help="Pin a plan field, e.g. tp=8 or "
                                                  "recompute=selective (repeatable).")] = None,
    rank_by: Annotated[str, typer.Option(help="time or cost.")] = "time",
    top: Annotated[int, typer.Option(help="Plans to print and to put in --json (0: all feasible).")] = 10,
    layers: Annotated[int | None, typer.Option(help="Custom model: layers.")] = None,
    hidden: Annotated[int | None, typer.Option(help="Custom model: hidden size.")] = None,
    heads: Annotated[int | None, typer.Option(help="Custom model: attention heads.")] = None,
    kv_heads: Annotated[int | None, typer.Option(help="Custom model: KV heads (default: heads).")] = None,
    ffn: Annotated[int | None, typer.Option(help="Custom model: FFN hidden size.")] = None,
    vocab: Annotated[int | None, typer.Option(help="Custom model: vocabulary.")] = None,
    gated: Annotated[bool, typer.Option(help="Custom model: gated (SwiGLU) MLP.")] = True,
    tied: Annotated[bool, typer.Option(help="Custom model: tied embeddings.")] = False,
    validate: Annotated[list[str] | None, typer.Option(
        "--validate", help="Instead of searching, reproduce a published table (tests/data/published/*.json; "
                           "repeatable).")] = None,
    json_out: Annotated[str | None, typer.Option("--json", help="Write the result document ('-': stdout).")] = None,
) -> None:
    """Search every parallel plan (DP, ZeRO 0-3/FSDP, TP+SP, PP 1F1B/interleaved, CP, recomputation,
    micro-batch) for a model on a cluster; print the ranked feasible plans with memory and time breakdowns,
    MFU, tokens/s, $/step, energy/step and time-to-train, and explain the winner."""
    if validate:
        _run_validation(validate, json_out)
        return

    from wavefront.workbench.planner import Efficiency, Training, make_cluster
    from wavefront.workbench.planner import plan as run_plan
    from wavefront.workbench.planner.comm_model import load_calibration
    from wavefront.workbench.planner.search import DEFAULT_BATCH_TOKENS

    if rank_by not in ("time", "cost"):
        fail(f"--rank-by must be time or cost; got {rank_by!r}")
    if top < 0:
        fail(f"--top must be >= 0, got {top}")
    spec = _model(model, layers, hidden, heads, kv_heads, ffn, vocab, seq_len, gated, tied, attention, dropout,
                  kernels)
    try:
        cals = tuple(load_calibration(p) for p in calibration or [])
        clusters = [make_cluster(g, gpus_per_node=gpus_per_node, intra_gbps=intra_gbps, inter_gbps=inter_gbps,
                                 intra_latency_us=intra_latency_us, inter_latency_us=inter_latency_us,
                                 price_per_gpu_hour=price, power_fraction=power_fraction, calibrations=cals)
                    for g in (gpus or ["8xh100"])]
        seq = seq_len or spec.dims.seq_len
        tokens = global_batch_tokens or max(seq, DEFAULT_BATCH_TOKENS // seq * seq)
        training = Training(global_batch_tokens=tokens, seq_len=seq, precision=precision, optimizer=optimizer,
                            grad_bytes=grad_bytes, micro_batch_sizes=tuple(micro_batch or (1, 2, 4, 8)),
                            train_tokens=train_tokens, dp_overlap=not no_dp_overlap)
        efficiency = None
        if gemm_eff is not None or attn_eff is not None or hbm_eff is not None:
            base = Efficiency.for_gpu(clusters[0].gpu.key)
            efficiency = Efficiency(gemm=gemm_eff or base.gemm, attention=attn_eff or base.attention,
                                    hbm=hbm_eff or base.hbm, source="command line")
        result = run_plan(spec, clusters, training, efficiency=efficiency, rank_by=rank_by, fixed=_parse_fixed(fix))
    except ValueError as exc:
        fail(str(exc))

    shown = result.ranked if top == 0 else result.ranked[:top]
    explanation = result.explain()
    if json_out:
        write_json({
            "schema": SCHEMA,
            "model": spec.dims.as_dict() | {"params": spec.total_params, "attention": spec.attention,
                                            "dropout": spec.dropout, "kernels": spec.kernels},
            "clusters": [c.as_dict() for c in clusters], "training": training.as_dict(),
            "efficiency": [(efficiency or Efficiency.for_gpu(c.gpu.key)).as_dict() for c in clusters],
            "rank_by": rank_by,
            "search": {"n_enumerated": result.n_enumerated, "n_feasible": len(result.ranked),
                       "n_out_of_memory": len(result.out_of_memory), "n_invalid": sum(result.rejected.values()),
                       "invalid_reasons": dict(result.rejected.most_common()), "elapsed_s": result.elapsed_s},
            "plans": [r.as_dict() for r in shown],
            "closest_out_of_memory": [r.as_dict() for r in result.out_of_memory[:5]],
            "explanation": explanation,
        }, json_out)
    if json_out == "-":
        return
    dims = spec.dims
    console.print(f"[bold]{dims.name}[/]: {spec.total_params / 1e9:.1f}B params, {dims.n_layers} layers, "
                  f"h {dims.hidden}, "
                  f"{dims.n_heads}/{dims.n_kv_heads} heads; batch {training.global_batch_tokens:,} tokens "
                  f"({training.global_batch_seqs} x {training.seq_len}), {training.precision}, {training.optimizer}")
    if result.ranked:
        for table in _plans_tables(result, top or len(result.ranked)):
            console.print(table)
        mem_table, time_table = _breakdown_tables(result.best)
        console.print(mem_table)
        console.print(time_table)
    for line in explanation:
        console.print(f"  {line}")
    invalid = sum(result.rejected.values())
    console.print(f"{result.n_enumerated:,} plans enumerated in {result.elapsed_s:.2f} s: {len(result.ranked):,} "
                  f"feasible, {len(result.out_of_memory):,} out of memory, {invalid:,} invalid")
    for reason, count in result.rejected.most_common(4):
        console.print(f"  [dim]{count:,} x {reason}[/]")
    for r in result.out_of_memory[:3]:
        console.print(f"  [dim]out of memory: {r.config.label()} on {r.cluster.label}: {r.reasons[0]}[/]")
    eff = efficiency or Efficiency.for_gpu(clusters[0].gpu.key)
    console.print(f"[dim]model, not measurement: efficiencies gemm {eff.gemm}, attention {eff.attention}, "
                  f"hbm {eff.hbm} "
                  f"({eff.source}); links {clusters[0].intra.busbw_gbps:.0f}/{clusters[0].inter.busbw_gbps:.0f} GB/s "
                  f"intra/inter ({'calibrated' if cals else clusters[0].intra.source}); energy modeled at "
                  f"{power_fraction:.0%} of board power.[/]")
    if not result.ranked:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("plan")(plan)
