"""Memory formulas against hand-computed values: Korthikanti et al. 2022 activations, ZeRO states,
pipeline in-flight micro-batches, and feasibility."""

from __future__ import annotations

from pathlib import Path

import pytest

from wavefront.shapes import ModelDims, get_model
from wavefront.workbench.hardware import get_gpu
from wavefront.workbench.planner import PlanConfig, Training, make_cluster, memory_breakdown
from wavefront.workbench.planner.memory import (
    DEVICE_BYTES,
    DS_MAX_LIVE_PARAMS,
    device_capacity,
    loss_activation_bytes,
    state_bytes,
    submodule_params,
)
from wavefront.workbench.planner.model import ModelSpec, layer_activation_bytes, output_activation_bytes
from wavefront.workbench.planner.validation import load_table, predict_row

PUBLISHED = Path(__file__).parents[2] / "data" / "published"

GIB = 2**30
GPT3 = ModelSpec(get_model("megatron-gpt-175b"), attention="materialized", dropout=True)
S, B, H, A, T = 2048, 1, 12288, 96, 8


def _act(tp=1, sp=False, recompute="none"):
    return layer_activation_bytes(GPT3, seq_len=S, micro_batch=B, tp=tp, sp=sp, recompute=recompute)


def test_korthikanti_per_layer_terms_for_gpt3():
    sbh = S * B * H
    # Eq. 1: no parallelism 34sbh + 5as^2b
    assert _act() == 34 * sbh + 5 * A * S * S * B
    # Eq. 2: tensor parallel, no SP: sbh(10 + 24/t + 5as/(ht))
    assert _act(tp=T) == pytest.approx(sbh * (10 + 24 / T + 5 * A * S / (H * T)))
    # Eq. 4: TP + SP
    assert _act(tp=T, sp=True) == pytest.approx(sbh * (34 / T + 5 * A * S / (H * T)))
    # Eq. 6: TP + SP + selective recomputation
    assert _act(tp=T, sp=True, recompute="selective") == pytest.approx(34 * sbh / T)
    # TP without SP + selective: sbh(10 + 24/t)
    assert _act(tp=T, recompute="selective") == pytest.approx(sbh * (10 + 24 / T))
    # full recomputation keeps the layer input, /t with SP
    assert _act(tp=T, recompute="full") == 2 * sbh
    assert _act(tp=T, sp=True, recompute="full") == 2 * sbh / T


def test_worked_example_gib_values():
    # training-math.md: GPT-3 175B, s=2048, b=1, t=8: 2.67, 0.54, 0.33, 0.10, 0.047 GiB per layer
    assert _act() / GIB == pytest.approx(2.67, abs=0.005)
    assert _act(tp=T) / GIB == pytest.approx(0.54, abs=0.005)
    assert _act(tp=T, sp=True) / GIB == pytest.approx(0.33, abs=0.005)
    assert _act(tp=T, sp=True, recompute="selective") / GIB == pytest.approx(0.10, abs=0.005)
    assert _act(recompute="full") / GIB == pytest.approx(0.047, abs=0.0005)


def test_gqa_swiglu_no_dropout_by_hand():
    # Llama-like: h=4096, 32 heads of 128, 8 KV heads (kv_dim 1024), SwiGLU f=14336, no dropout, flash
    m = ModelSpec(get_model("llama3-8b"))
    s, b, h, kv, f, a = 8192, 1, 4096, 1024, 14336, 32
    by_hand = (4 + 2 + 2) * s * b * h + 4 * s * b * h + 4 * s * b * kv + 6 * s * b * f + 4 * a * s * b
    assert layer_activation_bytes(m, seq_len=s, micro_batch=b, tp=1, sp=False, recompute="none") == by_hand
    # flash attention keeps no s^2 tensor, so selective recomputation saves nothing more
    assert layer_activation_bytes(m, seq_len=s, micro_batch=b, tp=1, sp=False, recompute="selective") == by_hand
    # TP 4 without SP: norms and block inputs (8sbh) replicated, the rest split
    tp4 = layer_activation_bytes(m, seq_len=s, micro_batch=b, tp=4, sp=False, recompute="none")
    assert tp4 == 8 * s * b * h + (by_hand - 8 * s * b * h) / 4


def test_eager_kernels_add_norm_copies_and_the_gated_product():
    # Hugging Face eager: +4sbh per RMSNorm (fp32 input and normalized copy instead of the input) and
    # +2sbf for a gated MLP; replicated / split under TP like the terms they extend.
    dims = get_model("llama3-8b")
    s, b, h, f = 8192, 1, 4096, 14336
    fused = layer_activation_bytes(ModelSpec(dims), seq_len=s, micro_batch=b, tp=1, sp=False, recompute="none")
    eager = layer_activation_bytes(ModelSpec(dims, kernels="eager"), seq_len=s, micro_batch=b, tp=1, sp=False,
                                   recompute="none")
    assert eager - fused == 8 * s * b * h + 2 * s * b * f
    tp4 = layer_activation_bytes(ModelSpec(dims, kernels="eager"), seq_len=s, micro_batch=b, tp=4, sp=False,
                                 recompute="none")
    tp4_fused = layer_activation_bytes(ModelSpec(dims), seq_len=s, micro_batch=b, tp=4, sp=False, recompute="none")
    assert tp4 - tp4_fused == 8 * s * b * h + 2 * s * b * f / 4
    # a plain GELU MLP keeps the same in both; full recomputation keeps only the layer input
    gpt = get_model("megatron-gpt-175b")
    kw = dict(seq_len=2048, micro_batch=1, tp=1, sp=False, recompute="none")
    assert (layer_activation_bytes(ModelSpec(gpt, kernels="eager"), **kw)
            - layer_activation_bytes(ModelSpec(gpt), **kw)) == 8 * 2048 * 12288
    full = dict(kw, recompute="full")
    assert layer_activation_bytes(ModelSpec(dims, kernels="eager"), **full) == layer_activation_bytes(ModelSpec(dims),
                                                                                                       **full)
    with pytest.raises(ValueError, match="kernels must be one of"):
        ModelSpec(dims, kernels="triton")


def test_output_layer_term():
    assert output_activation_bytes(GPT3, seq_len=S, micro_batch=B, tp=T) == 4 * S * B * H * (1 + 51200 / H) / T


@pytest.mark.parametrize(("zero", "d", "per_param"), [
    (0, 8, 2 + 4 + 12),       # DDP / Megatron non-distributed optimizer: 18 B
    (1, 8, 2 + 4 + 12 / 8),   # distributed optimizer: 6 + 12/d
    (2, 8, 2 + 16 / 8),       # + gradients sharded: 2 + 16/d with fp32 grads
    (3, 8, 16 / 8),           # FSDP: 16/d
])
def test_zero_bytes_per_param(zero, d, per_param):
    cfg = PlanConfig(dp=d, zero=zero)
    w, g, o = state_bytes(1e9, cfg, Training(global_batch_tokens=8192, seq_len=1024))
    assert (w + g + o) / 1e9 == pytest.approx(per_param)


def test_training_math_worked_example_llama70b_distributed_optimizer():
    # TP4 PP8 DP2, distributed optimizer: (6 + 12/2) x 70.6e9 / 32 = 26.5 GB of model state per GPU
    cfg = PlanConfig(tp=4, pp=8, dp=2, zero=1)
    w, g, o = state_bytes(70.6e9 / 32, cfg, Training(global_batch_tokens=8192, seq_len=8192))
    assert (w + g + o) / 1e9 == pytest.approx(26.5, abs=0.05)


def test_pipeline_inflight_and_interleaving():
    model = ModelSpec(get_model("llama3-70b"))
    training = Training(global_batch_tokens=64 * 4096, seq_len=4096)
    cluster = make_cluster("64xh100")
    base = dict(tp=8, sp=True, dp=2, zero=1, recompute="selective", micro_batch=1)
    one = memory_breakdown(model, PlanConfig(pp=4, **base), training, cluster)
    per_layer = layer_activation_bytes(model, seq_len=4096, micro_batch=1, tp=8, sp=True, recompute="selective")
    # first stage: pp micro-batches in flight of its L/pp layers = L layers' worth (Korthikanti Sec. 4.2.3)
    assert one.stage == "first" and one.inflight_micro_batches == 4
    emb = 8 * 4096  # int64 token ids per micro-batch, no dropout
    assert one.activations_bytes == pytest.approx(80 * per_layer + 4 * emb)
    inter = memory_breakdown(model, PlanConfig(pp=4, vpp=2, **base), training, cluster)
    # 32 micro-batches: rank 0 warms up 2 (pp-1) + (vpp-1) pp = 10 chunk forwards and holds 11 chunks of
    # 10 layers at its peak (Korthikanti's 1 + (pp-1)/(pp vpp)); in the steady state 8 of them are chunk 0,
    # whose micro-batches keep the embedding's output
    assert inter.activations_bytes == pytest.approx(80 * per_layer * (1 + 3 / 8) + 8 * emb)
    # fewer micro-batches than stages: only m are in flight
    small = Training(global_batch_tokens=4 * 4096, seq_len=4096)
    few = memory_breakdown(model, PlanConfig(pp=4, **base), small, cluster)
    assert few.inflight_micro_batches == 2


def test_memory_total_adds_up_and_feasibility():
    model = ModelSpec(get_model("llama3-70b"))
    training = Training(global_batch_tokens=1024 * 8192, seq_len=8192)
    cluster = make_cluster("8xh100")
    mem = memory_breakdown(model, PlanConfig(dp=8, zero=0), training, cluster)
    parts = (mem.params_bytes + mem.grads_bytes + mem.optimizer_bytes + mem.activations_bytes + mem.transient_bytes
             + mem.buffers_bytes + mem.overhead_bytes + mem.allocator_bytes)
    assert mem.total_bytes == pytest.approx(parts)
    # the allocator headroom is an explicit, documented term: 5% of activations and transients
    assert mem.allocator_bytes == pytest.approx(0.05 * (mem.activations_bytes + mem.transient_bytes))
    assert not mem.fits and mem.capacity_bytes == 81_082 * 2**20  # 70B replicated with Adam: > 1 TB per GPU
    sharded = memory_breakdown(model, PlanConfig(tp=8, sp=True, pp=1, dp=1, zero=0, recompute="full"),
                               Training(global_batch_tokens=8192, seq_len=8192), cluster)
    # matmul weights and both vocabulary tables split 8 ways; norm weights replicated; 2 B each
    per_gpu = 80 * (model.layer_matmul_params / 8 + 2 * 8192) + 2 * 128256 * 8192 / 8 + 8192
    assert sharded.params_bytes == pytest.approx(2 * per_gpu)


def test_tied_embeddings_last_stage_keeps_a_copy():
    dims = ModelDims("tiny", 256, 1024, 4, 4, 4, 64, 1000, 128, gated_mlp=False, tied_embeddings=True)
    model = ModelSpec(dims)
    from wavefront.workbench.planner.memory import stage_params

    first, last = stage_params(model, PlanConfig(pp=2, dp=1))
    body = 2 * (model.layer_matmul_params + 2 * 256)
    assert first == body + 1000 * 256 and last == body + 1000 * 256 + 256
    single, _ = stage_params(model, PlanConfig(pp=1))
    assert single == 2 * body + 1000 * 256 + 256  # tied: one table on a single stage


def test_device_capacity_is_what_cuda_reports_and_an_override_is_taken_as_given():
    """The H100's "80 GB" is 81,082 MiB to CUDA (85.0e9 B): the fit checks use that; a part without a
    reported figure, and --hbm-gb, are GB x 1e9."""
    assert device_capacity(get_gpu("h100"))[0] == 81_082 * 2**20 == pytest.approx(85.02e9, rel=1e-3)
    assert all(value > get_gpu(key).hbm_gb * 1e9 for key, (value, _) in DEVICE_BYTES.items())
    assert device_capacity(get_gpu("mi300x"))[0] == 192e9
    assert make_cluster("8xh100", hbm_gb=96).gpu.hbm_gb == 96
    assert device_capacity(make_cluster("8xh100", hbm_gb=96).gpu)[0] == 96e9
    mem = memory_breakdown(ModelSpec(get_model("llama3-8b")), PlanConfig(dp=8, zero=3),
                           Training(global_batch_tokens=8 * 8192, seq_len=8192), make_cluster("8xh100"))
    assert mem.capacity_bytes == 81_082 * 2**20 and "81,082" in mem.capacity_source
    assert mem.usable_bytes == pytest.approx(0.9 * mem.capacity_bytes)


def test_loss_logits_per_stack():
    """Megatron's vocab-parallel loss keeps 4sbh(1 + V/h)/t; PyTorch's F.cross_entropy on logits cast to
    fp32 peaks at 4sbh/t + 10sbV/t (bf16 logits, fp32 copy, fp32 log-softmax); a fused LM-head loss keeps
    4sbh/t. The memory total moves by exactly the difference, on the last stage."""
    model = ModelSpec(get_model("llama3-8b"))
    s, b, h, v = 8192, 2, 4096, 128256
    train = {k: Training(global_batch_tokens=16 * 8192, seq_len=8192, loss_logits=k)
             for k in ("vocab-parallel", "native", "fused")}
    got = {k: loss_activation_bytes(model, t, seq_len=s, micro_batch=b, tp=2) for k, t in train.items()}
    assert got["vocab-parallel"] == output_activation_bytes(model, seq_len=s, micro_batch=b, tp=2)
    assert got["native"] == pytest.approx((4 * s * b * h + 10 * s * b * v) / 2)
    assert got["fused"] == pytest.approx(4 * s * b * h / 2)
    cfg, cluster = PlanConfig(dp=8, zero=3, micro_batch=2), make_cluster("8xh100")
    totals = {k: memory_breakdown(model, cfg, t, cluster) for k, t in train.items()}
    native, vp = totals["native"], totals["vocab-parallel"]
    gap = (got["native"] - got["vocab-parallel"]) * 2  # tp 1 in the plan
    assert native.activations_bytes - vp.activations_bytes == pytest.approx(gap)
    with pytest.raises(ValueError, match="loss_logits must be one of"):
        Training(global_batch_tokens=8192, seq_len=8192, loss_logits="chunked")


def test_deepspeed_zero3_gathers_one_sub_module_not_a_layer():
    """DeepSpeed ZeRO-3 (Training.zero3_unit "sub-module") gathers per module that owns weights: for the
    530B GPT of Narayanan et al. the largest is the MLP's first linear (h x 4h = 1.68e9 parameters), of
    which two are gathered (current + next, above stage3_max_live_parameters' 1e9) and one's gradient is
    unsharded; FSDP2's unit is the whole layer (5.0e9 parameters)."""
    gpt530 = ModelSpec(get_model("megatron-gpt-529.6b"), attention="materialized", dropout=True)
    h = gpt530.dims.hidden
    assert submodule_params(gpt530, 1) == 4 * h * h == gpt530.dims.ffn_hidden * h
    assert submodule_params(gpt530, 8) == 4 * h * h / 8
    cfg = PlanConfig(tp=1, pp=1, dp=640, zero=3, recompute="full", micro_batch=4)
    cluster = make_cluster("640xa100")
    base = dict(global_batch_tokens=2560 * 2048, seq_len=2048, grad_bytes=4)
    layer = memory_breakdown(gpt530, cfg, Training(**base), cluster)
    sub = memory_breakdown(gpt530, cfg, Training(**base, zero3_unit="sub-module"), cluster)
    u = 4 * h * h
    working = layer.transient_bytes - gpt530.layer_params * (2 * 2 + 4)  # the rebuilt layer: unchanged
    assert sub.transient_bytes == pytest.approx(working + 2 * u * 2 + u * 4)
    assert sub.transient_bytes < layer.transient_bytes - 25e9
    # a smaller model's sub-modules (its embedding: 0.21e9) stay resident up to 1e9 parameters
    # (stage3_max_live_parameters)
    small = ModelSpec(get_model("megatron-gpt-7.5b"))
    assert 2 * submodule_params(small, 1) < DS_MAX_LIVE_PARAMS < small.total_params
    s_cfg = PlanConfig(tp=1, pp=1, dp=8, zero=3, recompute="none", micro_batch=1)
    s_mem = memory_breakdown(small, s_cfg, Training(global_batch_tokens=8 * 2048, seq_len=2048,
                                                    zero3_unit="sub-module"), make_cluster("8xh100"))
    assert s_mem.transient_bytes == pytest.approx(DS_MAX_LIVE_PARAMS * 2 + submodule_params(small, 1) * 4)
    with pytest.raises(ValueError, match="zero3_unit"):
        Training(global_batch_tokens=8192, seq_len=8192, zero3_unit="module")


def test_bf16_gradient_buffer_halves_the_distributed_optimizers_gradients():
    """Megatron-Core keeps an unsharded main-gradient buffer beside the distributed optimizer: fp32 by default,
    bf16 when the run reduces in bf16 (grad_reduce_in_fp32=False; NeMo's grad_sync_dtype: bf16). Nemotron-4
    340B in NeMo 24.07's configuration (TP8 PP8 v12, dp 2) fits its H100 only with the bf16 buffer its
    config sets: 81.6 of 85.0 GB (93.1 with fp32)."""
    doc = load_table(PUBLISHED / "validation" / "nemo_2407_h100_fp8.json")
    row = next(r for r in doc["rows"] if r["id"].startswith("nemotron4-340b"))
    assert row["grad_bytes"] == 2
    bf16 = predict_row(doc, row).memory
    fp32 = predict_row(doc, row | {"grad_bytes": 4}).memory
    assert bf16.grads_bytes == pytest.approx(bf16.params_bytes)  # 2 B per parameter, like the weights
    assert fp32.grads_bytes == pytest.approx(2 * bf16.grads_bytes)
    assert bf16.fits_device and not fp32.fits_device
