"""Memory per GPU for a plan: model states per ZeRO stage, activations, transients, overheads.

Model states (mixed precision, Rajbhandari et al. 2020, arXiv:1910.02054, Sec. 3.1; training-math.md
"Memory per GPU"): bf16 weights w = 2 B, gradients g = 2 or 4 B (Training.grad_bytes), and the optimizer's
master copy + states (training.OPTIMIZER_BYTES; 4 + 8 for AdamW). Sharding degree d = dp * cp (the ranks
that hold the same parameters):

    ZeRO-0 (DDP):                 P (w + g + master + states)          AdamW, fp32 grads: 18 B/param
    ZeRO-1 (distributed opt.):    P (w + g) + P (master + states) / d    6 + 12/d
    ZeRO-2:                       P w + P (g + master + states) / d      2 + 16/d
    ZeRO-3 / FSDP:                P (max(master, w) + g + states) / d    16/d (FSDP2 keeps the fp32
                                  sharded parameter as the master; the bf16 copy is gathered per layer)
    ZeRO-3, DeepSpeed layout:     P (w + master + g + states) / d        (2 + 2 + 12)/d with bf16 grads, the
                                  paper's (2 + 2 + K) psi / Nd (Training.zero3_16bit_shard)

P is the parameter count of a pipeline rank: its layers (pipeline.chunk_layers) (matmul weights / tp; norm
weights replicated) plus the input embedding V*h/tp on the first stage and the output layer on the last
(Megatron keeps a copy of a tied embedding there).

Activations (Korthikanti et al. 2022, Sec. 4.2.3, and model.layer_activation_bytes) with pipeline parallelism: per
rank, the largest set of (micro-batch, chunk) activations the schedule keeps live, stepped from the schedule's own
order (pipeline.py: 1F1B holds min(pp - r, m) micro-batches on rank r; the interleaved schedule min(2 (pp - r - 1) +
(vpp - 1) pp + 1, m vpp) chunks; ZB-H1 1F1B's on rank r plus up to r micro-batches' weight-gradient inputs,
zb_state_bytes; ZBV its own order's, per chunk), each chunk weighed by its own layers (uneven stages: fewer layers on
the first and last chunks), the first chunk of rank 0 adding the embedding's output per live micro-batch, the last
rank the loss once (loss_activation_bytes, per Training.loss_logits: Megatron's vocab-parallel fp32 logits 4sbh(1 +
V/h)/t, PyTorch's F.cross_entropy on an fp32 copy 4sbh/t + 10sbV/t, or a fused LM-head loss 4sbh/t). The memory
reported is that of the rank with the largest total (`stage`: "first", "last" or "rank R"; Llama 3 405B at 16 micro-
batches: rank 1, whose 8 one-layer chunks all hold every micro-batch, while rank 0 has an embedding-only chunk). fp8
training keeps the linear layers' inputs in fp8 (model.layer_activation_bytes). Transients: with full (selective, per-
op) recomputation the backward rebuilds one layer's full activations (what the policy dropped) at a time; ZeRO-3
gathers the bf16 weights of two units (current + prefetch) and the unsharded gradients of one before its reduce-
scatter (Training.zero3_unit: FSDP2's unit is a layer; DeepSpeed gathers per sub-module, the largest weight matrix,
and keeps up to stage3_max_live_parameters, 1e9, resident: submodule_params), plus the whole stage's bf16 weights
without resharding (Training.fsdp_gather "no-reshard") and its gradients too when gathering once per step ("step");
HSDP (PlanConfig.shard) shards the states over the shard group only; ZeRO 0-2 keep two in-flight gradient buckets. CPU
offload (Training.offload_optimizer) moves the master weights and optimizer states to the host. Activation offloading
(Training.offload_activation_layers, pp = 1) keeps (k - 1) of n layers' activations in host memory (offload_fraction;
MemoryBreakdown.offloaded_bytes).
Framework overhead (CUDA context, NCCL, workspaces) is a constant.

Fragmentation is counted once, as its own term: allocator_bytes = Training.allocator_slack (5%) x (activations +
transients), the caching allocator's reserved over allocated (it rounds blocks and keeps freed ones cached, and what
it churns is the activations and the transients, not the states allocated once). It is part of total_bytes, so
fits_device (total <= the device) is what a run needs, and what every published run that ran is checked against.
The search's headroom is something else: it admits a plan only within Training.memory_headroom (0.90) of the device
(usable_bytes; fits), a margin for this model's own error and what it leaves out (compile and fp8 workspaces, NCCL
buffers growing with the communicators; the model reads 11.6% under torchtitan's published reserved peaks), not a
second fragmentation allowance. The 5% is an assumption (no published figure sizes reserved-over-allocated); the
device is its memory as CUDA reports it (DEVICE_BYTES: an H100 80GB has 85.0e9 B, not 80e9).

Measured (tests/workbench/planner/test_planner_recompute_measured.py, `wavefront train --recompute`): the
per-layer activations of every policy to the norms' rstd; the full-recompute working set to 1.4%; every-other's
working set is an upper bound (the rebuilt layer reuses the freed activations of the layer above it); the
backward's own activation gradients (about 0.4 of a layer) are not modelled; PP2 1F1B in-flight counts.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from operator import mul
from typing import Any, cast

from wavefront.workbench.hardware import GPU, GPUS
from wavefront.workbench.planner.cluster import Cluster
from wavefront.workbench.planner.model import (
    ModelSpec,
    embedding_activation_bytes,
    layer_activation_bytes,
    op_policy_fractions,
    output_activation_bytes,
)
from wavefront.workbench.planner.parallel import PlanConfig, layers_per_stage, n_micro_batches
from wavefront.workbench.planner.pipeline import (
    candidate_ranks,
    chunk_first_layer,
    chunk_layers,
    peak,
    schedule_live_counts,
    zb_h1_live,
    zbv_live,
)
from wavefront.workbench.planner.training import OPTIMIZER_BYTES, Training

WEIGHT_BYTES = 2  # bf16 working weights (fp8 training keeps bf16 weights and casts per matmul)

#: Device memory as CUDA reports it (torch.cuda.get_device_properties(d).total_memory), bytes: what a run has.
#: The capacities on datasheets and in the device table ("80 GB") are binary sizes of the HBM stacks (5 x 16
#: GiB on H100) less what the driver keeps, not 10^9-byte gigabytes: the H100's 80 "GB" are 85.0e9 bytes,
#: 6% more than hbm_gb x 1e9. Parts without a reported figure here (and --hbm-gb overrides) use hbm_gb x 1e9.
DEVICE_BYTES: dict[str, tuple[float, str]] = {
    "h100": (81_082 * 2**20, "H100 80GB HBM3: total_memory 81,082-81,090 MiB in published torch device "
                             "listings; torchtitan logs 'NVIDIA H100 80GB HBM3 with 79.18GiB memory'"),
    "h200": (139.81 * 2**30, "H200: torchtitan logs 'NVIDIA H200 with 139.81GiB memory' (139.83 in another log)"),
    "a100": (84_477_476_864, "A100-SXM4-80GB: 84,477,476,864 B total in a published allocator log (another "
                             "reports 79.25 GiB visible; the lower is kept)"),
    "a100-40gb": (40_536 * 2**20, "A100-SXM4-40GB: total_memory 40,536 MiB (published device listings)"),
    "b200": (182_631 * 2**20, "B200: total_memory 182,631-182,642 MiB (published torch device listings)"),
    "gb200": (189_471 * 2**20, "GB200: nvidia-smi memory.total 189,471 MiB (published nvidia-smi listings, "
                               "drivers 580-590); torch's total_memory, not found for GB200, is 0.4-0.6% below "
                               "nvidia-smi's on H100 and B200"),
}


def device_capacity(gpu: GPU) -> tuple[float, str]:
    """(bytes a run can allocate on `gpu`, where the figure comes from): DEVICE_BYTES for a part of the
    device table at its listed capacity, else hbm_gb x 1e9 (the user's --hbm-gb, or a part with no
    reported figure)."""
    listed = GPUS.get(gpu.key)
    if gpu.key in DEVICE_BYTES and listed is not None and listed.hbm_gb == gpu.hbm_gb:
        value, source = DEVICE_BYTES[gpu.key]
        return float(value), source
    return gpu.hbm_gb * 1e9, f"{gpu.hbm_gb:g} GB x 1e9 (no CUDA-reported figure)"


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes per GPU on the most-loaded pipeline stage (`stage`)."""

    stage: str  # "first", "last" or "rank R" (pp = 1: "only"): the rank with the largest total
    params_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    transient_bytes: float
    buffers_bytes: float
    overhead_bytes: float
    total_bytes: float
    capacity_bytes: float
    inflight_micro_batches: int
    allocator_bytes: float = 0.0  # fragmentation, counted once: Training.allocator_slack x (acts + transient)
    usable_bytes: float = 0.0  # what the search admits: Training.memory_headroom x capacity (0: all of it)
    capacity_source: str = ""  # where capacity_bytes comes from (device_capacity)
    offloaded_bytes: float = 0.0  # activations held in host memory per GPU (Training.offload_activation_layers)

    @property
    def fits(self) -> bool:
        """Admitted by the search: within the usable memory (the headroom is the margin for the model's error;
        fragmentation is already in total_bytes)."""
        return self.total_bytes <= (self.usable_bytes or self.capacity_bytes)

    @property
    def fits_device(self) -> bool:
        """Within the device's whole memory (what a run that ran must satisfy)."""
        return self.total_bytes <= self.capacity_bytes

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self) | {"fits": self.fits, "fits_device": self.fits_device}
        d["total_gib"] = self.total_bytes / 2**30
        d["total_gb"] = self.total_bytes / 1e9
        return d


def loss_activation_bytes(model: ModelSpec, training: Training, *, seq_len: float, micro_batch: int,
                          tp: int) -> float:
    """The last stage's output layer and loss, held once (training.LOSS_LOGITS): "vocab-parallel" keeps
    the output layer's inputs and the fp32 logits, 4sbh(1 + V/h)/t (model.output_activation_bytes);
    "native" (F.cross_entropy(logits.float())) peaks at the loss with the bf16 logits, their fp32 copy and
    the fp32 log-softmax it saves, 10sbV/t, beside the same 4sbh/t; "fused" never forms the logits: 4sbh/t.
    (t: the vocabulary split of tensor parallelism, torchtitan's loss parallel.)"""
    s, b, h = float(seq_len), float(micro_batch), float(model.dims.hidden)
    if training.loss_logits == "native":
        return (4.0 * s * b * h + 10.0 * s * b * model.dims.vocab) / tp
    if training.loss_logits == "fused":
        return 4.0 * s * b * h / tp
    return output_activation_bytes(model, seq_len=seq_len, micro_batch=micro_batch, tp=tp)


def stage_layer_mix(model: ModelSpec, cfg: PlanConfig) -> tuple[tuple[int, int], tuple[int, int]]:
    """(dense layers, MoE layers) on one GPU of the first and of the last pipeline stage. A MoE model's
    first_dense layers sit on the first stage; the other stages hold MoE layers only."""
    layers = layers_per_stage(model.dims.n_layers, cfg)
    if model.moe is None:
        return (layers, 0), (layers, 0)
    if cfg.pp == 1:
        mix = (model.dims.n_layers - model.n_moe_layers, model.n_moe_layers)
        return mix, mix
    fd = min(model.moe.first_dense, layers)
    return (fd, layers - fd), (0, layers)


def stage_expert_params(model: ModelSpec, cfg: PlanConfig) -> tuple[float, float]:
    """Routed-expert parameters on one GPU of the first and of the last stage: E/ep whole experts per
    MoE layer (expert tensor parallel 1)."""
    if model.moe is None:
        return 0.0, 0.0
    per_layer = model.moe.n_experts // cfg.ep * model.expert_params
    (_, first), (_, last) = stage_layer_mix(model, cfg)
    return float(first * per_layer), float(last * per_layer)


def stage_params(model: ModelSpec, cfg: PlanConfig) -> tuple[float, float]:
    """Parameters held by one GPU of the first and of the last pipeline stage (routed experts included)."""
    dims = model.dims
    dense_layer = model.layer_matmul_params / cfg.tp + 2 * dims.hidden
    moe_layer = (model.moe_layer_dense_params - 2 * dims.hidden) / cfg.tp + 2 * dims.hidden
    e_first, e_last = stage_expert_params(model, cfg)
    (fd, fm), (ld, lm) = stage_layer_mix(model, cfg)
    first = fd * dense_layer + fm * moe_layer + e_first if model.moe is not None else fd * dense_layer
    last = ld * dense_layer + lm * moe_layer + e_last if model.moe is not None else ld * dense_layer
    emb = model.embedding_params / cfg.tp
    head = 0.0 if dims.tied_embeddings else emb
    if cfg.pp == 1:
        single = first + emb + head + dims.hidden
        return single, single
    return first + emb, last + emb + dims.hidden


def stage_terms(model: ModelSpec, cfg: PlanConfig, memo: dict[tuple[Any, ...], Any] | None = None) -> tuple[Any, ...]:
    """((first mix, last mix), (params first, last), (routed-expert params first, last)): stage_layer_mix,
    stage_params and stage_expert_params, shared through the search's memo (they depend on tp, pp, vpp
    and ep only)."""
    key = ("stage", cfg.tp, cfg.pp, cfg.vpp, cfg.ep)
    if memo is not None and key in memo:
        return cast(tuple[Any, ...], memo[key])
    terms = (stage_layer_mix(model, cfg), stage_params(model, cfg), stage_expert_params(model, cfg))
    if memo is not None:
        memo[key] = terms
    return terms


def state_bytes(params: float, cfg: PlanConfig, training: Training,
                group: int | None = None) -> tuple[float, float, float]:
    """(weights, gradients, optimizer) bytes for `params` parameters under the plan's ZeRO stage, sharded
    over `group` ranks (default: the plan's ZeRO group; routed experts: PlanConfig.expert_dp)."""
    master, states = OPTIMIZER_BYTES[training.optimizer]
    if training.offload_optimizer:
        master = states = 0
    g = training.grad_bytes
    d = cfg.shard_group() if group is None else group
    if cfg.zero == 0:
        return params * WEIGHT_BYTES, params * g, params * (master + states)
    if cfg.zero == 1:
        return params * WEIGHT_BYTES, params * g, params * (master + states) / d
    if cfg.zero == 2:
        return params * WEIGHT_BYTES, params * g / d, params * (master + states) / d
    if training.zero3_16bit_shard and master:
        return params * (master + WEIGHT_BYTES) / d, params * g / d, params * states / d
    return params * max(master, WEIGHT_BYTES) / d, params * g / d, params * states / d


#: DeepSpeed ZeRO-3's stage3_max_live_parameters default: gathered parameters stay resident up to this many
#: before the coordinator releases them (DeepSpeed config docs, "ZeRO optimizations": 1e9).
DS_MAX_LIVE_PARAMS = 1e9


def submodule_params(model: ModelSpec, tp: int, ep: int = 1) -> float:
    """Parameters of the largest module that owns weights directly, on one tensor-parallel rank: what
    DeepSpeed ZeRO-3 gathers at a time (it hooks every such module). Megatron-style blocks: the fused QKV
    projection, the output projection, the MLP's first linear (a gated MLP's gate and up fused, 2hf: the
    larger, Megatron-DeepSpeed's layout) and its second; the embedding; a MoE layer's E/ep routed experts,
    one grouped module per layer (Megatron-Core's TEGroupedMLP)."""
    h, f = model.dims.hidden, model.dims.ffn_hidden
    shapes: list[float] = [float(i * o) for i, o in model.attn_linear_shapes(tp)]
    shapes += [(2 if model.dims.gated_mlp else 1) * h * f / tp, h * f / tp, model.embedding_params / tp]
    if model.moe is not None:
        shapes.append(model.moe.n_experts // ep * model.expert_params)
    return float(max(shapes))


def v_shaped(cfg: PlanConfig) -> bool:
    """ZBV (zero_bubble with two chunks a rank, `wavefront train --pp-schedule zbv`): rank r holds model chunks
    r and 2 pp - 1 - r, a V, instead of r and pp + r."""
    return cfg.zero_bubble and cfg.vpp == 2


def output_rank(cfg: PlanConfig) -> int:
    """The pipeline rank that holds the output layer: the last, or rank 0 in a V (v_shaped)."""
    return 0 if v_shaped(cfg) else cfg.pp - 1


def pipeline_ranks(model: ModelSpec, cfg: PlanConfig,
                   memo: dict[tuple[Any, ...], Any] | None = None) -> list[tuple[Any, ...]]:
    """For each candidate rank of a pipeline (pipeline.candidate_ranks): (rank, dense layers per chunk,
    MoE layers per chunk, parameters, routed-expert parameters) on one GPU of it, the chunks laid out as
    pipeline.chunk_layers does (uneven: fewer layers on the first and last chunks), or as the V places them
    (v_shaped: both ends on rank 0)."""
    key = ("ranks", cfg.tp, cfg.pp, cfg.vpp, cfg.ep, v_shaped(cfg))
    if memo is not None and key in memo:
        cached: list[tuple[Any, ...]] = memo[key]
        return cached
    dims = model.dims
    layers = chunk_layers(dims.n_layers, cfg.pp, cfg.vpp)
    firsts = chunk_first_layer(dims.n_layers, cfg.pp, cfg.vpp)
    if v_shaped(cfg):  # model chunk g = k pp + r in the interleaved layout; the V puts 2 pp - 1 - r on rank r
        last = cfg.pp - 1
        layers = [[layers[r][0], layers[last - r][1]] for r in range(cfg.pp)]
        firsts = [[firsts[r][0], firsts[last - r][1]] for r in range(cfg.pp)]
    fd = model.moe.first_dense if model.moe is not None else dims.n_layers
    dense_layer = model.layer_matmul_params / cfg.tp + 2 * dims.hidden
    moe_layer = (model.moe_layer_dense_params - 2 * dims.hidden) / cfg.tp + 2 * dims.hidden if model.moe else 0.0
    experts = model.moe.n_experts // cfg.ep * model.expert_params if model.moe is not None else 0.0
    emb = model.embedding_params / cfg.tp
    out, last = [], output_rank(cfg)
    for r in candidate_ranks(layers):
        dense = [max(0, min(fd, a + n) - a) for a, n in zip(firsts[r], layers[r], strict=True)]
        moe = [n - d for n, d in zip(layers[r], dense, strict=True)]
        params = sum(dense) * dense_layer + sum(moe) * (moe_layer + experts)
        if r == 0:
            params += emb
        if r == last:
            params += emb + dims.hidden  # the output layer (Megatron keeps a tied copy) and the final norm
        out.append((r, dense, moe, float(params), float(sum(moe) * experts)))
    if memo is not None:
        memo[key] = out
    return out


def busiest_candidates(model: ModelSpec, cfg: PlanConfig,
                       memo: dict[tuple[Any, ...], Any] | None = None) -> list[tuple[int, int, int, float, float]]:
    """(rank, dense layers, MoE layers, parameters, routed-expert parameters) on one GPU of each rank that
    can be the slowest of a pipeline: pipeline_ranks' candidates with their chunks summed (time.step_time
    takes the slowest; the last rank adds the output layer), the one stage when pp = 1."""
    if cfg.pp == 1:
        ((fd, fm), _), (params, _), (experts, _) = stage_terms(model, cfg, memo)
        return [(0, fd, fm, params, experts)]
    return [(r, sum(dense), sum(moe), params, experts)
            for r, dense, moe, params, experts in pipeline_ranks(model, cfg, memo)]


def zb_state_bytes(model: ModelSpec, cfg: PlanConfig, training: Training, routed_rows: float = 0.0) -> float:
    """What one layer keeps for one micro-batch between ZB-H1's input-gradient pass and its deferred
    weight-gradient pass: each linear's input X and output gradient dY, the operands of dW = X^T dY, in bf16,
    over the rank's local tokens b s / cp; a hidden-wide X or dY (the residual stream's side of a linear) is
    kept sequence-sharded under sequence parallelism (/ tp, gathered again for the GEMM, as Megatron keeps
    the inputs of its column-parallel linears), the other side is the rank's tensor-parallel slice. For
    Llama 3 70B at TP 8 with SP that is about the whole layer's activation (34 sbh / t), Qi et al.'s
    Table 1 (W keeps 32 sbh of B's 34 sbh). routed_rows > 0: a MoE layer, its experts' rows instead of the
    dense MLP (the shared experts' MLP kept). The input-gradient pass frees the rest of the activations."""
    tokens = cfg.micro_batch * training.seq_len / cfg.cp
    h = model.dims.hidden
    shapes = list(model.attn_linear_shapes(cfg.tp))
    ffn = model.dims.ffn_hidden if model.moe is None or not routed_rows else model.moe.shared_ffn
    if ffn:
        shapes += [(h, (2 if model.dims.gated_mlp else 1) * ffn // cfg.tp), (ffn // cfg.tp, h)]
    shard = cfg.tp if cfg.sp else 1
    state = tokens * sum((i / shard if i == h else i) + (o / shard if o == h else o) for i, o in shapes)
    if routed_rows and model.moe is not None:
        fe = model.moe.expert_ffn
        state += routed_rows * ((h + 2 * fe) + (fe + h))
    return WEIGHT_BYTES * state


def pipeline_candidates(model: ModelSpec, cfg: PlanConfig, m: int, per_layer: float, per_moe: float,
                        emb_act: float, out_act: float, memo: dict[tuple[Any, ...], Any] | None = None,
                        round_size: int = 0, zb_state: tuple[float, float] = (0.0, 0.0)) -> list[tuple[Any, ...]]:
    """(stage name, parameters, routed-expert parameters, peak activation bytes, micro-batches in flight
    on its fullest chunk) for each candidate rank of a pipeline: the schedule's live sets
    (pipeline.schedule_live_counts) weighed by each chunk's layers, the embedding output on rank 0's first
    chunk per live micro-batch and the output layer's inputs on the last rank; round_size: micro-batches
    per round of the interleaved schedule (Training.pp_round). ZB-H1 (cfg.zero_bubble): its order's live
    sets (pipeline.zb_h1_live), whole activations for the micro-batches between forward and input-gradient
    pass and zb_state (dense, MoE layer: zb_state_bytes) per layer for those awaiting their deferred
    weight-gradient pass, up to r on rank r (the output layer's weight gradient taken as not deferred); ZBV
    (zero_bubble with vpp 2, `wavefront train`): the same per chunk from its order (pipeline.zbv_live)."""
    out, last = [], output_rank(cfg)
    for r, dense, moe, params, experts in pipeline_ranks(model, cfg, memo):
        chunk_bytes = [d * per_layer + e * per_moe for d, e in zip(dense, moe, strict=True)]
        if r == 0:
            chunk_bytes[0] += emb_act
        if cfg.zero_bubble and cfg.vpp <= 2:  # ZB-H1, ZBV: whole activations, then what waits for W, per chunk
            n = cfg.vpp
            waits = [d * zb_state[0] + e * zb_state[1] for d, e in zip(dense, moe, strict=True)]
            live = zb_h1_live(cfg.pp, m, r) if n == 1 else zbv_live(cfg.pp, m, r)
            acts, inflight = max((sum(map(mul, row[:n], chunk_bytes)) + sum(map(mul, row[n:], waits)), max(row[:n]))
                                 for row in live)
        else:  # the interleaved zero-bubble schedule (vpp > 2, `wavefront train`) counts as 1F1B, not run
            vpp = 1 if cfg.zero_bubble else cfg.vpp
            acts, inflight = peak(schedule_live_counts(cfg.pp, vpp, m, r, memo, round_size if vpp > 1 else 0),
                                  chunk_bytes)
        if r == last:
            acts += out_act
        out.append(("first" if r == 0 else "last" if r == cfg.pp - 1 else f"rank {r}", params, experts, acts,
                     inflight))
    return out


def memory_breakdown(model: ModelSpec, cfg: PlanConfig, training: Training, cluster: Cluster,
                     memo: dict[tuple[Any, ...], Any] | None = None) -> MemoryBreakdown:
    """Bytes per GPU (module docstring); `memo` shares per-layer activation terms between plans."""
    dims = model.dims
    s_local = training.seq_len / cfg.cp
    b = cfg.micro_batch
    m = n_micro_batches(cfg, training.global_batch_seqs)
    layers = layers_per_stage(dims.n_layers, cfg)
    act_kw = activation_kwargs(model, cfg, training)
    key = ("act", cfg.tp, cfg.sp, cfg.cp, cfg.micro_batch, cfg.recompute, training.op_recompute_mm,
           training.recompute_modules)
    if memo is not None and key in memo:
        per_layer, full = memo[key]
    else:
        per_layer = layer_activation_bytes(model, recompute=cfg.recompute, **act_kw)
        full = layer_activation_bytes(model, recompute="none", **act_kw) if cfg.recompute != "none" else per_layer
        if memo is not None:
            memo[key] = (per_layer, full)
    per_moe, full_moe = per_layer, full
    if model.moe is not None:
        key = ("act-moe",) + key[1:]
        if memo is not None and key in memo:
            per_moe, full_moe = memo[key]
        else:
            rows = (b * s_local / (cfg.tp if cfg.sp else 1)) * model.moe.top_k * training.moe_rows_factor
            per_moe = layer_activation_bytes(model, recompute=cfg.recompute, routed_rows=rows, **act_kw)
            full_moe = layer_activation_bytes(model, recompute="none", routed_rows=rows, **act_kw)
            if memo is not None:
                memo[key] = (per_moe, full_moe)
    ((fd, fm), _), (p_first, _), (e_first, _) = stage_terms(model, cfg, memo)
    stage_first = fd * per_layer + fm * per_moe if model.moe is not None else layers * per_layer

    emb_act = embedding_activation_bytes(model, seq_len=s_local, micro_batch=b, tp=cfg.tp, sp=cfg.sp)
    out_act = loss_activation_bytes(model, training, seq_len=s_local, micro_batch=b, tp=cfg.tp)
    # (stage name, parameters, routed-expert parameters, activations, micro-batches in flight)
    candidates: list[tuple[str, float, float, float, int]] = []
    offloaded = 0.0
    if cfg.pp == 1:
        offloaded = stage_first * offload_fraction(model, training)
        candidates.append(("only", p_first, e_first, stage_first - offloaded + emb_act + out_act, 1))
    else:
        pkey = ("pipeline", cfg.tp, cfg.sp, cfg.cp, cfg.pp, cfg.vpp, cfg.zero_bubble, b, cfg.recompute, m, cfg.ep,
                training.loss_logits, training.op_recompute_mm, training.pp_round, training.recompute_modules)
        if memo is not None and pkey in memo:
            candidates = memo[pkey]
        else:
            zb_state = (0.0, 0.0)
            if cfg.zero_bubble:
                rows = (b * s_local / (cfg.tp if cfg.sp else 1)) * (model.moe.top_k * training.moe_rows_factor
                                                                     if model.moe is not None else 0.0)
                zb_state = (zb_state_bytes(model, cfg, training), zb_state_bytes(model, cfg, training, rows))
            candidates = pipeline_candidates(model, cfg, m, per_layer, per_moe, emb_act, out_act, memo,
                                             training.pp_round, zb_state)
            if memo is not None:
                memo[pkey] = candidates

    working = 0.0
    if cfg.recompute != "none":
        kept = per_layer if cfg.recompute in ("selective", "op") else 0.0
        working = max(0.0, full - kept)
        if model.moe is not None:
            working = max(working, full_moe - (per_moe if cfg.recompute in ("selective", "op") else 0.0))

    g = training.grad_bytes
    unit_params = max(model.layer_params, model.embedding_params) / cfg.tp
    if model.moe is not None:
        unit_params = max(unit_params, model.moe_layer_dense_params / cfg.tp
                          + model.moe.n_experts // cfg.ep * model.expert_params)
    if cfg.zero == 3:
        held = max(c[1] for c in candidates)
        if training.zero3_unit == "sub-module":
            unit = submodule_params(model, cfg.tp, cfg.ep)
            transient_states = max(2 * unit, min(DS_MAX_LIVE_PARAMS, held)) * WEIGHT_BYTES + unit * g
        else:
            transient_states = unit_params * (2 * WEIGHT_BYTES + g)
        buffers = 0.0
        if training.fsdp_gather == "no-reshard":
            transient_states += held * WEIGHT_BYTES
        elif training.fsdp_gather == "step":
            transient_states += held * (WEIGHT_BYTES + g)
    else:
        transient_states = 0.0
        buffers = 2 * training.bucket_mib * 2**20 if cfg.dp * cfg.cp > 1 else 0.0
    overhead = training.framework_overhead_gb * 1e9
    capacity, capacity_source = device_capacity(cluster.gpu)

    transient = working + transient_states
    best: tuple[Any, ...] | None = None
    for stage, params, experts, acts, inflight in candidates:
        w, gr, opt = state_bytes(params - experts, cfg, training)
        if experts:
            ew, eg, eo = state_bytes(experts, cfg, training, cfg.expert_dp)
            w, gr, opt = w + ew, gr + eg, opt + eo
        slack = training.allocator_slack * (acts + transient)
        total = w + gr + opt + acts + transient + slack + buffers + overhead
        if best is None or total > best[0]:
            best = (total, stage, acts, w, gr, opt, slack, inflight)
    assert best is not None  # candidates is never empty
    total, stage, acts, w, gr, opt, slack, inflight = best
    return MemoryBreakdown(stage, w, gr, opt, acts, transient, buffers, overhead, total, capacity, inflight, slack,
                           capacity * training.memory_headroom, capacity_source, offloaded)


def activation_kwargs(model: ModelSpec, cfg: PlanConfig, training: Training) -> dict[str, Any]:
    """The plan's arguments to model.layer_activation_bytes besides `recompute` (and a MoE layer's
    routed_rows): what memory_breakdown keeps per layer and time.activation_offload_exposed_s copies."""
    return dict(seq_len=training.seq_len / cfg.cp, micro_batch=cfg.micro_batch, tp=cfg.tp, sp=cfg.sp,
                kv_len=training.seq_len, fp8=training.precision == "fp8",
                op_saved_mm=op_policy_fractions(model, training.op_recompute_mm, tp=cfg.tp, sp=cfg.sp)[1],
                modules=training.recompute_modules)


def offloaded_layers(model: ModelSpec, training: Training) -> int:
    """Layers whose activations are offloaded (Training.offload_activation_layers), at most all but one
    (parallel.structural_problems refuses more)."""
    return max(0, min(training.offload_activation_layers, model.dims.n_layers - 1))


def offload_fraction(model: ModelSpec, training: Training) -> float:
    """Share of a pp = 1 model's layer activations that stays in host memory under activation offloading
    (k = offloaded_layers of n): each offloaded layer's activations leave the GPU once its forward is done,
    copied while the next layer runs, and come back one layer ahead of its backward, so one of them is on
    the GPU at a time: (k - 1) / n. Layers are taken as alike (a MoE model's dense first layers are counted
    as MoE layers)."""
    return max(0, offloaded_layers(model, training) - 1) / model.dims.n_layers
