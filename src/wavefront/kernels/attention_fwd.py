"""Attention forward kernel and launcher (kernels/attention.py has the shared math).

Forward (online softmax, fp32, base 2): a program owns BLOCK_M query rows and streams BLOCK_N-row K/V
tiles. With c = s * log2(e) and running row max m (in base-2 units) and row sum l:

    m' = max(m, max_j c S'_ij)            (S' = q . k, unscaled)
    p  = exp2(c S' - m'),  alpha = exp2(m - m')
    l  = alpha l + sum_j p,  acc = alpha acc + p V,  m = m'
    O  = acc / l,  lse2 = m + log2 l

so no [S x S] matrix ever exists in memory. The key loop is split in two: blocks that need no mask
(fully below the causal diagonal and inside the sequence) run without any ``where``; the diagonal and
ragged-tail blocks run masked. P is rounded to the input dtype for the P V product (the tensor cores
take 16-bit operands); every accumulation is fp32. O = acc * (1 / l): one division per row.

Forward on sm_90 and sm_100 (``_attn_fwd_tma_kernel``; WARP_SPECIALIZE, PIPELINE): Q, K, V and O move by TMA
through one tensor descriptor per (batch, head) sequence, whose bounds (the sequence, the true head dim)
zero-fill ragged tails and padded columns and clip the O store; the key loop is warp-specialized
(``tl.range(..., warp_specialize=True)``: a TMA producer warp and consumer warpgroups, registers moved by
setmaxnreg; tcgen05 with the accumulators in tensor memory on sm_100). Triton 3.9 partitions only a kernel
whose work is one loop (sm_90 gives up on, or fails to compile, a second loop or a peeled block; sm_100 spills
with two), so there every block goes through the masked step and blocks before the diagonal pass the mask
untouched (a compare, an or and a select per score). Programs past a packed sequence's end run empty loops
instead of returning early, for the same reason; their stores fall outside the descriptor. sm_80 and AMD use
pointer loads (``_attn_fwd_kernel``; V_TRANSPOSED, D_CHUNK), as do tensors whose strides TMA cannot address
(``_tma_ready``). Both kernels run one jit body, ``_attn_fwd``. ``pipeline_qk`` (PIPELINE; sm_90's second
candidate) instead issues the next block's QK^T before this block's softmax, without warp specialization
(Triton 3.9's Hopper data partitioning aborts on that loop): the wgmma wait stays 0 in the PTX (Triton waits
for every wgmma whose result a non-MMA op reads), but ptxas places the 66 exp2s of block j between the wgmma
issues of block j+1 and that wait, where the default waits before its first exp2
(docs/kernels-attention-gemm.md has both instruction sequences).

FP8 output (FP8_GROUP = G > 0; ops.attention's ``quantize=``): the epilogue also quantizes O for an FP8
o_proj, whose input row is one token's H * D values. With x the O tile as stored (rounded to O's dtype), per
row and G-column group: s = FP8_MAX / max(amax, EPS) (power of two with FP8_POW2), q = fp8_rne(clamp(x s,
+-FP8_MAX)) with FP8_MAX read off the FP8 pointer's element type, kernels/quantize.py's helpers, so the bits
equal ops.quantize of O's [B, S, H * D] view. G divides D (1 x 128 tiles at D = 128, 1 x 32 MX blocks), so a
group never leaves the program's head; the rowwise and tensorwise scales need every head's amax and are
refused by the op. Writes 1 + 4 / G bytes per element of O more, and saves the separate quantize pass's read
of O (2 bytes per element in bf16). With FP8_GROUP = 0 the kernel compiles to the same machine code as without
the option.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from wavefront import runtime
from wavefront.kernels._launch import ensure_descriptor_allocator, launch
from wavefront.kernels._program_order import xcd_remap
from wavefront.kernels._quantize_epilogue import fp8_max
from wavefront.kernels.attention_common import (
    _FP8_EPS,
    LOG2E,
    _d_chunk,
    _key_bounds,
    _layout,
    _load_tile,
    _query_block,
    _scores_by_chunks,
    _sequence,
    _store_tile,
    _tile_base,
    _transposed,
    _transposed_strides,
    _use_tma,
    _valid_keys,
)
from wavefront.kernels.attention_config import AttentionConfig, attention_config, padded_head_dim
from wavefront.kernels.matmul_config import num_xcds
from wavefront.kernels.quantize import _abs_ignoring_nan, _scale_from_amax, _to_fp8


@triton.jit
def _kv_tile(src, start_n, offs_n, stride_s, offs_d, seqlen, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
             MASKED: tl.constexpr, USE_TMA: tl.constexpr):
    """The [BLOCK_N, BLOCK_D] key or value tile at start_n: by TMA from a tensor descriptor (rows past the
    sequence and padded head-dim columns arrive as zero from the copy engine) or by pointers."""
    if USE_TMA:
        tile = src.load([start_n, 0])
    else:
        tile = _load_tile(src, offs_n, stride_s, offs_d, seqlen, HEAD_DIM, BLOCK_D, MASKED)
    return tile


@triton.jit
def _v_tile(src, vt_base, start_n, offs_n, stride_s, stride_t, offs_d, seqlen, HEAD_DIM: tl.constexpr,
            BLOCK_D: tl.constexpr, MASKED: tl.constexpr, USE_TMA: tl.constexpr, V_TRANSPOSED: tl.constexpr):
    """The value tile; V_TRANSPOSED reads it from a [.., head_dim, S] copy (AMD: P V then contracts over
    the contiguous dimension, with no 16-bit LDS traffic)."""
    if V_TRANSPOSED:
        mask = (offs_d[:, None] < HEAD_DIM) & (offs_n[None, :] < seqlen)
        tile = tl.trans(tl.load(vt_base + offs_d[:, None].to(tl.int64) * stride_t + offs_n[None, :], mask=mask,
                                other=0.0))
    else:
        tile = _kv_tile(src, start_n, offs_n, stride_s, offs_d, seqlen, HEAD_DIM, BLOCK_D, MASKED, USE_TMA)
    return tile


@triton.jit
def _fwd_step(acc, l_i, m_i, q, q_base, stride_qs, k_src, v_src, vt_base, start_n, offs_n0, stride_ks, stride_vs,
              stride_t, offs_m, offs_d, seqlen, qk_scale, mask_from, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
              MASKED: tl.constexpr, IS_CAUSAL: tl.constexpr, USE_TMA: tl.constexpr, ONE_LOOP: tl.constexpr,
              V_TRANSPOSED: tl.constexpr, D_CHUNK: tl.constexpr):
    """One key block of the online softmax."""
    offs_n = start_n + offs_n0
    if D_CHUNK < BLOCK_D:
        # Q re-read chunk by chunk each key block (cache hits) instead of held at full width.
        qk = _scores_by_chunks(q_base, offs_m, stride_qs, k_src, offs_n, stride_ks, seqlen, HEAD_DIM, BLOCK_D, D_CHUNK,
                               MASKED)
    else:
        k = _kv_tile(k_src, start_n, offs_n, stride_ks, offs_d, seqlen, HEAD_DIM, BLOCK_D, MASKED, USE_TMA)
        # fp32 inputs get IEEE fp32 products (eager fp32 semantics); 16-bit inputs use the MMA as is.
        qk = tl.dot(q, tl.trans(k), input_precision="ieee")
    if MASKED:
        valid = _valid_keys(offs_m, offs_n, seqlen, IS_CAUSAL)
        if ONE_LOOP:
            valid = valid | (start_n < mask_from)  # blocks before mask_from need no mask
        qk = tl.where(valid, qk, float("-inf"))
    # Every row sees key 0 in its first block (blocks run from key 0 upward), so m_new is finite and
    # exp2(-inf - m_new) is a clean 0 for masked entries and for the initial m = -inf.
    x = qk * qk_scale
    m_new = tl.maximum(m_i, tl.max(x, 1))
    p = tl.math.exp2(x - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    v = _v_tile(v_src, vt_base, start_n, offs_n, stride_vs, stride_t, offs_d, seqlen, HEAD_DIM, BLOCK_D, MASKED,
                USE_TMA, V_TRANSPOSED)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision="ieee")
    return acc, l_i, m_new


@triton.jit
def _fwd_blocks(acc, l_i, m_i, q, q_base, stride_qs, k_src, v_src, vt_base, stride_ks, stride_vs, stride_t, offs_m,
                offs_d, lo, hi, seqlen, qk_scale, mask_from, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                BLOCK_N: tl.constexpr, MASKED: tl.constexpr, IS_CAUSAL: tl.constexpr, USE_TMA: tl.constexpr,
                WARP_SPECIALIZE: tl.constexpr, ONE_LOOP: tl.constexpr, V_TRANSPOSED: tl.constexpr,
                D_CHUNK: tl.constexpr):
    offs_n0 = tl.arange(0, BLOCK_N)
    for start_n in tl.range(lo, hi, BLOCK_N, warp_specialize=WARP_SPECIALIZE):
        acc, l_i, m_i = _fwd_step(acc, l_i, m_i, q, q_base, stride_qs, k_src, v_src, vt_base, start_n, offs_n0,
                                  stride_ks, stride_vs, stride_t, offs_m, offs_d, seqlen, qk_scale, mask_from,
                                  HEAD_DIM, BLOCK_D, MASKED, IS_CAUSAL, USE_TMA, ONE_LOOP, V_TRANSPOSED, D_CHUNK)
    return acc, l_i, m_i


@triton.jit
def _fwd_blocks_pipelined(acc, l_i, m_i, q, k_src, v_src, vt_base, stride_ks, stride_vs, stride_t, offs_m, offs_d, lo,
                          hi, seqlen, qk_scale, mask_from, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                          BLOCK_N: tl.constexpr, IS_CAUSAL: tl.constexpr, USE_TMA: tl.constexpr,
                          WARP_SPECIALIZE: tl.constexpr, V_TRANSPOSED: tl.constexpr):
    """The key loop software-pipelined by hand: S of block j+1 is issued before the softmax of block j, so the
    matrix unit has work while the exp2s run. One loop with no prologue (a peeled QK^T made the loop need
    255 registers): it starts one block early with S = -inf, an iteration that adds exactly nothing (the
    m_safe guard keeps exp2(-inf - -inf) from making NaNs; for every later row m is finite and the guard a
    no-op), and its last look-ahead tile (at hi: real keys or TMA zero-fill) goes unused. Every block passes
    through the mask, as with warp specialization."""
    offs_n0 = tl.arange(0, BLOCK_N)
    qk = tl.full((q.shape[0], BLOCK_N), float("-inf"), tl.float32)
    for start_n in tl.range(lo - BLOCK_N, hi, BLOCK_N, warp_specialize=WARP_SPECIALIZE):
        offs_n = start_n + offs_n0
        k_next = _kv_tile(k_src, start_n + BLOCK_N, offs_n + BLOCK_N, stride_ks, offs_d, seqlen, HEAD_DIM, BLOCK_D,
                          True, USE_TMA)
        qk_next = tl.dot(q, tl.trans(k_next), input_precision="ieee")
        valid = _valid_keys(offs_m, offs_n, seqlen, IS_CAUSAL) | (start_n < mask_from)
        x = tl.where(valid, qk, float("-inf")) * qk_scale
        m_new = tl.maximum(m_i, tl.max(x, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(x - m_safe[:, None])
        alpha = tl.math.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        v_start = tl.maximum(start_n, 0)
        v = _v_tile(v_src, vt_base, v_start, v_start + offs_n0, stride_vs, stride_t, offs_d, seqlen, HEAD_DIM, BLOCK_D,
                    True, USE_TMA, V_TRANSPOSED)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision="ieee")
        m_i = m_new
        qk = qk_next
    return acc, l_i, m_i


@triton.jit
def _store_fp8_groups(q8_ptr, s8_ptr, o, offs_m, offs_d, seqlen, token0, h, n_heads, HEAD_DIM: tl.constexpr,
                      BLOCK_D: tl.constexpr, GROUP: tl.constexpr, POW2: tl.constexpr):
    """FP8 copy of one program's O tile (already rounded to O's dtype) with one scale per GROUP columns of a
    row, written where ops.quantize puts it for the [tokens, heads * head_dim] view of O: element (t, h, d) at
    (t * n_heads + h) * HEAD_DIM + d, its scale at (t * n_heads + h) * (HEAD_DIM // GROUP) + d // GROUP.
    The groups never cross a head (GROUP divides HEAD_DIM), so this program owns each group whole. Padded
    head-dim columns hold zeros (V reads them as zero) and are not stored. FP8_MAX follows from q8_ptr's
    element type (a flag for it could only restate the dtype)."""
    FP8_MAX: tl.constexpr = fp8_max(q8_ptr.dtype.element_ty)
    x = o.to(tl.float32)
    rows = token0 + offs_m.to(tl.int64)
    base = (rows * n_heads + h)[:, None]
    row_ok = (offs_m < seqlen)[:, None]
    if GROUP == BLOCK_D:
        scale = _scale_from_amax(tl.max(_abs_ignoring_nan(x), axis=1), FP8_MAX, _FP8_EPS, POW2)
        q = _to_fp8(x, scale[:, None], q8_ptr.dtype.element_ty, FP8_MAX)
        tl.store(s8_ptr + base, scale[:, None], mask=row_ok)
    else:
        N_GROUPS: tl.constexpr = BLOCK_D // GROUP
        xg = tl.reshape(x, (x.shape[0], N_GROUPS, GROUP))
        scale = _scale_from_amax(tl.max(_abs_ignoring_nan(xg), axis=2), FP8_MAX, _FP8_EPS, POW2)
        q = tl.reshape(_to_fp8(xg, scale[:, :, None], q8_ptr.dtype.element_ty, FP8_MAX), (x.shape[0], BLOCK_D))
        offs_g = tl.arange(0, N_GROUPS)
        tl.store(s8_ptr + base * (HEAD_DIM // GROUP) + offs_g[None, :], scale,
                 mask=row_ok & (offs_g[None, :] < HEAD_DIM // GROUP))
    tl.store(q8_ptr + base * HEAD_DIM + offs_d[None, :], q, mask=row_ok & (offs_d[None, :] < HEAD_DIM))


@triton.jit
def _attn_fwd(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, cu_seqlens_ptr, vt_ptr,
    stride_qb, stride_qh, stride_qs, stride_kb, stride_kh, stride_ks, stride_vb, stride_vh, stride_vs,
    stride_ob, stride_oh, stride_os, stride_lb, stride_lh, stride_tb, stride_th, stride_t,
    n_heads, group_size, seqlen, n_m_blocks, n_programs, qk_scale, q8_ptr, s8_ptr,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr, VARLEN: tl.constexpr, NUM_XCDS: tl.constexpr, USE_TMA: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr, V_TRANSPOSED: tl.constexpr, PIPELINE: tl.constexpr, D_CHUNK: tl.constexpr,
    FP8_GROUP: tl.constexpr, FP8_POW2: tl.constexpr,
):
    """The forward program, under the two kernels below (one per operand path): every flag of both."""
    pid = xcd_remap(tl.program_id(0), n_programs, NUM_XCDS)
    b, h, m_block = _query_block(pid, n_m_blocks, n_heads, IS_CAUSAL)
    seq_start, seqlen, b_mem = _sequence(cu_seqlens_ptr, b, seqlen, VARLEN)
    start_m = m_block * BLOCK_M
    if not WARP_SPECIALIZE:  # noqa: SIM102 (a constexpr test, resolved at compile time)
        if start_m >= seqlen:
            return
    # Warp specialization cannot partition a kernel with an early exit: a program past its (packed)
    # sequence instead runs empty key loops, and its O and lse2 stores fall outside the sequence.
    has_rows = start_m < seqlen
    h64 = h.to(tl.int64)
    kvh = h64 // group_size
    q_base = _tile_base(q_ptr, b_mem, h64, seq_start, stride_qb, stride_qh, stride_qs)
    k_base = _tile_base(k_ptr, b_mem, kvh, seq_start, stride_kb, stride_kh, stride_ks)
    v_base = _tile_base(v_ptr, b_mem, kvh, seq_start, stride_vb, stride_vh, stride_vs)
    o_base = _tile_base(o_ptr, b_mem, h64, seq_start, stride_ob, stride_oh, stride_os)
    vt_base = vt_ptr + b_mem * stride_tb + kvh * stride_th + seq_start if V_TRANSPOSED else v_base
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    if USE_TMA:
        # One descriptor per (batch, head) sequence: its bounds are the sequence (varlen too) and the true
        # head dim, so the copy engine zero-fills ragged tails and padded columns and clips the O store.
        q_desc = tl.make_tensor_descriptor(q_base, shape=[seqlen, HEAD_DIM], strides=[stride_qs, 1],
                                           block_shape=[BLOCK_M, BLOCK_D])
        k_src = tl.make_tensor_descriptor(k_base, shape=[seqlen, HEAD_DIM], strides=[stride_ks, 1],
                                          block_shape=[BLOCK_N, BLOCK_D])
        v_src = tl.make_tensor_descriptor(v_base, shape=[seqlen, HEAD_DIM], strides=[stride_vs, 1],
                                          block_shape=[BLOCK_N, BLOCK_D])
        q = q_desc.load([start_m, 0])
    else:
        k_src = k_base
        v_src = v_base
        if D_CHUNK < BLOCK_D:
            q = q_base  # unused: the chunked key loop reads Q itself
        else:
            q = _load_tile(q_base, offs_m, stride_qs, offs_d, seqlen, HEAD_DIM, BLOCK_D, True)

    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
    full_end, hi = _key_bounds(start_m, seqlen, BLOCK_M, BLOCK_N, IS_CAUSAL)
    hi = tl.where(has_rows, hi, 0)
    full_end = tl.minimum(full_end, hi)
    if PIPELINE:
        acc, l_i, m_i = _fwd_blocks_pipelined(acc, l_i, m_i, q, k_src, v_src, vt_base, stride_ks, stride_vs, stride_t,
                                              offs_m, offs_d, 0, hi, seqlen, qk_scale, full_end, HEAD_DIM, BLOCK_D,
                                              BLOCK_N, IS_CAUSAL, USE_TMA, WARP_SPECIALIZE, V_TRANSPOSED)
    elif WARP_SPECIALIZE:
        # Triton's warp specialization partitions a kernel with one key loop and nothing else to schedule
        # (sm_90 gives up on, or fails to compile, a second loop; sm_100 spills with two): every block goes
        # through the masked step, where blocks before full_end pass the mask untouched.
        acc, l_i, m_i = _fwd_blocks(acc, l_i, m_i, q, q_base, stride_qs, k_src, v_src, vt_base, stride_ks, stride_vs,
                                    stride_t, offs_m, offs_d, 0, hi, seqlen, qk_scale, full_end, HEAD_DIM, BLOCK_D,
                                    BLOCK_N, True, IS_CAUSAL, USE_TMA, WARP_SPECIALIZE, True, V_TRANSPOSED, D_CHUNK)
    else:
        acc, l_i, m_i = _fwd_blocks(acc, l_i, m_i, q, q_base, stride_qs, k_src, v_src, vt_base, stride_ks, stride_vs,
                                    stride_t, offs_m, offs_d, 0, full_end, seqlen, qk_scale, full_end, HEAD_DIM,
                                    BLOCK_D, BLOCK_N, False, IS_CAUSAL, USE_TMA, WARP_SPECIALIZE, False, V_TRANSPOSED,
                                    D_CHUNK)
        acc, l_i, m_i = _fwd_blocks(acc, l_i, m_i, q, q_base, stride_qs, k_src, v_src, vt_base, stride_ks, stride_vs,
                                    stride_t, offs_m, offs_d, full_end, hi, seqlen, qk_scale, full_end, HEAD_DIM,
                                    BLOCK_D, BLOCK_N, True, IS_CAUSAL, USE_TMA, WARP_SPECIALIZE, False, V_TRANSPOSED,
                                    D_CHUNK)
    # One reciprocal per row, then a multiply per element: BLOCK_M divisions instead of BLOCK_M x BLOCK_D
    # (AMD expands each fp32 division to a v_div_scale/fmas/fixup sequence).
    out = acc * (1.0 / l_i)[:, None]
    if USE_TMA:
        o_desc = tl.make_tensor_descriptor(o_base, shape=[seqlen, HEAD_DIM], strides=[stride_os, 1],
                                           block_shape=[BLOCK_M, BLOCK_D])
        o_desc.store([start_m, 0], out.to(o_desc.dtype))
    else:
        _store_tile(o_base, offs_m, stride_os, offs_d, seqlen, out, HEAD_DIM)
    tl.store(lse_ptr + b_mem * stride_lb + h64 * stride_lh + seq_start + offs_m, m_i + tl.math.log2(l_i),
             mask=offs_m < seqlen)
    if FP8_GROUP > 0:
        # The FP8 copy is quantized from O as stored (rounded to its dtype), as ops.quantize(O) would see it.
        # Dense rows: token b * seqlen + m; packed: seq_start + m (b_mem is 0).
        _store_fp8_groups(q8_ptr, s8_ptr, out.to(o_ptr.dtype.element_ty), offs_m, offs_d, seqlen,
                          b_mem * seqlen + seq_start, h64, n_heads, HEAD_DIM, BLOCK_D, FP8_GROUP, FP8_POW2)

# The two launched kernels: the operand path is the forward's biggest axis (five of its flags belong to one side
# only). Both keep the whole runtime argument list (vt_ptr is None and its strides 0 under TMA). Against the single
# kernel they replace: the same SASS on sm_80, sm_90 and sm_100; on AMD the early-exit test's compare and branch
# come out inverted (same instruction count and registers).


@triton.jit
def _attn_fwd_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, cu_seqlens_ptr, vt_ptr,
    stride_qb, stride_qh, stride_qs, stride_kb, stride_kh, stride_ks, stride_vb, stride_vh, stride_vs,
    stride_ob, stride_oh, stride_os, stride_lb, stride_lh, stride_tb, stride_th, stride_t,
    n_heads, group_size, seqlen, n_m_blocks, n_programs, qk_scale, q8_ptr, s8_ptr,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr, VARLEN: tl.constexpr, NUM_XCDS: tl.constexpr, V_TRANSPOSED: tl.constexpr,
    D_CHUNK: tl.constexpr, FP8_GROUP: tl.constexpr, FP8_POW2: tl.constexpr,
):
    """Pointer loads (sm_80, AMD, tensors TMA cannot address): V from a transposed copy (V_TRANSPOSED) and
    scores by head-dim chunks (D_CHUNK < BLOCK_D) are this path's options."""
    _attn_fwd(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, cu_seqlens_ptr, vt_ptr, stride_qb, stride_qh, stride_qs, stride_kb, stride_kh,
              stride_ks, stride_vb, stride_vh, stride_vs, stride_ob, stride_oh, stride_os, stride_lb, stride_lh,
              stride_tb, stride_th, stride_t, n_heads, group_size, seqlen, n_m_blocks, n_programs, qk_scale, q8_ptr,
              s8_ptr,
              HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N, IS_CAUSAL, VARLEN, NUM_XCDS, False, False, V_TRANSPOSED, False,
              D_CHUNK, FP8_GROUP, FP8_POW2)


@triton.jit
def _attn_fwd_tma_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, cu_seqlens_ptr, vt_ptr,
    stride_qb, stride_qh, stride_qs, stride_kb, stride_kh, stride_ks, stride_vb, stride_vh, stride_vs,
    stride_ob, stride_oh, stride_os, stride_lb, stride_lh, stride_tb, stride_th, stride_t,
    n_heads, group_size, seqlen, n_m_blocks, n_programs, qk_scale, q8_ptr, s8_ptr,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr, VARLEN: tl.constexpr, NUM_XCDS: tl.constexpr, WARP_SPECIALIZE: tl.constexpr,
    PIPELINE: tl.constexpr, FP8_GROUP: tl.constexpr, FP8_POW2: tl.constexpr,
):
    """Q, K, V and O by TMA (sm_90, sm_100): the key loop warp-specialized (WARP_SPECIALIZE) or pipelined by
    hand (PIPELINE), or neither."""
    _attn_fwd(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, cu_seqlens_ptr, vt_ptr, stride_qb, stride_qh, stride_qs, stride_kb, stride_kh,
              stride_ks, stride_vb, stride_vh, stride_vs, stride_ob, stride_oh, stride_os, stride_lb, stride_lh,
              stride_tb, stride_th, stride_t, n_heads, group_size, seqlen, n_m_blocks, n_programs, qk_scale, q8_ptr,
              s8_ptr,
              HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N, IS_CAUSAL, VARLEN, NUM_XCDS, True, WARP_SPECIALIZE, False,
              PIPELINE, BLOCK_D, FP8_GROUP, FP8_POW2)


def attention_fwd(q, k, v, causal: bool, scale: float, cu_seqlens=None, max_seqlen: int = 0, *,
                  arch: runtime.Arch | None = None, config: AttentionConfig | None = None, tma: bool | None = None,
                  fp8_dtype: torch.dtype | None = None, fp8_group: int = 0, fp8_pow2: bool = False):
    """Returns (o, lse2): o like q, lse2 [B, H, S] fp32, the log-sum-exp in base 2 (natural: lse2 ln 2).

    tma: force the tensor-descriptor path on or off (default: :func:`_use_tma`).
    fp8_dtype: also quantize O in the epilogue, one scale per fp8_group (dividing D) columns of each row:
    returns (o, lse2, o_fp8 [B, S, H * D], o_scale [B, S, H * D / fp8_group] fp32), the layout of
    ``ops.quantize(o.transpose(1, 2).reshape(B, S, H * D), scaling=f"block1x{fp8_group}")``."""
    arch = arch or runtime.arch(q.device)
    B, H, S, D = q.shape
    cfg = config or attention_config("fwd", D, q.dtype, arch)
    block_d = padded_head_dim(D)
    o = torch.empty_like(q)
    lse2 = torch.empty((B, H, S), dtype=torch.float32, device=q.device)
    o8 = s8 = None
    if fp8_dtype is not None:
        o8 = torch.empty((B, S, H * D), dtype=fp8_dtype, device=q.device)
        s8 = torch.empty((B, S, H * D // fp8_group), dtype=torch.float32, device=q.device)
    n_batch, seqlen, longest = _layout(q, cu_seqlens, max_seqlen)
    n_m_blocks = triton.cdiv(max(longest, 1), cfg.BLOCK_M)
    n_programs = n_m_blocks * n_batch * H
    use_tma = _use_tma(arch, q, k, v, o) if tma is None else tma
    if use_tma:
        ensure_descriptor_allocator(q.device)
    vt = _transposed(v) if cfg.transposed and not use_tma else None
    launch(
        _attn_fwd_tma_kernel if use_tma else _attn_fwd_kernel, (n_programs,),
        q_ptr=q, k_ptr=k, v_ptr=v, o_ptr=o, lse_ptr=lse2, cu_seqlens_ptr=cu_seqlens, vt_ptr=vt,
        stride_qb=q.stride(0), stride_qh=q.stride(1), stride_qs=q.stride(2),
        stride_kb=k.stride(0), stride_kh=k.stride(1), stride_ks=k.stride(2),
        stride_vb=v.stride(0), stride_vh=v.stride(1), stride_vs=v.stride(2),
        stride_ob=o.stride(0), stride_oh=o.stride(1), stride_os=o.stride(2),
        stride_lb=lse2.stride(0), stride_lh=lse2.stride(1), **_transposed_strides(vt),
        n_heads=H, group_size=H // k.shape[1], seqlen=seqlen, n_m_blocks=n_m_blocks, n_programs=n_programs,
        qk_scale=scale * LOG2E, q8_ptr=o8, s8_ptr=s8,
        constexprs=dict(HEAD_DIM=D, BLOCK_D=block_d, BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N,
                        IS_CAUSAL=causal, VARLEN=cu_seqlens is not None, NUM_XCDS=num_xcds(arch),
                        FP8_GROUP=fp8_group if o8 is not None else 0, FP8_POW2=bool(fp8_pow2),
                        **(dict(WARP_SPECIALIZE=cfg.warp_specialize,
                                PIPELINE=cfg.pipeline_qk and not cfg.warp_specialize) if use_tma else
                           dict(V_TRANSPOSED=vt is not None, D_CHUNK=_d_chunk(cfg, block_d)))),
        options=cfg.options(arch),
    )
    return (o, lse2) if o8 is None else (o, lse2, o8, s8)

