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
  QK^T); full recomputation adds one forward of every layer, every-other half of that, selective the
  attention core's forward (Korthikanti et al. 2022, Sec. 5), op (per-op) the memory-bound kernels.
The output layer (2 * b * s_l * h * V / tp forward, x3 with backward) and the float32 cross-entropy
(16 B per logit) run on the last stage.

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
  backward, split over the tp ranks (scatter/gather, Narayanan Sec. 4.1), exposed with 1F1B and hidden
  under the next chunk's compute with interleaving (Megatron overlap_p2p_comm);
  bubble = (pp - 1) / vpp x one micro-batch's stage time (Narayanan Sec. 2.2: (p-1)/m of the ideal
  time for 1F1B, divided by v interleaved);
- data parallel over d = dp * cp ranks, gradients in Training.grad_bytes: ZeRO-0 all-reduces them once
  per step; ZeRO-1/2 reduce-scatter them and all-gather the updated bf16 weights after the optimizer
  (same bytes as the all-reduce), the gather hidden bucket by bucket under the next forward like the
  reduction under the backward; ZeRO-3 all-gathers the bf16 weights in forward and again in backward
  and reduce-scatters the gradients every micro-batch (training-math.md, "Communication volume": 1.5x
  DDP per micro-batch). With Training.dp_overlap the ZeRO 0-2 reduction runs in bucket_mib buckets
  during the backward of the last micro-batch (bucketed_exposed_s, the closed form of the DDP bucket
  model in workbench.distributed.overlap), and ZeRO-3 traffic hides behind each micro-batch's compute except
  the first unit's gather.
- optimizer step: memory-bound over the locally owned parameters (sharded from ZeRO-1): AdamW reads and
  writes the master weight and both moments, reads the gradient and writes the bf16 weight
  (26 + grad_bytes B per parameter).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from wavefront.workbench.planner.cluster import Cluster
from wavefront.workbench.planner.kernels import (
    FP8_CAST_BYTES_PER_ACT,
    FP8_CAST_BYTES_PER_WEIGHT,
    FP8_FUSED_CAST_BYTES_PER_ACT,
    attention_curve,
    linear_fwd_bwd_s,
)
from wavefront.workbench.planner.memory import stage_params
from wavefront.workbench.planner.model import ModelSpec, attention_core_flops
from wavefront.workbench.planner.parallel import PlanConfig, layers_per_stage, n_micro_batches
from wavefront.workbench.planner.training import OPTIMIZER_BYTES, Efficiency, Training

CE_BYTES_PER_LOGIT = 16.0
#: Ring attention's merge of each step's partial result (context parallelism), bytes per element and step:
#: forward reads the step's bf16 output and updates the fp32 running output (2 + 4 + 4); backward
#: accumulates dQ and the travelling dK/dV in fp32 (read + write 8). Transformer Engine's P2P context
#: parallelism keeps these fp32 accumulators (assumed from its design, not measured here).
CP_MERGE_FWD_BYTES = 10.0
CP_MERGE_BWD_BYTES = 8.0
#: ZB-H1 (Qi et al. 2023, arXiv:2401.10241, Sec. 3): splitting the backward into input- and weight-gradient
#: passes fills the 1F1B bubble to about a third at the same activation memory.
ZB_H1_BUBBLE_FRACTION = 1.0 / 3.0
#: CPU offload of the optimizer (ZeRO-Offload, Ren et al. 2021, arXiv:2101.06840): PCIe Gen4 x16 moves about
#: 25 GB/s per GPU each way; a vectorised CPU Adam is taken to update 1e9 parameters/s per GPU's share of
#: the host cores (an order-of-magnitude assumption, not fitted: no offload run is in the validation set).
PCIE_GBPS = 25.0
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

    def as_dict(self) -> dict:
        return asdict(self)

    def parts(self) -> dict[str, float]:
        return {"compute": self.compute_s, "tp comm": self.tp_comm_s, "cp comm": self.cp_comm_s,
                "pp p2p": self.pp_p2p_s, "bubble": self.bubble_s, "dp comm": self.dp_comm_s,
                "optimizer": self.optimizer_s}


def _elementwise_bytes(model: ModelSpec, tokens: float, kv_len: float, cfg: PlanConfig) -> float:
    """Forward bytes of one layer's memory-bound kernels on one GPU (module docstring)."""
    h, f = model.dims.hidden, model.dims.ffn_hidden
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


def _linear_shapes(model: ModelSpec, tp: int) -> list[tuple[int, int]]:
    """(d_in, d_out) of one layer's weight matmuls on one tensor-parallel rank."""
    h, f = model.dims.hidden, model.dims.ffn_hidden
    up = (2 if model.dims.gated_mlp else 1) * f // tp
    return [(h, (model.q_dim + 2 * model.kv_dim) // tp), (model.q_dim // tp, h), (h, up), (f // tp, h)]


def layer_compute_s(model: ModelSpec, cfg: PlanConfig, training: Training, cluster: Cluster,
                    eff: Efficiency) -> tuple[float, float]:
    """(fwd + bwd + recompute seconds of one layer for one micro-batch, attention-core seconds of one
    forward) on one GPU: weight matmuls GEMM by GEMM (kernels.py), attention from its curve, memory-bound
    kernels from their bytes, FP8 casts, a fixed cost per kernel."""
    gpu = cluster.gpu
    tokens = int(cfg.micro_batch * training.seq_len // cfg.cp)
    fp8 = training.precision == "fp8"
    stack = eff.stack_factor(training.stack)
    peak = gpu.peak_tflops(training.precision) * 1e12 * eff.gemm * stack * (eff.fp8_gemm if fp8 else 1.0)
    bf16_peak = gpu.peak_tflops("bf16") * 1e12
    hbm = gpu.hbm_tbps * 1e12 * eff.hbm
    kernel_s = eff.kernel_us * 1e-6
    mm_fwd = mm_bwd = 0.0
    cast_bytes = 0.0
    for d_in, d_out in _linear_shapes(model, cfg.tp):
        f, b = linear_fwd_bwd_s(gpu, tokens, d_in, d_out, peak, hbm, 1.0 if fp8 else 2.0, kernel_s)
        mm_fwd += f
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
        attn = 0.5 * attn_flops / (bf16_peak * eff.attention * stack * curve) + n_kernels * kernel_s
        attn_bwd = 2.5 * (attn - n_kernels * kernel_s) + n_kernels * kernel_s
        if ring:
            q_elems = tokens * model.q_dim / cfg.tp
            kv_elems = tokens * 2 * model.kv_dim / cfg.tp
            cp_merge_s = (cfg.cp - 1) * ((CP_MERGE_FWD_BYTES * q_elems + CP_MERGE_BWD_BYTES * (q_elems + kv_elems))
                                         / hbm + 2 * kernel_s)
    else:
        attn = attn_flops / (bf16_peak * eff.gemm) + 2 * kernel_s
        attn_bwd = 2.0 * attn
    ew = _elementwise_bytes(model, tokens, training.seq_len, cfg) / hbm + N_ELEMENTWISE_KERNELS * kernel_s
    fwd = mm_fwd + cast_s + attn + ew
    total = fwd + mm_bwd + cast_s + attn_bwd + 2.0 * ew + cp_merge_s
    if cfg.recompute == "full":
        total += fwd
    elif cfg.recompute == "every-other":
        total += 0.5 * fwd
    elif cfg.recompute == "op":
        total += ew
    elif cfg.recompute == "selective":
        score_bytes = 0.0
        if model.attention == "materialized":
            per_score = 9.0 if model.dropout else 4.0
            score_bytes = per_score * model.dims.n_heads * tokens * training.seq_len / cfg.tp / hbm
        total += attn + score_bytes
    return total, attn


def output_layer_s(model: ModelSpec, cfg: PlanConfig, training: Training, cluster: Cluster, eff: Efficiency) -> float:
    tokens = cfg.micro_batch * training.seq_len / cfg.cp
    flops = 3.0 * 2.0 * tokens * model.dims.hidden * model.dims.vocab / cfg.tp
    peak = cluster.gpu.peak_tflops("bf16") * 1e12 * eff.gemm
    ce = CE_BYTES_PER_LOGIT * tokens * model.dims.vocab / cfg.tp / (cluster.gpu.hbm_tbps * 1e12 * eff.hbm)
    return flops / peak + ce


def tp_comm_per_layer_s(model: ModelSpec, cfg: PlanConfig, training: Training, cluster: Cluster) -> float:
    if cfg.tp == 1:
        return 0.0
    size = 2.0 * cfg.micro_batch * training.seq_len / cfg.cp * model.dims.hidden
    n_pairs = 4 + {"full": 2, "every-other": 1}.get(cfg.recompute, 0)
    if cfg.sp:
        one = (cluster.collective_s("all_gather", size, cfg.tp, 1)
               + cluster.collective_s("reduce_scatter", size, cfg.tp, 1))
    else:
        one = cluster.collective_s("all_reduce", size, cfg.tp, 1)
    return n_pairs * one * (1.0 - training.tp_overlap)


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
                     m: int, layers_s: float, stage_compute: float) -> tuple[float, float]:
    """(total, exposed) seconds of data-parallel / ZeRO / FSDP traffic per step (module docstring)."""
    d = cfg.dp * cfg.cp
    if d <= 1:
        return 0.0, 0.0
    stride, g = cfg.tp, training.grad_bytes
    if cfg.zero == 3:
        shard = cfg.shard_group()
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
    # the reduction runs bucket by bucket under the last backward; the parameter all-gather under the next
    # step's first forward (Megatron --overlap-param-gather, FSDP forward prefetch): only the excess shows
    gather_exposed = (bucketed_exposed_s(cluster, "all_gather", 2.0 * params, bucket, d, stride, layers_s / 3.0)
                      if gather > 0 else 0.0)
    return reduce + gather, bucketed_exposed_s(cluster, kind, g * params, bucket, d, stride,
                                               2.0 * layers_s / 3.0) + gather_exposed


def _per_layer(model: ModelSpec, cfg: PlanConfig, training: Training, cluster: Cluster,
               eff: Efficiency) -> tuple[float, float, float, float]:
    """(layer compute, attention forward, TP comm, exposed CP comm) seconds per layer and micro-batch, and
    the output layer's seconds: the parts that depend only on the per-layer shape of the plan."""
    layer_s, attn_fwd_s = layer_compute_s(model, cfg, training, cluster, eff)
    tp_s = tp_comm_per_layer_s(model, cfg, training, cluster)
    cp_s = cp_comm_exposed_per_layer_s(model, cfg, training, cluster, attn_fwd_s)
    return layer_s, tp_s, cp_s, output_layer_s(model, cfg, training, cluster, eff)


def step_time(model: ModelSpec, cfg: PlanConfig, training: Training, cluster: Cluster,
              eff: Efficiency, memo: dict | None = None) -> TimeBreakdown:
    """Seconds per step (module docstring). `memo` (a dict the search keeps for one model, training,
    cluster and efficiency) shares the per-layer terms between plans of the same layer shape."""
    m = n_micro_batches(cfg, training.global_batch_seqs)
    layers = layers_per_stage(model.dims.n_layers, cfg)
    key = ("time", cfg.tp, cfg.sp, cfg.cp, cfg.micro_batch, cfg.recompute)
    if memo is None or key not in memo:
        parts = _per_layer(model, cfg, training, cluster, eff)
        if memo is None:
            memo = {}
        memo[key] = parts
    layer_s, tp_s, cp_s, out_s = memo[key]

    p2p_s = 0.0
    if cfg.pp > 1:
        act_bytes = 2.0 * cfg.micro_batch * training.seq_len / cfg.cp * model.dims.hidden / cfg.tp
        stride = cfg.tp * cfg.cp * cfg.dp
        p2p_s = 2.0 * cfg.vpp * cluster.collective_s("send_recv", act_bytes, cfg.pp, stride)
        if cfg.vpp > 1:
            # Megatron's interleaved schedule posts each send/recv ahead and overlaps it with the next
            # chunk's compute (overlap_p2p_comm): only the bubble-side transfers stay exposed, which the
            # bubble term already covers
            p2p_s = 0.0

    stage_compute = layers * layer_s + out_s  # the last stage (or the only one) is the busiest
    stage_mb = stage_compute + layers * (tp_s + cp_s) + p2p_s
    body_mb = layers * (layer_s + tp_s + cp_s) + p2p_s
    bubble = (cfg.pp - 1) / cfg.vpp * body_mb if cfg.pp > 1 else 0.0
    if cfg.zero_bubble:
        bubble *= ZB_H1_BUBBLE_FRACTION

    p_first, p_last = stage_params(model, cfg)
    params = max(p_first, p_last)
    dp_total, dp_exposed = _data_parallel_s(model, cfg, training, cluster, params, m, layers * layer_s,
                                            stage_compute)

    master, states = OPTIMIZER_BYTES[training.optimizer]
    g = training.grad_bytes
    owned = params / cfg.shard_group() if cfg.zero >= 1 else params
    if training.offload_optimizer:
        # grads down and bf16 weights up over PCIe, the update on the host (ZeRO-Offload)
        optimizer_s = owned * ((g + 2.0) / (PCIE_GBPS * 1e9) + 1.0 / CPU_ADAM_PARAMS_PER_S)
    else:
        optimizer_s = owned * (2.0 * (master + states) + g + 2.0) / (cluster.gpu.hbm_tbps * 1e12 * eff.hbm)

    compute_total = m * stage_compute
    step = m * stage_mb + bubble + dp_exposed + optimizer_s
    return TimeBreakdown(compute_total, m * layers * tp_s, m * layers * cp_s, m * p2p_s, bubble, dp_exposed,
                         optimizer_s, step, dp_total, m)
