"""Attention forward for sm_90 written in Gluon: the wgmma wait depth, the TMA ring and the barriers are
spelled out in the source instead of left to Triton's pipeliner.

Same math and contract as ``kernels/attention_fwd.py``'s forward: per (batch, head), with c = scale * log2(e),

    S'_j = Q K_j^T                          (unscaled, fp32 accumulators in registers)
    x    = c S'_j, masked to -inf where the key is past the sequence or after the query (causal)
    m'   = max(m, rowmax x),  p = exp2(x - m'),  alpha = exp2(m - m')
    l    = alpha l + rowsum p,  O = alpha O + p V_j,  m = m'
    O    = O / l,  lse2 = m + log2 l        (lse2: [B, H, S] fp32, base 2, as ops.attention saves it)

Why a second kernel. Triton 3.9 waits for every wgmma whose result a non-MMA op reads (``wgmma.wait_group
0`` after QK^T), so in the Triton kernel the softmax never runs beside a matrix product. Here the key loop
is software-pipelined by hand; iteration j, entering with S_j complete and nothing in flight:

    1. issue S_{j+1} = Q K_{j+1}^T (async)                   in flight: S_{j+1}
    2. softmax of block j (exp2 with the scale folded in)    runs beside S_{j+1}
    3. rescale O by alpha, issue O += P_j V_j (P from registers)   in flight: S_{j+1}, PV_j
    4. wait num_outstanding=1: S_{j+1} done; one block-wide barrier (both warpgroups are past their reads
       of K_{j+1}'s stage), TMA refill of that stage with K_{j+1+NUM_STAGES}, issued while PV_j runs
    5. wait num_outstanding=0: PV_j done; barrier, TMA refill of V_j's stage with V_{j+NUM_STAGES}

Before the loop: Q and the ring's first fill (K/V blocks 0..NUM_STAGES-1), S_0 with a wait 0, then K_0's
stage refilled with K_{NUM_STAGES} (the refill rule of step 4 for S_0; without it that block is never
loaded and the loop's wait on it never returns, which is how the first version of this kernel hung).

ptxas (Triton 3.9's, CUDA 13.4) lays the QK^T wgmmas of step 1 between the 66 exp2s of step 2 in the SASS.
The schedule with no wait 0 in the loop (PV_j left in flight across the back edge, retired by step 4's wait
of the next iteration, so O's rescale reads it after a wait of depth 1) compiles, but ptxas then serializes
every wgmma of the kernel (C7514: "non wgmma instructions reading accumulator registers of a wgmma between
start and end of the pipeline stage"): it does not follow wgmma groups across a loop's back edge, so a
depth-1 wait whose retired group came from the previous iteration does not count as a wait for it
(docs/kernels-attention-gemm.md). The last key block is peeled: it is the only one that can need a mask
(BLOCK_M == BLOCK_N, so a causal query tile has exactly one diagonal block, and a ragged sequence end falls
in the last block), so the loop runs without a compare or a select.

Data movement: one TMA tensor descriptor per (batch, head) sequence for Q, K, V and O (bounds = the
sequence: rows past it arrive as zeros and the O store is clipped). Q lands in shared memory once; K and V
stream through rings of NUM_STAGES buffers, each buffer with its own mbarrier (expect-tx bytes, phase
parity per use). O goes out through Q's buffer (Q is dead after the last QK^T) by a TMA store. The ring
protocol (every wait satisfied by exactly one copy of the right phase, no stage refilled while a wgmma may
read it, every copy consumed) is checked on an executable model built from this file's schedule helpers
(workbench/static/pipeline_models.py), over every sequence length, ring depth and causal flag.

Tiles: BLOCK_M = BLOCK_N = 128, 8 warps (two warpgroups of 64 query rows; wgmma m64nNk16 with N = 128 for
QK^T and N = head_dim for PV). Shared memory at head_dim 128: Q 32 KiB + 2 x (K 32 + V 32) KiB = 160 KiB.
Registers: S_j (64 fp32), S_{j+1} (64), O (head_dim / 2), P in 16-bit (32) per thread at d128.

Traffic and FLOPs are the Triton kernel's (kernels/attention_fwd.py): compute bound at the bench shapes.

Status: compiled ahead of time for sm_90 and read (``wavefront inspect``); it has not run on a GPU, so its
numerics are unverified and nothing dispatches to it by default. ``WAVEFRONT_ATTENTION_GLUON=1`` asks for
it; :func:`check_target` refuses every target but sm_90. Dense inputs only (no cu_seqlens), head_dim 64 or
128, bf16/fp16, GQA/MQA.
"""

from __future__ import annotations

import os

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from wavefront import runtime
from wavefront.kernels._launch import ensure_descriptor_allocator, launch

LOG2E = 1.4426950408889634
#: The environment switch that routes ops.attention's forward here (sm_90 only; off by default).
ENV_FLAG = "WAVEFRONT_ATTENTION_GLUON"
TARGET = "sm_90"
HEAD_DIMS = (64, 128)
DTYPES = (torch.bfloat16, torch.float16)
BLOCK = 128  # BLOCK_M == BLOCK_N: the diagonal of a causal query tile is one key block
NUM_WARPS = 8  # two warpgroups of 64 query rows
#: K/V ring depth per head dim: 2 at d128 (160 KiB of the 227 KiB; 3 would need 224 KiB), 3 at d64 (112 KiB).
NUM_STAGES = {64: 3, 128: 2}


@gluon.jit
def _softmax_step(s, m_i, l_i, qk_scale, offs_m, start_n, seqlen, s_layout: gl.constexpr,
                  BLOCK_N: gl.constexpr, MASKED: gl.constexpr, IS_CAUSAL: gl.constexpr):
    """p, alpha and the new running max and sum for one key block. Every query row sees key 0 in its first
    block, so m is finite after block 0 and exp2(-inf - m) is a clean 0 (masked keys, the initial m)."""
    x = s * qk_scale
    if MASKED:
        offs_n = start_n + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        valid = gl.expand_dims(offs_n, 0) < seqlen
        if IS_CAUSAL:
            valid = valid & (gl.expand_dims(offs_m, 1) >= gl.expand_dims(offs_n, 0))
        x = gl.where(valid, x, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(x, axis=1))
    p = gl.exp2(x - gl.expand_dims(m_new, 1))
    alpha = gl.exp2(m_i - m_new)
    l_i = l_i * alpha + gl.sum(p, axis=1)
    return p, alpha, m_new, l_i


@gluon.jit
def _rescale(acc, alpha, o_layout: gl.constexpr):
    return acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o_layout)), 1)


# The schedule. Every decision of the key loop's pipeline (how many key blocks, which block a copy brings,
# which ring stage it lands in, which mbarrier phase a wait is for) is one of these integer functions. The
# kernel calls them; the pipeline model (workbench/static/pipeline_models.py) runs their Python bodies
# (`.fn`) on ints over every sequence length, head_dim, ring depth and causal flag and checks the protocol
# (workbench/static/pipeline_check.py), so a change here is checked before any GPU sees it.


@gluon.jit
def _n_key_blocks(m_block, seqlen, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, IS_CAUSAL: gl.constexpr):
    """Key blocks [0, n) that query tile m_block reads: up to its diagonal when causal."""
    hi = seqlen
    if IS_CAUSAL:
        hi = min((m_block + 1) * BLOCK_M, seqlen)
    return (hi + BLOCK_N - 1) // BLOCK_N


@gluon.jit
def _kv_stage(block, NUM_STAGES: gl.constexpr):
    """The ring stage that key/value block `block` lands in."""
    return block % NUM_STAGES


@gluon.jit
def _kv_phase(block, NUM_STAGES: gl.constexpr):
    """The mbarrier phase parity to wait for before reading `block`: its stage's barrier completes once per
    copy, and `block` is that stage's use block // NUM_STAGES (phases 0, 1, 2, ... by parity 0, 1, 0, ...)."""
    return (block // NUM_STAGES) & 1


@gluon.jit
def _kv_refill(freed, NUM_STAGES: gl.constexpr):
    """The block that refills the stage block `freed` held, once the wgmma reading `freed` has retired."""
    return freed + NUM_STAGES


@gluon.jit
def _load_kv(desc, bars, smem, block, n_blocks, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr):
    """TMA of key/value block `block` into its ring stage, signalling that stage's mbarrier; nothing past the
    last key block the tile reads."""
    stage = _kv_stage(block, NUM_STAGES)
    pred = block < n_blocks
    mbarrier.expect(bars.index(stage), desc.block_type.nbytes, pred=pred)
    tma.async_load(desc, [block * BLOCK_N, 0], bars.index(stage), smem.index(stage), pred=pred)


@gluon.jit
def _wait_kv(bars, block, NUM_STAGES: gl.constexpr):
    mbarrier.wait(bars.index(_kv_stage(block, NUM_STAGES)), _kv_phase(block, NUM_STAGES))


@gluon.jit
def _attn_fwd_sm90_gluon(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr,
    stride_qb, stride_qh, stride_qs, stride_kb, stride_kh, stride_ks, stride_vb, stride_vh, stride_vs,
    stride_ob, stride_oh, stride_os, stride_lb, stride_lh,
    n_heads, group_size, seqlen, n_m_blocks, qk_scale,
    HEAD_DIM: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, IS_CAUSAL: gl.constexpr,
    NUM_STAGES: gl.constexpr,
):
    gl.static_assert(BLOCK_M == BLOCK_N, "the peeled last block must hold the whole causal diagonal")
    dtype: gl.constexpr = q_ptr.dtype.element_ty
    num_warps: gl.constexpr = gl.num_warps()
    # wgmma accumulators: warps stacked along M (64 rows per warpgroup), one instruction spans the tile's N.
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_layout: gl.constexpr = gl.SliceLayout(1, s_layout)
    tile_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, HEAD_DIM], dtype)

    # Program -> (batch, head, query tile); causal grids start with the longest rows (the last tiles).
    pid = gl.program_id(0)
    bh = pid // n_m_blocks
    m_block = pid % n_m_blocks
    if IS_CAUSAL:
        m_block = n_m_blocks - 1 - m_block
    b = (bh // n_heads).to(gl.int64)
    h = (bh % n_heads).to(gl.int64)
    kvh = h // group_size
    start_m = m_block * BLOCK_M

    q_desc = tma.make_tensor_descriptor(q_ptr + b * stride_qb + h * stride_qh, [seqlen, HEAD_DIM], [stride_qs, 1],
                                        [BLOCK_M, HEAD_DIM], tile_layout)
    k_desc = tma.make_tensor_descriptor(k_ptr + b * stride_kb + kvh * stride_kh, [seqlen, HEAD_DIM], [stride_ks, 1],
                                        [BLOCK_N, HEAD_DIM], tile_layout)
    v_desc = tma.make_tensor_descriptor(v_ptr + b * stride_vb + kvh * stride_vh, [seqlen, HEAD_DIM], [stride_vs, 1],
                                        [BLOCK_N, HEAD_DIM], tile_layout)

    q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_DIM], tile_layout)
    k_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_N, HEAD_DIM], tile_layout)
    v_smem = gl.allocate_shared_memory(dtype, [NUM_STAGES, BLOCK_N, HEAD_DIM], tile_layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_bars = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    v_bars = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(k_bars.index(i), count=1)
        mbarrier.init(v_bars.index(i), count=1)
    fence_async_shared()

    # Key blocks: [0, n_blocks); only the last one can need a mask (see the module docstring).
    n_blocks = _n_key_blocks(m_block, seqlen, BLOCK_M, BLOCK_N, IS_CAUSAL)

    mbarrier.expect(q_bar, q_desc.block_type.nbytes)
    tma.async_load(q_desc, [start_m, 0], q_bar, q_smem)
    for i in gl.static_range(NUM_STAGES):  # the ring's first fill: blocks 0 .. NUM_STAGES-1
        _load_kv(k_desc, k_bars, k_smem, i, n_blocks, BLOCK_N, NUM_STAGES)
        _load_kv(v_desc, v_bars, v_smem, i, n_blocks, BLOCK_N, NUM_STAGES)

    offs_m = start_m + gl.arange(0, BLOCK_M, layout=row_layout)
    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, layout=row_layout)
    l_i = gl.zeros([BLOCK_M], gl.float32, layout=row_layout)
    s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, layout=s_layout)
    acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, layout=o_layout)

    # S_0: nothing to overlap yet.
    mbarrier.wait(q_bar, 0)
    _wait_kv(k_bars, 0, NUM_STAGES)
    s = warpgroup_mma(q_smem, k_smem.index(_kv_stage(0, NUM_STAGES)).permute((1, 0)), s_zero, use_acc=False,
                      is_async=True)
    s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
    # K stage of block 0 is free (S_0 done): refill it now, as the loop refills K_{j+1}'s stage after S_{j+1}
    # (without this copy key block NUM_STAGES is never loaded and the loop's wait on it never returns).
    _load_kv(k_desc, k_bars, k_smem, _kv_refill(0, NUM_STAGES), n_blocks, BLOCK_N, NUM_STAGES)

    for j in range(0, n_blocks - 1):
        _wait_kv(k_bars, j + 1, NUM_STAGES)
        s_next = warpgroup_mma(q_smem, k_smem.index(_kv_stage(j + 1, NUM_STAGES)).permute((1, 0)), s_zero,
                               use_acc=False, is_async=True)
        p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, qk_scale, offs_m, j * BLOCK_N, seqlen, s_layout, BLOCK_N,
                                           False, IS_CAUSAL)
        acc = _rescale(acc, alpha, o_layout)
        _wait_kv(v_bars, j, NUM_STAGES)
        acc = warpgroup_mma(gl.convert_layout(p.to(dtype), p_layout), v_smem.index(_kv_stage(j, NUM_STAGES)), acc,
                            is_async=True)
        s = warpgroup_mma_wait(num_outstanding=1, deps=(s_next,))  # S_{j+1}; P_j V_j stays in flight
        # K stage j+1 is free (S_{j+1} done); its refill is issued while P_j V_j runs. Both warpgroups must be
        # past their waits before one thread's TMA overwrites a stage: Triton's shared-memory barrier pass puts
        # a bar.sync between each wait and the next mbarrier.expect (an explicit gl.barrier() here only added
        # a third bar.sync per refill); tests/kernels/test_attention_gluon.py checks that it is there.
        _load_kv(k_desc, k_bars, k_smem, _kv_refill(j + 1, NUM_STAGES), n_blocks, BLOCK_N, NUM_STAGES)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        _load_kv(v_desc, v_bars, v_smem, _kv_refill(j, NUM_STAGES), n_blocks, BLOCK_N, NUM_STAGES)

    last = n_blocks - 1
    p, alpha, m_i, l_i = _softmax_step(s, m_i, l_i, qk_scale, offs_m, last * BLOCK_N, seqlen, s_layout, BLOCK_N, True,
                                       IS_CAUSAL)
    acc = _rescale(acc, alpha, o_layout)
    _wait_kv(v_bars, last, NUM_STAGES)
    acc = warpgroup_mma(gl.convert_layout(p.to(dtype), p_layout), v_smem.index(_kv_stage(last, NUM_STAGES)), acc,
                        is_async=True)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))

    mbarrier.invalidate(q_bar)
    for i in gl.static_range(NUM_STAGES):
        mbarrier.invalidate(k_bars.index(i))
        mbarrier.invalidate(v_bars.index(i))

    # One reciprocal per row, a multiply per element.
    out = _rescale(acc, 1.0 / l_i, o_layout)
    o_desc = tma.make_tensor_descriptor(o_ptr + b * stride_ob + h * stride_oh, [seqlen, HEAD_DIM], [stride_os, 1],
                                        [BLOCK_M, HEAD_DIM], tile_layout)
    gl.barrier()  # every warpgroup's last QK^T has read Q before its buffer takes O
    q_smem.store(out.to(dtype))
    fence_async_shared()
    tma.async_store(o_desc, [start_m, 0], q_smem)
    gl.store(lse_ptr + b * stride_lb + h * stride_lh + offs_m, m_i + gl.log2(l_i), mask=offs_m < seqlen)
    tma.store_wait(pendings=0)


# ---------------------------------------------------------------------------------------------------
# Host side.


def flag_set(flag: str) -> bool:
    """Whether the environment variable `flag` asks for an opt-in kernel ("1", "true", "yes", "on")."""
    return os.environ.get(flag, "0").strip().lower() in ("1", "true", "yes", "on")


def requested() -> bool:
    """Whether the environment asks ops.attention's forward to use this kernel (``WAVEFRONT_ATTENTION_GLUON=1``)."""
    return flag_set(ENV_FLAG)


#: The generation each Gluon kernel's target names in its refusal.
_GENERATION = {"sm_90": "Hopper", "sm_100": "Blackwell"}


def check_target(arch: runtime.Arch, *, flag: str = ENV_FLAG, what: str = "the Gluon forward",
                 target: str = TARGET) -> None:
    """Refuse every target but `target`, naming the flag (the Hopper Gluon kernels use wgmma and TMA, the
    Blackwell one tcgen05 and tensor memory)."""
    if arch.name != target:
        raise RuntimeError(f"attention: {what} ({flag}=1) runs on {target} ({_GENERATION[target]}) only, but the "
                           f"target is {arch.name}; unset {flag} to use the default kernel")


def _tma_addressable(t: torch.Tensor) -> bool:
    size = t.element_size()
    return t.data_ptr() % 16 == 0 and t.stride(-1) == 1 and all(s * size % 16 == 0 for s in t.stride()[:-1])


def check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens=None, *,
                 what: str = "the Gluon forward") -> None:
    """What the Hopper Gluon kernels cover beyond ops.attention's own validation; anything else is a clear error."""
    if cu_seqlens is not None:
        raise ValueError(f"attention: {what} takes dense inputs only; 'cu_seqlens' must be None")
    if q.dtype not in DTYPES:
        raise ValueError(f"attention: {what} takes bfloat16 or float16, got {q.dtype}")
    if q.shape[-1] not in HEAD_DIMS:
        raise ValueError(f"attention: {what} takes head_dim 64 or 128, got {q.shape[-1]}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not _tma_addressable(t):
            raise ValueError(f"attention: {what} needs '{name}' addressable by TMA (16-byte aligned base and "
                             f"strides, unit head_dim stride), got strides {tuple(t.stride())}")


def attention_fwd(q, k, v, causal: bool, scale: float, cu_seqlens=None, *, arch: runtime.Arch | None = None):
    """(o, lse2) exactly as ``kernels.attention.attention_fwd`` returns them: o like q, lse2 [B, H, S] fp32."""
    arch = arch or runtime.arch(q.device)
    check_target(arch)
    check_inputs(q, k, v, cu_seqlens)
    B, H, S, D = q.shape
    o = torch.empty_like(q)
    lse2 = torch.empty((B, H, S), dtype=torch.float32, device=q.device)
    if q.numel() == 0:
        return o, lse2
    n_m_blocks = triton.cdiv(S, BLOCK)
    ensure_descriptor_allocator(q.device)
    launch(
        _attn_fwd_sm90_gluon, (n_m_blocks * B * H,),
        q_ptr=q, k_ptr=k, v_ptr=v, o_ptr=o, lse_ptr=lse2,
        stride_qb=q.stride(0), stride_qh=q.stride(1), stride_qs=q.stride(2),
        stride_kb=k.stride(0), stride_kh=k.stride(1), stride_ks=k.stride(2),
        stride_vb=v.stride(0), stride_vh=v.stride(1), stride_vs=v.stride(2),
        stride_ob=o.stride(0), stride_oh=o.stride(1), stride_os=o.stride(2),
        stride_lb=lse2.stride(0), stride_lh=lse2.stride(1),
        n_heads=H, group_size=H // k.shape[1], seqlen=S, n_m_blocks=n_m_blocks, qk_scale=scale * LOG2E,
        constexprs=dict(HEAD_DIM=D, BLOCK_M=BLOCK, BLOCK_N=BLOCK, IS_CAUSAL=causal, NUM_STAGES=NUM_STAGES[D]),
        options={"num_warps": NUM_WARPS, "num_stages": 1},
    )
    return o, lse2
