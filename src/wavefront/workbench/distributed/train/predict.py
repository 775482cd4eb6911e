"""The planner's prediction for the plan a run executes, beside what the run measured.

The planner (numpy-only, ``workbench.planner``) models one optimizer step from the model's dimensions, the
plan (tp, sp, pp, vpp, dp, ZeRO stage, micro-batch, schedule), the batch and the hardware. For a run on
this machine the hardware is described by what it measures at start-up, every rank together:

- compute: the dense matmul rate the KPIs already use (``kpi.device_peak``: best of 5 fp32 512^3 matmuls);
- memory bandwidth: best of 5 copies of a 64 MiB fp32 buffer (bytes read + written over the time);
- collectives: an alpha-beta fit (``planner.comm_model.fit_alpha_beta``) of all_reduce over all ranks at
  8 B-1 MiB (best of 3 blocks) timed with ``wavefront comm``'s own case runner (gloo on a CPU);
- the fixed cost per kernel: the time of a 1-element eager op (dispatch and launch overhead).

The stack facts are `wavefront train`'s own profile (``planner.stacks.DEFAULT_PROFILE``: no TP overlap, ring
CP, the fused loss, non-reentrant checkpointing's early stop under full recomputation). The efficiencies are
set to 1 (the measured rates are achieved rates, not datasheet peaks). The step-time split is compared term by
term where the run measures the same thing: forward + backward (compute and the tensor/context-parallel
collectives inside the layers), exposed communication (data-parallel tail, pipeline transfers and bubble),
bubble (pipeline idle time) and optimizer.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from wavefront.workbench.distributed import comm
from wavefront.workbench.distributed.train.mesh import Layout
from wavefront.workbench.document import encode
from wavefront.workbench.hardware import GPU
from wavefront.workbench.planner import Efficiency, Link, ModelSpec, PlanConfig, Training, evaluate
from wavefront.workbench.planner.cluster import Cluster
from wavefront.workbench.planner.comm_model import fit_alpha_beta
from wavefront.workbench.planner.model import ModelDims
from wavefront.workbench.planner.stacks import DEFAULT_PROFILE, get_profile

#: all_reduce sizes timed at start-up: the smallest pins the latency, the largest the bandwidth.
_SIZES = (8, 1 << 12, 1 << 16, 1 << 20)


@dataclass(frozen=True)
class MeasuredDevice:
    """This machine as the planner needs it, measured at start-up."""

    matmul_tflops: float
    mem_gbps: float
    kernel_us: float
    allreduce_alpha_us: float | None
    allreduce_busbw_gbps: float | None
    ram_gb: float
    threads: int
    source: str


def _best(fn, repeats: int = 5) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def measure(matmul_tflops: float, device: torch.device) -> MeasuredDevice:
    """Every rank must call it (the all_reduce fit is collective)."""
    src = torch.ones(16 * 1024 * 1024, device=device)
    dst = torch.empty_like(src)
    mem_gbps = 2 * src.numel() * 4 / _best(lambda: dst.copy_(src)) / 1e9
    one = torch.ones(1, device=device)
    kernel_us = _best(lambda: [one.add(1) for _ in range(100)]) / 100 * 1e6
    world = dist.get_world_size() if dist.is_initialized() else 1
    alpha = busbw = None
    if world > 1:
        cache: dict = {}
        # best of the repeats (the least disturbed by other work on a shared CPU); a two-parameter fit
        times = [comm.bench_case("all_reduce", "in-place", s, group_size=world, warmup=2, iters=5, repeats=3,
                                 device=device, groups_cache=cache).time_us_min * 1e-6 for s in _SIZES]
        fit = fit_alpha_beta("all_reduce", world, _SIZES, times)
        alpha, busbw = fit.alpha_us, fit.busbw_gbps
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9 if hasattr(os, "sysconf") else 64.0
    return MeasuredDevice(matmul_tflops, mem_gbps, kernel_us, alpha, busbw, ram, torch.get_num_threads(),
                          "measured at start-up: fp32 512^3 matmul, 64 MiB copy, 1-element op, gloo all_reduce "
                          "alpha-beta over 8 B-1 MiB")


def plan_config(layout: Layout, micro_batch: int, recompute: str):
    """The planner's PlanConfig for a layout: FSDP2 over dp_shard > 1 is ZeRO-3 (HSDP: shard groups of
    dp_shard), replicas only (dp_shard 1) keep whole weights like DDP (ZeRO-0)."""
    sharded = layout.dp_shard > 1
    return PlanConfig(tp=layout.tp, sp=layout.tp > 1, pp=layout.pp, vpp=layout.vpp, cp=layout.cp, dp=layout.dp,
                      zero=3 if sharded else 0, recompute=recompute, micro_batch=micro_batch,
                      zero_bubble=layout.pp_schedule in ("zbv", "interleaved-zb"),
                      shard=layout.dp_shard if sharded and layout.dp_replicate > 1 else 0)


def _cluster(dev: MeasuredDevice, world: int):
    busbw = dev.allreduce_busbw_gbps or dev.mem_gbps
    gpu = GPU("cpu-measured", "this CPU (measured)", "cpu", "cpu", dev.matmul_tflops, None, None, dev.matmul_tflops,
              dev.mem_gbps / 1e3, dev.ram_gb, 1.0, 0.0, dev.threads, 1.0, busbw, None, dev.source)
    link = Link(busbw, dev.allreduce_alpha_us or 0.0, dev.source)
    return Cluster(gpu, world, world, link, link)


def predict(dev: MeasuredDevice, hf_config, layout: Layout, *, world: int, seq_len: int, global_batch: int,
            micro_batch: int, recompute: str = "none") -> dict:
    """The planner's time breakdown and KPIs for this plan on this machine (a JSON-ready dict)."""
    c = hf_config
    heads = c.num_attention_heads
    dims = ModelDims(str(getattr(c, "model_type", "model")), c.hidden_size, c.intermediate_size,
                     c.num_hidden_layers, heads, getattr(c, "num_key_value_heads", None) or heads,
                     getattr(c, "head_dim", None) or c.hidden_size // heads, c.vocab_size, seq_len,
                     gated_mlp=True, tied_embeddings=bool(getattr(c, "tie_word_embeddings", False)),
                     source="the run's model config")
    spec = ModelSpec(dims, attention="flash", dropout=False, kernels="fused")
    training = Training(global_batch_tokens=global_batch * seq_len, seq_len=seq_len, precision="bf16",
                        micro_batch_sizes=(micro_batch,), **get_profile(DEFAULT_PROFILE).training_fields())
    eff = Efficiency(gemm=1.0, attention=1.0, hbm=1.0, kernel_us=min(dev.kernel_us, 1000.0), fsdp_stack=1.0,
                     source="measured rates are achieved rates: efficiencies 1")
    result = evaluate(spec, plan_config(layout, micro_batch, recompute), training, _cluster(dev, world), eff)
    if result.time is None:
        return {"ok": False, "reasons": list(result.reasons), "device": encode(dev)}
    t = result.time
    return {"ok": True, "plan": result.config.label(), "device": encode(dev), "time": encode(t),
            "tokens_per_s": global_batch * seq_len / t.step_s,
            "memory_bytes": result.memory.total_bytes if result.memory is not None else None}


def compare(prediction: dict, summary) -> dict:
    """Predicted vs measured per step-time term (seconds) and the ratio predicted / measured."""
    if not prediction.get("ok") or summary is None:
        return {}
    t = prediction["time"]
    # The run times forward and backward as wholes, tensor-parallel collectives included (they sit inside
    # each layer); the exposed-communication column is what comes after them: the data-parallel tail, the
    # pipeline's waiting and transfers.
    rows = {"step_s": (t["step_s"], summary.step_s_mean),
            "fwd_bwd_s": (t["compute_s"] + t["tp_comm_s"] + t["cp_comm_s"], summary.fwd_s + summary.bwd_s),
            "exposed_comm_s": (t["pp_p2p_s"] + t["dp_comm_s"] + t["bubble_s"], summary.comm_s),
            "bubble_s": (t["bubble_s"], summary.bubble_s),
            "optimizer_s": (t["optimizer_s"], summary.opt_s),
            "tokens_per_s": (prediction["tokens_per_s"], summary.tokens_per_s)}
    return {k: {"predicted": p, "measured": m, "ratio": (p / m if m else None) if m is not None else None}
            for k, (p, m) in rows.items()}


def describe(variant: str, prediction: dict | None) -> list[str]:
    """Lines for the console: the planner's step time beside the measured one, term by term."""
    if not prediction:
        return []
    if not prediction.get("ok"):
        return [f"{variant}: no prediction: {'; '.join(prediction.get('reasons', []))}"]
    parts = []
    for key, row in prediction["vs_measured"].items():
        p, m = row["predicted"], row["measured"]
        measured = "n/a" if m is None else f"{m:.3g}"
        ratio = f" (x{row['ratio']:.3g})" if row["ratio"] is not None else ""
        parts.append(f"{key if key == 'tokens_per_s' else key.removesuffix('_s')} {p:.3g} vs {measured}{ratio}")
    return [f"{variant}: planner ({prediction['plan']}, this machine measured at start-up) predicted vs measured, "
            f"s/step: " + ", ".join(parts)]
