"""Step time of a plan, broken down: compute, tensor/context-parallel communication, pipeline bubble and
point-to-point traffic, data-parallel / FSDP communication and its overlap, optimizer.

Compute, per layer and micro-batch on one GPU (s_l = s/cp local tokens per sequence, b micro-batch):
- weight matmuls: 2 * b * s_l * (layer matmul weights) / tp FLOPs forward at Efficiency.gemm of the dense
  peak of the training precision (fp8 runs the linear layers at the fp8 peak; attention and the output
  layer stay in bf16);
- attention core: 4 * b * s_l * s * a*Q / tp FLOPs forward (QK^T and attention x V). Flash attention skips
  the masked half of a causal sequence (x 0.5) and runs at Efficiency.attention; materialised attention
  (Megatron-LM 2021) computes the full square at Efficiency.gemm and streams the scores;
- memory-bound elementwise work at Efficiency.hbm of HBM bandwidth. Bytes per layer forward, listing the
  kernels of a fused stack: two norms read + write 2sbh each (8sbh), two fused bias-dropout-residual adds
  read 4sbh and write 2sbh (+ sbh mask with dropout) each (12sbh, +2sbh), the MLP activation reads 2sbf
  and writes 2sbf (plain) or reads 4sbf and writes 2sbf (gated); GPT (f = 4h): 38sbh bytes. The norm and
  residual parts are replicated across tp ranks unless sequence parallel; the activation part is split
  by tp. A materialised softmax reads + writes the 2-byte scores and (dropout) reads + writes its output
  and a 1-byte mask: 9 (4 without dropout) bytes per score element, split by tp;
- passes: backward = 2 x forward FLOPs and bytes (2.5 x for flash attention, whose backward recomputes
  QK^T); full recomputation adds one forward of every layer (less the block's last matmul, the MLP down
  projection, where the stack's non-reentrant checkpoint stops early: Training.recompute_early_stop, a
  bf16 dense block under PyTorch >= 2.1's torch.utils.checkpoint), every-other half of that, selective the
  attention core's forward (Korthikanti et al. 2022, Sec. 5), op (per-op) the memory-bound kernels and
  the forward of the matmuls the policy reruns (Training.op_recompute_mm of them by count, in the order
  model.layer_matmuls runs them: torchtitan reruns every second one, k, o and up in a Llama block, 37% of
  the matmul FLOPs of Llama 3 8B; model.op_policy_fractions; a MoE layer's experts at the same share).
The output layer (2 * b * s_l * h * V / tp forward, x3 with backward) and the float32 cross-entropy
(16 B per logit) run on the last stage. A step runs at the pace of the slowest pipeline rank: each rank
holds the layers the memory model gives it (pipeline.chunk_layers: when pp x vpp chunks do not divide the
layers, the first and last chunks hold one fewer, which is where Megatron's
account_for_embedding/loss_in_pipeline_split and Llama 3's uneven stages put them, Dubey et al. 2024,
Sec. 3.3.2), the last rank adds the output layer, and the slowest of them sets the per-micro-batch time.

Communication (cluster.py cost model, Megatron-LM rank layout):
- tensor parallel, per layer and micro-batch (Narayanan et al. 2021, Sec. 3.2.2): 2 all-reduces of
  b*s_l*h 2-byte elements forward, 2 backward, 2 more with full recomputation; with sequence parallelism
  each all-reduce becomes an all-gather + reduce-scatter pair of the same bytes (Korthikanti Sec. 4.2.2).
  Exposed fraction 1 - Training.tp_overlap;
- context parallel (ring attention): cp-1 send/recv steps of the local K and V (2*b*s_l*kv_dim/tp 2-byte
  elements) forward and twice that backward (K, V and their gradients), overlapped with the attention
  core: only the excess over the attention time is exposed. What CP costs besides: Megatron-LM and
  Transformer Engine balance the causal mask by cutting each sequence into 2*cp chunks, two per rank
  (Megatron-LM get_batch_on_this_cp_rank), so every ring step runs kernels over chunks of s/(2 cp) tokens:
  the attention curve (kernels.py) is taken at that length (at 8K and cp 2: 2,048 tokens, 0.85x the
  8K efficiency); each step after the first merges its partial output into fp32 accumulators
  (CP_MERGE_*_BYTES at HBM speed) and launches its own kernels. Training.cp_comm = "all-gather" (Llama 3,
  Sec. 3.3.2) instead gathers K and V (exposed all-gather forward, reduce-scatter of their gradients
  backward) and runs one attention of the local queries over the whole sequence: no merges, no chunking;
- pipeline: per micro-batch and stage one send of the b*s_l*h activation forward and one of its gradient
  backward, split over the tp ranks (scatter/gather, Narayanan Sec. 4.1), exposed with 1F1B; with
  interleaving each is posted ahead and overlapped with compute (Megatron overlap_p2p_comm), and the step
  waits only on those along its critical path, 2 (pp vpp - 1) transfers a step through every model chunk
  forward and back (found by running the order with transfer times: pipeline.critical_transfers);
  bubble = (pp - 1) / vpp x one micro-batch's stage time (Narayanan Sec. 2.2: (p-1)/m of the ideal
  time for 1F1B, divided by v interleaved); with rounds of N != pp micro-batches (Training.pp_round,
  Llama 3's schedule) the bubble is the one found by running that order (pipeline.bubble_stage_times),
  which equals the closed form for Megatron-LM's orders; ZB-H1 (PlanConfig.zero_bubble, Qi et al. 2023)
  splits each backward into the input-gradient pass and the weight-gradient GEMMs (layer_passes) and idles
  (pp - 1) max(F + B - W, F, B) for stage passes F, B, W, what running its order gives (pipeline.zb_h1_bubble;
  1F1B's is (pp - 1)(F + B + W): a third of it only when the three are equal);
- data parallel over d = dp * cp ranks, gradients in Training.grad_bytes: ZeRO-0 all-reduces them once
  per step; ZeRO-1/2 reduce-scatter them and all-gather the updated bf16 weights after the optimizer
  (same bytes as the all-reduce), the gather hidden bucket by bucket under the next forward like the
  reduction under the backward; ZeRO-3 all-gathers the bf16 weights in forward and again in backward
  and reduce-scatters the gradients every micro-batch (training-math.md, "Communication volume": 1.5x
  DDP per micro-batch). With Training.dp_overlap the ZeRO 0-2 reduction runs in bucket_mib buckets
  during the backward of the last micro-batch (bucketed_exposed_s, the closed form of the DDP bucket
  model in workbench.distributed.overlap), and ZeRO-3 traffic hides behind each micro-batch's compute except
  the first unit's gather. With interleaving (vpp > 1) each model chunk's reduction is launched once its
  last backward is done, as Megatron-LM does (align_grad_reduce), and runs under the later chunks'
  backwards; its parameter gather runs from an earlier chunk's first forward (pipeline.interleaved_reduce_exposed
  and interleaved_gather_exposed, the first checked against the run of the order).
- optimizer step: memory-bound over the locally owned parameters (sharded from ZeRO-1): AdamW reads and
  writes the master weight and both moments, reads the gradient and writes the bf16 weight
  (26 + grad_bytes B per parameter).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple, cast

from wavefront.workbench.planner.cluster import Cluster
from wavefront.workbench.planner.kernels import (
    FP8_CAST_BYTES_PER_ACT,
    FP8_CAST_BYTES_PER_WEIGHT,
    FP8_FUSED_CAST_BYTES_PER_ACT,
    attention_curve,
    attention_kernel_speedup,
    gemm_s,
    grouped_gemm_s,
    grouped_linear_fwd_bwd_s,
    linear_fwd_bwd_s,
)
from wavefront.workbench.planner.memory import activation_kwargs, busiest_candidates, offloaded_layers, output_rank
from wavefront.workbench.planner.model import (
    ModelSpec,
    attention_core_flops,
    layer_activation_bytes,
    op_policy_fractions,
)
from wavefront.workbench.planner.parallel import PlanConfig, n_micro_batches
from wavefront.workbench.planner.pipeline import (
    bubble_stage_times,
    critical_transfers,
    custom_round,
    interleaved_gather_exposed,
    interleaved_reduce_exposed,
    zb_h1_bubble,
    zbv_bubble,
)
from wavefront.workbench.planner.training import OPTIMIZER_BYTES, Efficiency, Training

CE_BYTES_PER_LOGIT = 16.0
#: Ring attention's merge of each step's partial result (context parallelism), bytes per element and step:
#: forward reads the step's bf16 output and updates the fp32 running output (2 + 4 + 4); backward
#: accumulates dQ and the travelling dK/dV in fp32 (read + write 8). Transformer Engine's P2P context
#: parallelism keeps these fp32 accumulators (assumed from its design, not measured here).
CP_MERGE_FWD_BYTES = 10.0
CP_MERGE_BWD_BYTES = 8.0
#: The interleaved zero-bubble schedule over more than two virtual stages (`wavefront train --pp-schedule
#: interleaved-zb`; the search makes only ZB-H1, and ZBV is run too: pipeline.zb_h1_bubble, zbv_bubble): a third
#: of the interleaved bubble, Qi et al.'s figure for equal pass times, not run here.
ZB_INTERLEAVED_FRACTION = 1.0 / 3.0
#: CPU offload of the optimizer (ZeRO-Offload, Ren et al. 2021, arXiv:2101.06840): PCIe Gen4 x16 moves about
#: 25 GB/s per GPU each way; a vectorised CPU Adam is taken to update 1e9 parameters/s per GPU's share of
#: the host cores (an order-of-magnitude assumption, not fitted: no offload run is in the validation set).
PCIE_GBPS = 25.0
#: The host link activation offloading (Training.offload_activation_layers) copies over, GB/s per direction:
#: GB200's NVLink-C2C to its Grace CPU, 900 GB/s both ways (NVIDIA GB200 NVL72 specifications); other parts
#: PCIE_GBPS (what a PCIe Gen4 x16 host link moves in practice; Gen5 parts are not credited more).
HOST_LINK_GBPS = {"gb200": 450.0}
CPU_ADAM_PARAMS_PER_S = 1.0e9  # fp32 logits read + written by the loss forward and backward


@dataclass(frozen=True)
class TimeBreakdown:
    """Seconds per optimizer step; the exposed parts add up to step_s."""

    compute_s: float  # busiest stage, all micro-batches, fwd + bwd + recompute
    tp_comm_s: float
    cp_comm_s: float
    pp_p2p_s: float
    bubble_s: float
    dp_comm_s: float  # exposed data-parallel / FSDP communication
    optimizer_s: float
    step_s: float
    dp_comm_total_s: float  # before overlap
    n_micro: int
    ep_comm_s: float = 0.0  # exposed expert-parallel all-to-alls (MoE)
    offload_s: float = 0.0  # exposed activation copies to and from the host (Training.offload_activation_layers)

    def parts(self) -> dict[str, float]:
        return {"compute": self.compute_s, "tp comm": self.tp_comm_s, "cp comm": self.cp_comm_s,
                "pp p2p": self.pp_p2p_s, "bubble": self.bubble_s, "dp comm": self.dp_comm_s,
                "optimizer": self.optimizer_s, "ep comm": self.ep_comm_s, "offload": self.offload_s}


def _elementwise_bytes(model: ModelSpec, tokens: float, kv_len: float, cfg: PlanConfig,
                       ffn: int | None = None) -> float:
    """Forward bytes of one layer's memory-bound kernels on one GPU (module docstring); `ffn` replaces
    the MLP width (a MoE layer's shared experts)."""
    h, f = model.dims.hidden, model.dims.ffn_hidden if ffn is None else ffn
    dropout_mask = 2.0 if model.dropout else 0.0
    replicated = (8.0 + 12.0 + dropout_mask) * tokens * h
    act = (6.0 if model.dims.gated_mlp else 4.0) * tokens * f
    total = replicated / (cfg.tp if cfg.sp else 1) + act / cfg.tp
    if model.attention == "materialized":
        per_score = 9.0 if model.dropout else 4.0
        total += per_score * model.dims.n_heads * tokens * kv_len / cfg.tp
    return total


#: Forward memory-bound kernels per layer: 2 norms, 2 residual adds, RoPE, the activation, 2 copies.
N_ELEMENTWISE_KERNELS = 8


def _linear_shapes(model: ModelSpec, tp: int, ffn: int | None = None) -> list[tuple[int, int]]:
    """(d_in, d_out) of one layer's weight matmuls on one tensor-parallel rank; `ffn` replaces the MLP
    width (a MoE layer's shared experts: n_shared x expert_ffn, none when 0)."""
    h, f = model.dims.hidden, model.dims.ffn_hidden if ffn is None else ffn
    up = (2 if model.dims.gated_mlp else 1) * f // tp
    mlp = [(h, up), (f // tp, h)] if f else []
    return model.attn_linear_shapes(tp) + mlp


#: Memory-bound bytes of a MoE layer per routed row (token copy) and forward: the permutation reads the
#: token and writes its copy in expert order (2 + 2 B per hidden element), the un-permutation reads the
#: expert output and writes the weighted sum (2 + 2), the SwiGLU of the experts reads 4 and writes 2 B per
#: expert_ffn element; per token, the router's fp32 softmax/top-k reads and writes the E scores (4 + 4 B).
MOE_PERMUTE_BYTES_PER_ROW_H = 8.0
MOE_ACT_BYTES_PER_ROW_F = 6.0
ROUTER_BYTES_PER_SCORE = 8.0
#: Kernels of a MoE block beyond the grouped GEMMs, forward: router GEMM, softmax/top-k, permute, SwiGLU,
#: un-permute, and the token-count exchange.
N_MOE_KERNELS = 6


def routed_rows(model: ModelSpec, cfg: PlanConfig, training: Training) -> float:
    """Token copies the busiest EP rank runs through its experts per micro-batch: each rank routes its
    b*s/(cp*tp) tokens (sequence parallel) to top_k experts; balanced, it receives as many as it sends,
    times Training.moe_rows_factor (the load imbalance, or the expert capacity when tokens are capped)."""
    assert model.moe is not None
    tokens = cfg.micro_batch * training.seq_len / cfg.cp / (cfg.tp if cfg.sp else 1)
    return tokens * model.moe.top_k * training.moe_rows_factor


def _moe_experts_s(model: ModelSpec, cfg: PlanConfig, training: Training, cluster: Cluster, peak: float,
                   hbm: float, kernel_s: float, layer_s: float = 0.0) -> tuple[float, float, float]:
    """(forward, backward, cast seconds per pass) of the routed experts of one MoE layer on the busiest
    EP rank: two grouped GEMMs (gate+up: h -> 2 f_e; down: f_e -> h) over E/ep experts of
    rows x ep / E tokens each (tokens per expert = tokens x top_k / E over the EP group), the router GEMM,
    the permutations and the experts' activation (memory-bound), FP8 casts of the expert inputs, and the
    dispatcher's fixed cost per layer and pass (layer_s: Efficiency.moe_layer_us; twice in the backward)."""
    moe = model.moe
    assert moe is not None
    gpu, h, fe = cluster.gpu, model.dims.hidden, moe.expert_ffn
    fp8 = training.precision == "fp8"
    rows = routed_rows(model, cfg, training)
    groups = moe.n_experts // cfg.ep
    per_expert = rows / groups
    fwd = bwd = cast_bytes = 0.0
    for d_in, d_out in ((h, 2 * fe), (fe, h)):
        f, b = grouped_linear_fwd_bwd_s(gpu, groups, per_expert, d_in, d_out, peak, hbm, 1.0 if fp8 else 2.0,
                                        kernel_s)
        fwd, bwd = fwd + f, bwd + b
        if fp8:
            act_bytes = FP8_CAST_BYTES_PER_ACT if training.stack == "fsdp" else FP8_FUSED_CAST_BYTES_PER_ACT
            cast_bytes += act_bytes * rows * d_in + FP8_CAST_BYTES_PER_WEIGHT * groups * d_in * d_out
            bwd += act_bytes * rows * d_out / hbm + 2 * kernel_s
    tokens = rows / moe.top_k / training.moe_rows_factor
    bf16_peak = cluster.gpu.peak_tflops("bf16") * 1e12 * peak / (cluster.gpu.peak_tflops(training.precision) * 1e12)
    router = gemm_s(gpu, int(tokens), moe.n_experts, h, bf16_peak, hbm, 2.0, kernel_s)
    ew = ((MOE_PERMUTE_BYTES_PER_ROW_H * h + MOE_ACT_BYTES_PER_ROW_F * fe) * rows
          + ROUTER_BYTES_PER_SCORE * tokens * moe.n_experts) / hbm + N_MOE_KERNELS * kernel_s
    cast_s = cast_bytes / hbm + (2 * 2 * kernel_s if fp8 else 0.0)
    return fwd + router + ew + layer_s, bwd + 2.0 * router + 2.0 * ew + 2.0 * layer_s, cast_s


def early_stop(training: Training, moe_layer: bool = False) -> bool:
    """Whether a checkpointed block's recomputation stops before its last matmul: the stack's non-reentrant
    checkpoint early stop (Training.recompute_early_stop) on a bf16 dense block; fp8 linears save their
    inputs after the GEMM and a MoE block ends with the combine, which saves the expert outputs."""
    return training.recompute_early_stop and training.precision != "fp8" and not moe_layer


def layer_compute_s(model: ModelSpec, cfg: PlanConfig, training: Training, cluster: Cluster,
                    eff: Efficiency, moe_layer: bool = False) -> tuple[float, float]:
    """(fwd + bwd + recompute seconds of one layer for one micro-batch, attention-core seconds of one
    forward) on one GPU: weight matmuls GEMM by GEMM (kernels.py), attention from its curve, memory-bound
    kernels from their bytes, FP8 casts, a fixed cost per kernel. moe_layer: the MLP is the MoE block
    (shared experts as a tensor-parallel MLP, routed experts by _moe_experts_s)."""
    total, attn, _, _ = layer_passes(model, cfg, training, cluster, eff, moe_layer)
    return total, attn


def layer_passes(model: ModelSpec, cfg: PlanConfig, training: Training, cluster: Cluster,
                 eff: Efficiency, moe_layer: bool = False) -> tuple[float, float, float, float]:
    """layer_compute_s's (total, attention-core forward) and the layer's (forward, weight-gradient) seconds:
    the weight-gradient GEMMs (dW = X^T dY of every linear, the routed experts' included) are what ZB-H1
    splits off the backward into its own pass; the rest of the total (the input gradients, attention's
    backward, the memory-bound backward, recomputation) runs in the input-gradient pass."""
    gpu = cluster.gpu
    ffn = None
    if moe_layer:
        assert model.moe is not None
        ffn = model.moe.shared_ffn
    tokens = int(cfg.micro_batch * training.seq_len // cfg.cp)
    fp8 = training.precision == "fp8"
    stack = eff.stack_factor(training.stack)
    peak = gpu.peak_tflops(training.precision) * 1e12 * eff.gemm * stack * (eff.fp8_gemm if fp8 else 1.0)
    bf16_peak = gpu.peak_tflops("bf16") * 1e12
    hbm = gpu.hbm_tbps * 1e12 * eff.hbm
    kernel_s = eff.kernel_us * 1e-6
    mm_fwd = mm_bwd = 0.0
    cast_bytes = 0.0
    last_mm_fwd = 0.0
    fwd_of: list[float] = []  # forward seconds per weight matmul, in _linear_shapes order
    wgrad = 0.0
    for d_in, d_out in _linear_shapes(model, cfg.tp, ffn):
        f, b = linear_fwd_bwd_s(gpu, tokens, d_in, d_out, peak, hbm, 1.0 if fp8 else 2.0, kernel_s)
        wgrad += gemm_s(gpu, d_in, d_out, tokens, peak, hbm, 1.0 if fp8 else 2.0, kernel_s)
        fwd_of.append(f)
        mm_fwd += f
        last_mm_fwd = f
        mm_bwd += b
        if fp8:
            act_bytes = FP8_CAST_BYTES_PER_ACT if training.stack == "fsdp" else FP8_FUSED_CAST_BYTES_PER_ACT
            cast_bytes += act_bytes * tokens * d_in + FP8_CAST_BYTES_PER_WEIGHT * d_in * d_out
            mm_bwd += act_bytes * tokens * d_out / hbm + 2 * kernel_s
    cast_s = cast_bytes / hbm + (4 * 2 * kernel_s if fp8 else 0.0)
    attn_flops = attention_core_flops(model, cfg.micro_batch, training.seq_len / cfg.cp, training.seq_len) / cfg.tp
    cp_merge_s = 0.0
    if model.attention == "flash":
        # context parallelism: cp ring steps of kernels over one chunk of s/(2 cp) tokens (module docstring)
        ring = cfg.cp > 1 and training.cp_comm == "ring"
        chunk = training.seq_len / (2 * cfg.cp) if ring else training.seq_len
        curve = attention_curve(chunk, model.dims.head_dim)
        n_kernels = cfg.cp if ring else 1
        speed = 1.0 if eff.attention_as_is else attention_kernel_speedup(training.attention_kernel, gpu)
        attn = 0.5 * attn_flops / (bf16_peak * eff.attention * stack * curve * speed) + n_kernels * kernel_s
        attn_bwd = 2.5 * (attn - n_kernels * kernel_s) + n_kernels * kernel_s
        if ring:
            q_elems = tokens * model.q_dim / cfg.tp
            kv_elems = tokens * 2 * model.kv_dim / cfg.tp
            cp_merge_s = (cfg.cp - 1) * ((CP_MERGE_FWD_BYTES * q_elems + CP_MERGE_BWD_BYTES * (q_elems + kv_elems))
                                         / hbm + 2 * kernel_s)
    else:
        attn = attn_flops / (bf16_peak * eff.gemm) + 2 * kernel_s
        attn_bwd = 2.0 * attn
    ew = _elementwise_bytes(model, tokens, training.seq_len, cfg, ffn) / hbm + N_ELEMENTWISE_KERNELS * kernel_s
    if moe_layer:
        ex_fwd, ex_bwd, ex_cast = _moe_experts_s(model, cfg, training, cluster, peak, hbm, kernel_s,
                                                 eff.moe_layer_us * 1e-6)
        mm_fwd, mm_bwd, cast_s = mm_fwd + ex_fwd, mm_bwd + ex_bwd, cast_s + ex_cast
        wgrad += _experts_wgrad_s(model, cfg, training, cluster, peak, hbm, kernel_s)
    fwd = mm_fwd + cast_s + attn + ew
    total = fwd + mm_bwd + cast_s + attn_bwd + 2.0 * ew + cp_merge_s
    # non-reentrant checkpointing stops before the block's last matmul (Training.recompute_early_stop)
    rerun = fwd - (last_mm_fwd if early_stop(training, moe_layer) else 0.0)
    if cfg.recompute == "full":
        total += rerun
    elif cfg.recompute == "every-other":
        total += 0.5 * rerun
    elif cfg.recompute == "op":
        total += ew + op_policy_fractions(model, training.op_recompute_mm)[0] * mm_fwd
    elif cfg.recompute == "selective":
        total += _selective_rerun_s(model, cfg, training, fwd_of, attn, moe_layer, hbm, kernel_s, tokens)
    return total, attn, fwd, wgrad


def _experts_wgrad_s(model: ModelSpec, cfg: PlanConfig, training: Training, cluster: Cluster, peak: float,
                     hbm: float, kernel_s: float) -> float:
    """The routed experts' weight-gradient grouped GEMMs of one MoE layer (_moe_experts_s's shapes)."""
    assert model.moe is not None
    h, fe = model.dims.hidden, model.moe.expert_ffn
    groups = model.moe.n_experts // cfg.ep
    rows = routed_rows(model, cfg, training) / groups
    opb = 1.0 if training.precision == "fp8" else 2.0
    return sum(grouped_gemm_s(cluster.gpu, groups, d_in, d_out, rows, peak, hbm, opb, kernel_s)
               for d_in, d_out in ((h, 2 * fe), (fe, h)))


def _selective_rerun_s(model: ModelSpec, cfg: PlanConfig, training: Training, fwd_of: list[float], attn: float,
                       moe_layer: bool, hbm: float, kernel_s: float, tokens: int) -> float:
    """Seconds recompute="selective" adds to one layer per micro-batch, module by module
    (Training.recompute_modules): the attention core's forward (and materialised scores' bytes), the MLA
    up-projections' forward (q_b and kv_b, the second and fourth attention matmuls), a dense layer's MLP
    forward and activation, the experts' activation function (its bytes per routed row)."""
    modules, out = training.recompute_modules, 0.0
    if "core_attn" in modules:
        score_bytes = 0.0
        if model.attention == "materialized":
            per_score = 9.0 if model.dropout else 4.0
            score_bytes = per_score * model.dims.n_heads * tokens * training.seq_len / cfg.tp / hbm
        out += attn + score_bytes
    n_attn = len(model.attn_linear_shapes(cfg.tp))
    if "mla_up_proj" in modules:
        out += sum(fwd_of[i] for i in model.mla_up_proj_positions)
    if "mlp" in modules and not moe_layer and len(fwd_of) > n_attn:
        act = (6.0 if model.dims.gated_mlp else 4.0) * tokens * model.dims.ffn_hidden / cfg.tp
        out += sum(fwd_of[n_attn:]) + act / hbm + kernel_s
    if "moe_act" in modules and moe_layer and model.moe is not None:
        out += MOE_ACT_BYTES_PER_ROW_F * model.moe.expert_ffn * routed_rows(model, cfg, training) / hbm + kernel_s
    return out


def output_layer_s(model: ModelSpec, cfg: PlanConfig, training: Training, cluster: Cluster, eff: Efficiency) -> float:
    tokens = cfg.micro_batch * training.seq_len / cfg.cp
    flops = 3.0 * 2.0 * tokens * model.dims.hidden * model.dims.vocab / cfg.tp
    peak = cluster.gpu.peak_tflops("bf16") * 1e12 * eff.gemm
    ce = CE_BYTES_PER_LOGIT * tokens * model.dims.vocab / cfg.tp / (cluster.gpu.hbm_tbps * 1e12 * eff.hbm)
    return flops / peak + ce


def tp_comm_per_layer_s(model: ModelSpec, cfg: PlanConfig, training: Training, cluster: Cluster,
                        moe_layer: bool = False) -> float:
    """Exposed TP/SP collectives of one layer per micro-batch. A MoE layer with expert tensor parallel 1
    has them around its attention block only (half the pairs; the MoE block moves tokens by all-to-all)."""
    if cfg.tp == 1:
        return 0.0
    size = 2.0 * cfg.micro_batch * training.seq_len / cfg.cp * model.dims.hidden
    # the recomputation reruns the forward's pair of collectives per block, less the MLP's reduction when
    # it stops before the last matmul (Training.recompute_early_stop): 1.5 pairs with SP (AG, RS, AG), 1 without
    rerun = (1.5 if cfg.sp else 1.0) if early_stop(training, moe_layer) else 2.0
    n_pairs = (4 + {"full": rerun, "every-other": 0.5 * rerun}.get(cfg.recompute, 0)) * (0.5 if moe_layer else 1.0)
    if cfg.sp:
        one = (cluster.collective_s("all_gather", size, cfg.tp, 1)
               + cluster.collective_s("reduce_scatter", size, cfg.tp, 1))
    else:
        one = cluster.collective_s("all_reduce", size, cfg.tp, 1)
    return n_pairs * one * (1.0 - training.tp_overlap)


def ep_comm_per_layer_s(model: ModelSpec, cfg: PlanConfig, training: Training, cluster: Cluster,
                        layer_s: float | None = None) -> float:
    """Exposed expert-parallel all-to-alls of one MoE layer per micro-batch: dispatch and combine in the
    forward and again in the backward (4; +2 with full recomputation, +1 every other layer), each moving
    the busiest rank's routed rows x h in bf16 over the ep group (consecutive ranks: stride 1), priced by
    Cluster.all_to_all_s. Training.ep_dispatch "deepep": across nodes a token goes once to each node that
    holds one of its experts (MoE.remote_nodes_per_token of the top_k copies) and is forwarded inside the
    node over the scale-up link.

    Training.ep_overlap is the fraction of them the schedule overlaps with another micro-batch's compute
    (Megatron-Core's EP A2A overlap pairs one micro-batch's forward with another's backward, layer by
    layer): the forward's share hides under the paired layer's backward, the backward's under its forward,
    and neither can hide more than that compute (layer_s, this MoE layer's seconds per micro-batch: a
    third forward, two thirds backward, the matmul rule). Without layer_s the overlapped share is hidden
    whole, as before the bound."""
    if model.moe is None or cfg.ep == 1:
        return 0.0
    size = 2.0 * routed_rows(model, cfg, training) * model.dims.hidden
    n = 4 + {"full": 2, "every-other": 1}.get(cfg.recompute, 0)
    inter = None
    nodes = cfg.ep // cluster.gpus_per_node
    if training.ep_dispatch == "deepep" and nodes > 1 and cfg.ep % cluster.gpus_per_node == 0:
        inter = model.moe.remote_nodes_per_token(nodes) / model.moe.top_k
    total = n * cluster.all_to_all_s(size, cfg.ep, 1, inter)
    overlapped = training.ep_overlap * total
    if layer_s is None:
        return total - overlapped
    half = 0.5 * overlapped
    return total - overlapped + max(0.0, half - 2.0 * layer_s / 3.0) + max(0.0, half - layer_s / 3.0)


def cp_comm_exposed_per_layer_s(model: ModelSpec, cfg: PlanConfig, training: Training, cluster: Cluster,
                                attn_fwd_s: float) -> float:
    if cfg.cp == 1:
        return 0.0
    kv_bytes = 2.0 * 2.0 * cfg.micro_batch * training.seq_len / cfg.cp * model.kv_dim / cfg.tp
    if training.cp_comm == "all-gather":
        # gather K and V before the attention, reduce-scatter their gradients after it: exposed (Llama 3)
        return (cluster.collective_s("all_gather", cfg.cp * kv_bytes, cfg.cp, cfg.tp)
                + cluster.collective_s("reduce_scatter", cfg.cp * kv_bytes, cfg.cp, cfg.tp))
    step = cluster.collective_s("send_recv", kv_bytes, cfg.cp, cfg.tp)
    fwd = (cfg.cp - 1) * step
    bwd = 2.0 * fwd
    return max(0.0, fwd - attn_fwd_s) + max(0.0, bwd - 2.0 * attn_fwd_s)


def bucketed_exposed_s(cluster: Cluster, collective: str, total_bytes: float, bucket_bytes: float, group: int,
                       stride: int, backward_s: float) -> float:
    """Exposed time of a gradient reduction in n equal buckets launched as the backward produces them
    (the closed form of workbench.distributed.overlap.predict_ddp_exposed for uniform gradients): bandwidth-bound,
    the buckets run back to back from the first one's ready time backward_s / n; otherwise only the last
    bucket, ready at the end of the backward, is exposed:

        exposed = max(n_full * t(bucket) + t(rest) - backward_s * (1 - 1/n), t(last bucket))
    """
    bucket_bytes = min(bucket_bytes, total_bytes)
    n_full = int(total_bytes // bucket_bytes)
    rest = total_bytes - n_full * bucket_bytes
    n = n_full + (1 if rest > 0 else 0)
    t_bucket = cluster.collective_s(collective, bucket_bytes, group, stride)
    t_rest = cluster.collective_s(collective, rest, group, stride) if rest > 0 else 0.0
    t_all = n_full * t_bucket + t_rest
    t_last = t_rest if rest > 0 else t_bucket
    return max(t_all - backward_s * (1.0 - 1.0 / n), t_last)


def _data_parallel_s(model: ModelSpec, cfg: PlanConfig, training: Training, cluster: Cluster, params: float,
                     m: int, layers_s: float, stage_compute: float, experts: bool = False) -> tuple[float, float]:
    """(total, exposed) seconds of data-parallel / ZeRO / FSDP traffic per step (module docstring).
    experts: `params` are routed-expert weights, replicated over the expert-data-parallel group
    (PlanConfig.expert_dp ranks, ep apart) instead of the dp*cp ranks tp apart."""
    d, stride = (cfg.expert_dp, cfg.ep) if experts else (cfg.dp * cfg.cp, cfg.tp)
    if d <= 1 or params <= 0:
        return 0.0, 0.0
    g = training.grad_bytes
    if cfg.zero == 3:
        shard = d if experts else cfg.shard_group()
        gather = cluster.collective_s("all_gather", 2.0 * params, shard, stride)
        scatter = cluster.collective_s("reduce_scatter", g * params, shard, stride)
        # HSDP: the shards' gradients are all-reduced across the d / shard replicas once per step
        replicate = cluster.collective_s("all_reduce", g * params / shard, d // shard, stride * shard)
        gathers, rounds = {"micro-batch": (2.0, m), "no-reshard": (1.0, m), "step": (1.0, 1)}[training.fsdp_gather]
        per_round = gathers * gather + scatter
        total = rounds * per_round + replicate
        if not training.dp_overlap:
            return total, total
        first_unit = gather * max(model.layer_params, model.embedding_params) / cfg.tp / params
        window = stage_compute * m / rounds
        return total, rounds * (max(0.0, per_round - window) + first_unit) + replicate
    bucket = training.bucket_mib * 2**20
    if cfg.zero == 0:
        reduce = cluster.collective_s("all_reduce", g * params, d, stride)
        gather = 0.0
    else:
        reduce = cluster.collective_s("reduce_scatter", g * params, d, stride)
        gather = cluster.collective_s("all_gather", 2.0 * params, d, stride)
    if not training.dp_overlap:
        return reduce + gather, reduce + gather
    kind = "all_reduce" if cfg.zero == 0 else "reduce_scatter"
    if cfg.pp > 1 and cfg.vpp > 1:
        # Megatron's interleaved schedule syncs chunk by chunk: each model chunk's reduction launches after
        # its last backward and runs under the later chunks' backwards; each chunk's parameters are gathered
        # from an earlier chunk's first forward (pipeline.interleaved_reduce_exposed / _gather_exposed)
        v = cfg.vpp
        chunk_fwd = layers_s / 3.0 / v
        exposed = interleaved_reduce_exposed(cfg.pp, v, cluster.collective_s(kind, g * params / v, d, stride),
                                             2.0 * chunk_fwd)
        if gather > 0:
            first = bucketed_exposed_s(cluster, "all_gather", 2.0 * params / v, bucket, d, stride, chunk_fwd)
            exposed += interleaved_gather_exposed(cfg.pp, v, cluster.collective_s("all_gather", 2.0 * params / v,
                                                                                   d, stride), chunk_fwd, first)
        return reduce + gather, exposed
    # the reduction runs bucket by bucket under the last backward; the parameter all-gather under the next
    # step's first forward (Megatron --overlap-param-gather, FSDP forward prefetch): only the excess shows
    gather_exposed = (bucketed_exposed_s(cluster, "all_gather", 2.0 * params, bucket, d, stride, layers_s / 3.0)
                      if gather > 0 else 0.0)
    return reduce + gather, bucketed_exposed_s(cluster, kind, g * params, bucket, d, stride,
                                               2.0 * layers_s / 3.0) + gather_exposed


def _per_layer(model: ModelSpec, cfg: PlanConfig, training: Training, cluster: Cluster,
               eff: Efficiency, moe_layer: bool = False) -> tuple[float, float, float, float, float]:
    """(layer compute, TP comm, exposed CP comm, exposed EP comm) seconds per layer and micro-batch, and
    the output layer's seconds: the parts that depend only on the per-layer shape of the plan."""
    layer_s, attn_fwd_s = layer_compute_s(model, cfg, training, cluster, eff, moe_layer)
    tp_s = tp_comm_per_layer_s(model, cfg, training, cluster, moe_layer)
    cp_s = cp_comm_exposed_per_layer_s(model, cfg, training, cluster, attn_fwd_s)
    ep_s = ep_comm_per_layer_s(model, cfg, training, cluster, layer_s) if moe_layer else 0.0
    return layer_s, tp_s, cp_s, ep_s, output_layer_s(model, cfg, training, cluster, eff)


def _memo_per_layer(model: ModelSpec, cfg: PlanConfig, training: Training, cluster: Cluster, eff: Efficiency,
                    memo: dict[tuple[Any, ...], Any], moe_layer: bool) -> tuple[float, float, float, float, float]:
    key = ("time", cfg.tp, cfg.sp, cfg.cp, cfg.micro_batch, cfg.recompute) + ((cfg.ep,) if moe_layer else ())
    if key not in memo:
        memo[key] = _per_layer(model, cfg, training, cluster, eff, moe_layer)
    return cast(tuple[float, float, float, float, float], memo[key])


class _Stage(NamedTuple):
    """One candidate pipeline rank in step_time, per micro-batch: its compute (the output layer's on the rank
    that holds it, memory.output_rank, included), its layers' compute, TP, exposed CP and exposed EP seconds,
    and its (dense, MoE) layers."""

    compute: float
    layers_s: float
    tp_s: float
    cp_s: float
    ep_s: float
    counts: tuple[int, int]

    @property
    def seconds(self) -> float:
        """Compute and communication: what makes a rank the pipeline's slowest."""
        return self.compute + self.tp_s + self.cp_s + self.ep_s


def _pass_fractions(model: ModelSpec, cfg: PlanConfig, training: Training, cluster: Cluster, eff: Efficiency,
                    memo: dict[tuple[Any, ...], Any], counts: tuple[int, int]) -> tuple[float, float]:
    """(forward, weight-gradient) shares of a stage's compute, its dense and MoE layers (counts) summed."""
    key = ("passes", cfg.tp, cfg.sp, cfg.cp, cfg.micro_batch, cfg.recompute, cfg.ep, counts)
    if key not in memo:
        runs = [(n, layer_passes(model, cfg, training, cluster, eff, moe_layer))
                for n, moe_layer in zip(counts, (False, True), strict=True) if n]
        total = sum(n * p[0] for n, p in runs)
        memo[key] = ((sum(n * p[2] for n, p in runs) / total, sum(n * p[3] for n, p in runs) / total)
                     if total > 0 else (1.0 / 3.0, 1.0 / 3.0))
    return cast(tuple[float, float], memo[key])


def step_time(model: ModelSpec, cfg: PlanConfig, training: Training, cluster: Cluster,
              eff: Efficiency, memo: dict[tuple[Any, ...], Any] | None = None) -> TimeBreakdown:
    """Seconds per step (module docstring). `memo` (a dict the search keeps for one model, training,
    cluster and efficiency) shares the per-layer terms between plans of the same layer shape."""
    m = n_micro_batches(cfg, training.global_batch_seqs)
    memo = {} if memo is None else memo
    dense = _memo_per_layer(model, cfg, training, cluster, eff, memo, False)
    moe = _memo_per_layer(model, cfg, training, cluster, eff, memo, True) if model.moe is not None else dense
    out_s = dense[4]
    # per micro-batch on the busiest pipeline rank, its layers laid out as the memory model lays them
    # (pipeline.chunk_layers: uneven stages hold fewer layers on the first and last chunks; MoE: the
    # first_dense layers sit on the first); the last rank also runs the output layer
    busiest, params, experts, out_rank = None, 0.0, 0.0, output_rank(cfg)
    for rank, n_dense, n_moe, rank_params, rank_experts in busiest_candidates(model, cfg, memo):
        stage = _Stage(n_dense * dense[0] + n_moe * moe[0] + (out_s if rank == out_rank else 0.0),
                       n_dense * dense[0] + n_moe * moe[0], n_dense * dense[1] + n_moe * moe[1],
                       n_dense * dense[2] + n_moe * moe[2], n_dense * dense[3] + n_moe * moe[3], (n_dense, n_moe))
        if busiest is None or stage.seconds > busiest.seconds:
            busiest = stage
        params, experts = max(params, rank_params - rank_experts), max(experts, rank_experts)
    assert busiest is not None  # busiest_candidates is never empty
    stage_compute, counts = busiest.compute, busiest.counts
    layers_s, tp_s, cp_s, ep_s = busiest.layers_s, busiest.tp_s, busiest.cp_s, busiest.ep_s

    n_round = custom_round(cfg.pp, training.pp_round) if cfg.vpp > 1 else 0  # Llama 3's rounds, N != pp
    p2p_s = p2p_step = 0.0
    if cfg.pp > 1:
        act_bytes = 2.0 * cfg.micro_batch * training.seq_len / cfg.cp * model.dims.hidden / cfg.tp
        stride = cfg.tp * cfg.cp * cfg.dp
        send = cluster.collective_s("send_recv", act_bytes, cfg.pp, stride)
        p2p_s = 2.0 * cfg.vpp * send
        if cfg.vpp > 1:
            # Megatron's interleaved schedule posts each send/recv ahead and overlaps it with the next
            # chunk's compute (overlap_p2p_comm): no rank waits on its own transfers, but the step still waits
            # on those along its critical path, through every model chunk forward and back: 2 (pp vpp - 1) a
            # step for Megatron-LM's order (pipeline.critical_transfers runs the order to count them)
            hops = critical_transfers(cfg.pp, cfg.vpp, m, n_round) if n_round else 2.0 * (cfg.pp * cfg.vpp - 1)
            p2p_s, p2p_step = 0.0, hops * send

    offload_s = activation_offload_exposed_s(model, cfg, training, cluster, layers_s)
    stage_mb = stage_compute + tp_s + cp_s + ep_s + p2p_s + offload_s
    body_mb = layers_s + tp_s + cp_s + ep_s + p2p_s
    bubble = (cfg.pp - 1) / cfg.vpp * body_mb if cfg.pp > 1 else 0.0
    if cfg.pp > 1 and n_round:  # the bubble of the order run as it is
        bubble = bubble_stage_times(cfg.pp, cfg.vpp, m, n_round) * body_mb

    if cfg.zero_bubble and cfg.vpp == 1:  # ZB-H1: its order run with the layer's passes (pipeline.zb_h1_bubble)
        f, w = _pass_fractions(model, cfg, training, cluster, eff, memo, counts)
        bubble = zb_h1_bubble(cfg.pp, m, f * body_mb, (1.0 - f - w) * body_mb, w * body_mb)
    elif cfg.zero_bubble and cfg.vpp == 2:  # ZBV (`wavefront train --pp-schedule zbv`): torch's order, run
        f, w = _pass_fractions(model, cfg, training, cluster, eff, memo, counts)
        bubble = zbv_bubble(cfg.pp, m, f * body_mb, (1.0 - f - w) * body_mb, w * body_mb)
    elif cfg.zero_bubble:  # `wavefront train`'s interleaved zero-bubble (no search plan): not run, a third
        bubble *= ZB_INTERLEAVED_FRACTION

    dp_total, dp_exposed = _data_parallel_s(model, cfg, training, cluster, params, m, layers_s, stage_compute)
    if experts:
        ex_total, ex_exposed = _data_parallel_s(model, cfg, training, cluster, experts, m, layers_s, stage_compute,
                                                experts=True)
        dp_total, dp_exposed = dp_total + ex_total, dp_exposed + ex_exposed

    master, states = OPTIMIZER_BYTES[training.optimizer]
    g = training.grad_bytes
    owned = params / cfg.shard_group() + experts / cfg.expert_dp if cfg.zero >= 1 else params + experts
    if training.offload_optimizer:
        # grads down and bf16 weights up over PCIe, the update on the host (ZeRO-Offload)
        optimizer_s = owned * ((g + 2.0) / (PCIE_GBPS * 1e9) + 1.0 / CPU_ADAM_PARAMS_PER_S)
    else:
        optimizer_s = owned * (2.0 * (master + states) + g + 2.0) / (cluster.gpu.hbm_tbps * 1e12 * eff.hbm)

    compute_total = m * stage_compute
    step = m * stage_mb + bubble + p2p_step + dp_exposed + optimizer_s
    return TimeBreakdown(compute_total, m * tp_s, m * cp_s, m * p2p_s + p2p_step, bubble, dp_exposed,
                         optimizer_s, step, dp_total, m, m * ep_s, m * offload_s)


def activation_offload_exposed_s(model: ModelSpec, cfg: PlanConfig, training: Training, cluster: Cluster,
                                 layers_s: float) -> float:
    """Seconds per micro-batch that activation offloading (Training.offload_activation_layers, pp = 1) adds:
    the offloaded layers' activations go to the host during their forward and come back during their
    backward, each way over the host link (HOST_LINK_GBPS) on its own stream, hidden under the compute
    of the offloaded layers' forward (a third of their seconds) and backward (two thirds); what exceeds it
    is exposed."""
    k = offloaded_layers(model, training)
    if k <= 0 or cfg.pp > 1:
        return 0.0
    n = model.dims.n_layers
    per_layer = layer_activation_bytes(model, recompute=cfg.recompute, **activation_kwargs(model, cfg, training))
    copy_s = k * per_layer / (HOST_LINK_GBPS.get(cluster.gpu.key, PCIE_GBPS) * 1e9)
    under_s = k / n * layers_s
    return max(0.0, copy_s - under_s / 3.0) + max(0.0, copy_s - 2.0 * under_s / 3.0)
