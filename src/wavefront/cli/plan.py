"""`wavefront plan`: rank every parallel plan for a model on a cluster; `--validate` reproduces published runs.
Options, rendering and exit codes only: the job is wavefront.workbench.planner.plan(PlanRequest(...)), whose
result owns the --json document. No torch import, so it answers fast."""

from __future__ import annotations

from typing import Annotated, Literal, TypeAlias

import typer

from wavefront.cli._common import command, write_json
from wavefront.cli._output import JsonOut, console, fail, table
from wavefront.workbench.jobs import plan as job
from wavefront.workbench.planner.job import parse_fixed
from wavefront.workbench.planner.search import rank_text as fig
from wavefront.workbench.planner.stacks import explain_stack


def _opt(help_: str, *names: str, **kw): return typer.Option(*names, help=help_, **kw)


Pos, Frac = dict(min=1), dict(min=0.0, max=1.0)


def _table(title: str, columns: str, rows: list[list[str]]):
    heads = columns.split("|")  # the shared table: numbers never cut, the label columns fold
    return table(title, heads, rows, numeric=[c for c in heads if c not in ("plan", "part", "row", "metric")])


def _render(result) -> None:
    shown = result.shown()
    multi = len(result.clusters) > 1
    for line in result.header():
        console.print(line)
    if shown:
        cost = result.rank_by == "cost"
        console.print(_table(f"best {len(shown)}", "#|plan|step s|tok/s/GPU|MFU|GB" + ("|$/step" if cost else ""),
                             [[str(i), r.config.label() + (f" @{r.cluster.label}" if multi else ""),
                               fig(r.time.step_s), f"{r.kpis.tokens_per_s_per_gpu:,.0f}", f"{r.kpis.mfu:.1%}",
                               f"{r.memory.total_bytes / 1e9:.1f}"] + ([fig(r.kpis.dollars_per_step or 0.0)] if cost
                                                                        else []) for i, r in enumerate(shown, 1)]))
        shares = ("compute", "bubble", "tp comm", "cp comm", "ep comm", "pp p2p", "dp comm")
        console.print(_table("share of step time; $/step, modeled kJ/step", "#|compute|bubble|tp|cp|ep|p2p|dp|$|kJ",
                             [[str(i), *(f"{r.time.parts()[k] / r.time.step_s:.0%}" for k in shares),
                               f"{r.kpis.dollars_per_step:.2f}" if r.kpis.dollars_per_step is not None else "-",
                               f"{r.kpis.energy_per_step_j / 1e3:,.0f}"] for i, r in enumerate(shown, 1)]))
        mem, t = result.best.memory, result.best.time
        parts = ("params", "grads", "optimizer", "activations", "transient", "allocator", "buffers", "overhead",
                 "total", "capacity")
        console.print(_table(f"winner memory per GPU ({mem.stage} stage), GB", "part|GB",
                             [[k, f"{getattr(mem, f'{k}_bytes') / 1e9:.1f}"] for k in parts]))
        console.print(_table(f"winner step time ({t.n_micro} micro-batches)", "part|s|share",
                             [[k, f"{v:.4f}", f"{v / t.step_s:.1%}"] for k, v in t.parts().items()]))
    for line in [*result.explain(), *(f"warning: {w}" for w in result.warnings)]:
        console.print(f"  {line}")
    console.print(f"{result.n_enumerated:,} plans enumerated in {result.elapsed_s:.2f} s: "
                  f"{len(result.ranked):,} feasible, "
                  f"{len(result.out_of_memory):,} out of memory, {sum(result.rejected.values()):,} invalid")
    for reason, count in result.rejected.most_common(3):
        console.print(f"  [dim]{count:,} x {reason}[/]")
    eff = result.as_dict()["efficiency"][0]
    console.print(f"[dim]model, not measurement: gemm {eff['gemm']}, attention {eff['attention']} ({eff['source']})"
                  f"; held-out accuracy in docs/planner.md.[/]")


def _run_validation(paths: list[str], json_out: str | None) -> None:
    try:
        report = job.validate(job.ValidateRequest(tuple(paths)))
    except ValueError as exc:
        fail(str(exc))
    if json_out:
        write_json(report.as_dict(), json_out)
    for rep in report.tables if json_out != "-" else []:
        console.print(_table(f"{rep.name} ({rep.use})", "row|metric|published|predicted|error|split",
                             [[r.row, r.metric, f"{r.published:,.3f}", f"{r.predicted:,.3f}", f"{r.rel_error:+.1%}",
                               r.split or "-"] for r in rep.rows]))
        for metric in rep.metrics():
            console.print(f"  median |error| {metric}: {rep.median_abs_error(metric):.1%}")


S: TypeAlias = str | None
F: TypeAlias = float | None
I: TypeAlias = int | None
B: TypeAlias = bool
L: TypeAlias = list[str] | None


def plan(  # one line per option; the job is built in _main
    model: Annotated[S, _opt("Preset (e.g. llama3-70b) or a Hugging Face config.json path.")] = None,
    gpus: Annotated[L, _opt("COUNTxGPU, e.g. 64xh100 (repeatable: compare clusters).", "--gpus")] = None,
    gpus_per_node: Annotated[int, _opt("GPUs per node (scale-up domain).", **Pos)] = 8,
    nics_per_node: Annotated[int, _opt("Inter-node NICs per node (0: one per GPU).", min=0)] = 0,
    nic_gbits: Annotated[F, _opt("Gb/s per NIC (default: the GPU's).", min=0.001)] = None,
    flat_collectives: Annotated[B, _opt("Collectives across nodes are flat, not hierarchical.")] = False,
    intra_gbps: Annotated[F, _opt("Intra-node bus bandwidth, GB/s.", min=0.001)] = None,
    inter_gbps: Annotated[F, _opt("Inter-node bus bandwidth per GPU, GB/s.", min=0.001)] = None,
    intra_latency_us: Annotated[F, _opt("Intra-node collective latency, us.", min=0.0)] = None,
    inter_latency_us: Annotated[F, _opt("Inter-node collective latency, us.", min=0.0)] = None,
    hbm_gb: Annotated[F, _opt("Override the GPU memory capacity, GB.", min=0.001)] = None,
    hbm_tbps: Annotated[F, _opt("Override the HBM bandwidth, TB/s.", min=0.001)] = None,
    calibration: Annotated[L, _opt("`wavefront comm` calibration file (repeatable).", "--calibration")] = None,
    calibrate: Annotated[S, _opt("`wavefront bench` results store measured on the target GPU.")] = None,
    global_batch_tokens: Annotated[I, _opt("Tokens per optimizer step (default ~4M).", **Pos)] = None,
    seq_len: Annotated[I, _opt("Sequence length (default: the model's).", **Pos)] = None,
    micro_batch: Annotated[list[int] | None, _opt("Micro-batch sizes to try (repeatable).", **Pos)] = None,
    precision: Annotated[Literal["bf16", "fp8"], _opt("Linear-layer precision.")] = "bf16",
    optimizer: Annotated[Literal["adamw", "adamw-bf16", "sgd"], _opt("Optimizer.")] = "adamw",
    grad_bytes: Annotated[Literal["2", "4"], _opt("Gradient bytes: 4 (fp32) or 2 (bf16).")] = "4",
    attention: Annotated[Literal["flash", "materialized"], _opt("Attention implementation.")] = "flash",
    dropout: Annotated[B, _opt("The model keeps dropout masks.")] = False,
    kernels: Annotated[Literal["fused", "eager"], _opt("fused (Megatron, patched) or eager (HF).")] = "fused",
    stack: Annotated[S, _opt("Stack profile, e.g. torchtitan/2025 (default: wavefront-train's; --explain).")] = None,
    fsdp_gather: Annotated[Literal["micro-batch", "no-reshard", "step"], _opt("When ZeRO-3 gathers.")] = "micro-batch",
    offload_optimizer: Annotated[B, _opt("Optimizer states on the host (CPU offload).")] = False,
    cp_comm: Annotated[Literal["ring", "all-gather"] | None, _opt("How CP moves K and V (the stack's).")] = None,
    attention_kernel: Annotated[Literal["fa2", "cudnn", "fa3"] | None, _opt("Attention kernel (the stack's).")] = None,
    no_dp_overlap: Annotated[B, _opt("Gradient reduction after the backward.", "--no-dp-overlap")] = False,
    tp_overlap: Annotated[F, _opt("Fraction of TP communication hidden (the stack's).", **Frac)] = None,
    ep: Annotated[I, _opt("MoE: pin the expert-parallel degree (same as --fix ep=N).", **Pos)] = None,
    moe_imbalance: Annotated[float, _opt("MoE: busiest expert's tokens over the mean (1: balanced).", min=1.0)] = 1.0,
    ep_overlap: Annotated[F, _opt("MoE: fraction of the EP all-to-alls hidden (the stack's).", **Frac)] = None,
    ep_dispatch: Annotated[Literal["all-to-all", "deepep"], _opt("MoE: every copy, or once per node.")] = "all-to-all",
    head_dim: Annotated[I, _opt("Head dimension (default: the model's, or hidden / heads).", **Pos)] = None,
    price: Annotated[F, _opt("$ per GPU-hour (default: the device table's).", min=0.0)] = None,
    power_fraction: Annotated[float, _opt("Board-power fraction drawn while training.", **Frac)] = 0.75,
    train_tokens: Annotated[float, _opt("Token budget for time-to-train.", min=1.0)] = 1e12,
    gemm_eff: Annotated[F, _opt("Override the matmul efficiency.", min=0.01, max=1.0)] = None,
    attn_eff: Annotated[F, _opt("Override the attention efficiency.", min=0.01, max=1.0)] = None,
    hbm_eff: Annotated[F, _opt("Override the HBM bandwidth efficiency.", min=0.01, max=1.0)] = None,
    fix: Annotated[L, _opt("Pin a plan field: tp=8, vpp=5, recompute=op, pp_round=8 (repeatable).", "--fix")] = None,
    rank_by: Annotated[Literal["time", "cost"], _opt("Rank by step time or by $/step.")] = "time",
    memory_headroom: Annotated[float, _opt("GPU memory fraction admitted (rest: model error).", **Frac)] = 0.9,
    top: Annotated[int, _opt("Plans to print and put in --json (0: all feasible).", min=0)] = 10,
    layers: Annotated[I, _opt("Custom model: layers.", **Pos)] = None,
    hidden: Annotated[I, _opt("Custom model: hidden size.", **Pos)] = None,
    heads: Annotated[I, _opt("Custom model: attention heads.", **Pos)] = None,
    kv_heads: Annotated[I, _opt("Custom model: KV heads (default: heads).", **Pos)] = None,
    ffn: Annotated[I, _opt("Custom model: FFN hidden size.", **Pos)] = None,
    vocab: Annotated[I, _opt("Custom model: vocabulary.", **Pos)] = None,
    gated: Annotated[B, _opt("Custom model: gated (SwiGLU) MLP.")] = True,
    tied: Annotated[B, _opt("Custom model: tied embeddings.")] = False,
    validate: Annotated[L, _opt("Reproduce a published table instead (repeatable).", "--validate")] = None,
    explain: Annotated[B, _opt("Print the stack profile's terms and calibration rows.")] = False,
    json_out: JsonOut = None,
) -> None:
    """Rank every parallel plan of a model on a cluster, with memory and time breakdowns and KPIs."""
    _main(dict(locals()))


def _main(a: dict) -> None:
    if a["validate"]:
        return _run_validation(a["validate"], a["json_out"])

    try:  # --explain: the profile's terms and rows (not into --json -); alone (no model), nothing else
        explained = explain_stack(a["stack"], (a["gpus"] or ["8xh100"])[0]) if a["explain"] else []
    except ValueError as exc:
        fail(str(exc))
    for line in explained if a["json_out"] != "-" else []:
        console.print(line, markup=False, highlight=False)
    if a["explain"] and not (a["model"] or a["layers"]):
        return None

    dims = [a[k] for k in ("layers", "hidden", "heads", "ffn", "vocab")]
    if any(v is not None for v in dims) and not all(v is not None for v in dims):
        fail("give --model PRESET or path/to/config.json, or all of --layers --hidden --heads --ffn --vocab")
    custom = job.CustomDims(*dims, a["kv_heads"], a["head_dim"], a["gated"], a["tied"]) if all(dims) else None
    same = ("model", "gpus_per_node", "nics_per_node", "nic_gbits", "intra_gbps", "inter_gbps", "intra_latency_us",
            "inter_latency_us", "hbm_gb", "hbm_tbps", "global_batch_tokens", "seq_len", "precision", "optimizer",
            "attention", "dropout", "kernels", "stack", "fsdp_gather", "offload_optimizer", "cp_comm", "tp_overlap",
            "calibrate", "power_fraction", "train_tokens", "gemm_eff", "attn_eff", "hbm_eff", "rank_by", "top",
            "moe_imbalance", "ep_overlap", "ep_dispatch", "attention_kernel", "memory_headroom")
    try:
        fixed = parse_fixed(a["fix"])
    except ValueError as exc:
        fail(str(exc))
    if a["ep"] is not None and fixed.setdefault("ep", a["ep"]) != a["ep"]:
        fail(f"--ep {a['ep']} contradicts --fix ep={fixed['ep']}")
    request = job.PlanRequest(
        custom=custom, head_dim=a["head_dim"] if custom is None else None, gpus=tuple(a["gpus"] or ["8xh100"]),
        hierarchical=not a["flat_collectives"], calibrations=tuple(a["calibration"] or ()),
        micro_batch_sizes=tuple(a["micro_batch"] or (1, 2, 4, 8)), grad_bytes=int(a["grad_bytes"]),
        dp_overlap=not a["no_dp_overlap"], price_per_gpu_hour=a["price"], fixed=fixed, **{k: a[k] for k in same})
    try:
        result = job.plan(request)
    except ValueError as exc:
        fail(str(exc))
    if a["json_out"]:
        write_json(result.as_dict(), a["json_out"])
    if a["json_out"] != "-":
        _render(result)
    if not result.ranked:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    command(app, "plan")(plan)
