"""Attention backward kernels (delta, dK/dV, dQ) and launcher (kernels/attention.py has the shared math).

Backward, with dO given and delta_i = sum_d dO_id O_id (a preprocessing kernel, fp32):

    P_ij  = exp2(c S'_ij - lse2_i)                recomputed blockwise from Q, K and the saved lse2
    dV    = P^T dO
    dP    = dO V^T
    dS_ij = P_ij (dP_ij - delta_i)
    dQ    = s dS K,   dK = s dS^T Q

Scheme: two passes, no atomics, deterministic. The dK/dV pass gives each program one BLOCK_N tile of
keys of one K/V head; it holds K, V and the dK, dV accumulators on chip and streams the query tiles of
every query head in the GQA group (so GQA needs no reduction afterwards), starting at the causal
diagonal. The dQ pass gives each program one BLOCK_M tile of queries, holds Q, dO and the dQ
accumulator, and streams the K/V tiles up to the diagonal. P is recomputed in both passes (7 matmul
passes in all against the 5 of the field's 2.5x-forward FLOP convention): the price of writing each
gradient exactly once, instead of accumulating dQ with fp32 atomics whose order varies run to run.

Operand path on sm_90/sm_100 (``_attn_bwd_dkdv_tma_kernel``; head_dim <= 128, tensors TMA can address): K and
V arrive by TMA once per program; Q and dO stream by TMA into shared memory through 3-D descriptors over the
GQA group, inside one loop over (query head, query tile) pairs that the software pipeline runs NUM_STAGES
tiles deep (the next tile's copies are in flight while this one's products run). Traffic is the pointer path's
(each Q/dO tile read once per key tile); what changes is that no Q/dO load sits exposed at the top of an
iteration and no operand passes through registers on its way to shared memory. dK, dV and the atomic dQ equal
the pointer path's bit for bit (same products, same order). Elsewhere (sm_80, AMD, d256's d_split) the pointer
path: one loop per query head, Q and dO loaded through registers.

Non-deterministic backward (``deterministic=False``: ``_attn_bwd_dkdv_atomic_kernel`` on the pointer path,
ATOMIC_DQ in the TMA kernel): the dK/dV pass alone, where each program also forms its key tile's share of dQ,
s dS K ([BLOCK_M, D] per query tile), and adds it to an fp32 [B, H, S, D] buffer with relaxed atomics; the
launcher rounds that buffer to the input dtype. Five matmul passes instead of seven (no dQ kernel, no second
recomputation of S and dP); the price is S / BLOCK_N fp32 atomic adds per dQ element (non-causal; about half
causal), the fp32 buffer (zero fill, one read), and a summation order that varies run to run. dK and dV are
bit for bit the deterministic ones.

Operand layouts (``transposed`` copies on AMD, ``d_split`` at head_dim 256, ``d_chunk`` on RDNA3): see
kernels/attention.py, which holds the notes both directions share.

Saved for backward: Q, K, V, O and lse2 ([B, H, S] fp32). Nothing of size S x S.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from wavefront import runtime
from wavefront.kernels import attention_bwd_gluon
from wavefront.kernels._launch import ensure_descriptor_allocator, launch
from wavefront.kernels._program_order import xcd_remap
from wavefront.kernels.attention_common import (
    LOG2E,
    _d_chunk,
    _key_bounds,
    _layout,
    _load_tile,
    _query_block,
    _scores_by_chunks,
    _sequence,
    _store_tile,
    _strides3,
    _tile_base,
    _transposed,
    _transposed_strides,
    _use_tma,
    _valid_keys,
)
from wavefront.kernels.attention_config import AttentionConfig, attention_config, has_tma, padded_head_dim
from wavefront.kernels.matmul_config import num_xcds


@triton.jit
def _attn_bwd_delta_kernel(
    o_ptr, do_ptr, delta_ptr,
    stride_ob, stride_oh, stride_os, stride_dob, stride_doh, stride_dos, stride_lb, stride_lh,
    n_heads, seqlen, n_m_blocks,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
):
    # A 1-D grid: batch x heads may exceed the 65535 limit of the second grid dimension.
    pid = tl.program_id(0)
    bh = pid // n_m_blocks
    b = (bh // n_heads).to(tl.int64)
    h = (bh % n_heads).to(tl.int64)
    offs_m = (pid % n_m_blocks) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    o = _load_tile(o_ptr + b * stride_ob + h * stride_oh, offs_m, stride_os, offs_d, seqlen, HEAD_DIM, BLOCK_D,
                   True).to(tl.float32)
    do = _load_tile(do_ptr + b * stride_dob + h * stride_doh, offs_m, stride_dos, offs_d, seqlen, HEAD_DIM,
                    BLOCK_D, True).to(tl.float32)
    tl.store(delta_ptr + b * stride_lb + h * stride_lh + offs_m, tl.sum(o * do, 1), mask=offs_m < seqlen)


@triton.jit
def _rows_desc(base, seqlen, stride_row, BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr, HEAD_DIM: tl.constexpr):
    """A tensor descriptor over one (batch, head) sequence [seqlen, HEAD_DIM]: TMA blocks past its rows or
    columns arrive as zero."""
    return tl.make_tensor_descriptor(base, shape=[seqlen, HEAD_DIM], strides=[stride_row, 1],
                                     block_shape=[BLOCK_ROWS, BLOCK_COLS])


@triton.jit
def _contraction_operand(tile, base, base_t, offs_rows, stride_row, stride_t, offs_do, seqlen, HEAD_DIM: tl.constexpr,
                         BLOCK_D: tl.constexpr, D_SPLIT: tl.constexpr, TRANSPOSED: tl.constexpr):
    """The [rows, BLOCK_D / D_SPLIT] operand a gradient product contracts over its rows (dV += P^T dO,
    dK += dS^T Q, dQ += dS K). Matrix units want the contraction dimension contiguous; in memory the head
    dim is. TRANSPOSED reads the operand from a [.., head_dim, seq] copy (sequence contiguous) so AMD's LDS
    holds it in the order the MFMA reads, 64-128 bits at a time instead of one bf16 per ds_read_u16."""
    if TRANSPOSED:
        ptrs = base_t + offs_do[:, None].to(tl.int64) * stride_t + offs_rows[None, :]
        tile = tl.trans(tl.load(ptrs, mask=(offs_do[:, None] < HEAD_DIM) & (offs_rows[None, :] < seqlen),
                                other=0.0))
    elif D_SPLIT > 1:
        tile = _load_tile(base, offs_rows, stride_row, offs_do, seqlen, HEAD_DIM, BLOCK_D, True)
    return tile


@triton.jit
def _dkdv_step(dk, dv, k, v, k_dq, q, do, q_c, do_c, lse2, delta, k_base, v_base, q_base, do_base, dqa_base, stride_ks,
               stride_vs, stride_qs, stride_dos, stride_dqas, offs_m, offs_n, offs_do, seqlen, qk_scale, sm_scale,
               HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, IS_CAUSAL: tl.constexpr, ATOMIC_DQ: tl.constexpr,
               DQ_TRANSPOSED: tl.constexpr, D_CHUNK: tl.constexpr):
    """One query tile against this program's key tile: dV += P^T dO, dK += dS^T Q (unscaled), and with
    ATOMIC_DQ this key tile's share of dQ. q_c, do_c: the columns of Q, dO the program's dK, dV own."""
    # Transposed scores [BLOCK_N, BLOCK_M]: dK and dV accumulate along the key rows this program owns.
    if D_CHUNK < BLOCK_D:
        # K and V re-read chunk by chunk each query step (cache hits) instead of held at full width.
        s_t = _scores_by_chunks(k_base, offs_n, stride_ks, q_base, offs_m, stride_qs, seqlen, HEAD_DIM, BLOCK_D,
                                D_CHUNK, True)
    else:
        s_t = tl.dot(k, tl.trans(q), input_precision="ieee")
    p_t = tl.math.exp2(s_t * qk_scale - lse2[None, :])
    if IS_CAUSAL:
        p_t = tl.where(offs_m[None, :] >= offs_n[:, None], p_t, 0.0)
    dv = tl.dot(p_t.to(do_c.dtype), do_c, dv, input_precision="ieee")
    if D_CHUNK < BLOCK_D:
        dp_t = _scores_by_chunks(v_base, offs_n, stride_vs, do_base, offs_m, stride_dos, seqlen, HEAD_DIM, BLOCK_D,
                                 D_CHUNK, True)
    else:
        dp_t = tl.dot(v, tl.trans(do), input_precision="ieee")
    ds_t = p_t * (dp_t - delta[None, :])
    dk = tl.dot(ds_t.to(q_c.dtype), q_c, dk, input_precision="ieee")
    if ATOMIC_DQ:
        # The fifth product: this key tile's share of dQ = s dS K, added to the fp32 dQ buffer (its
        # columns offs_do; relaxed order: the sums need atomicity, not ordering). DQ_TRANSPOSED forms
        # dQ^T = K^T dS^T, so the head dim is the MMA's M: wgmma needs M >= 64, and BLOCK_M (the query
        # rows) is 32 in sm_90's spill-free tile (the transposed form spills on sm_80, so it is not
        # the only form).
        if DQ_TRANSPOSED:
            dq_t = tl.dot(tl.trans(k_dq), ds_t.to(k_dq.dtype), input_precision="ieee") * sm_scale
            dq_ptrs = dqa_base + offs_m[None, :].to(tl.int64) * stride_dqas + offs_do[:, None]
            tl.atomic_add(dq_ptrs, dq_t, mask=(offs_m[None, :] < seqlen) & (offs_do[:, None] < HEAD_DIM),
                          sem="relaxed")
        else:
            dq = tl.dot(tl.trans(ds_t.to(k_dq.dtype)), k_dq, input_precision="ieee") * sm_scale
            dq_ptrs = dqa_base + offs_m[:, None].to(tl.int64) * stride_dqas + offs_do[None, :]
            tl.atomic_add(dq_ptrs, dq, mask=(offs_m[:, None] < seqlen) & (offs_do[None, :] < HEAD_DIM),
                          sem="relaxed")
    return dk, dv


@triton.jit
def _dkdv_blocks(dk, dv, k, v, k_dq, k_base, v_base, q_base, do_base, qt_base, dot_base, lse_base, delta_base, dqa_base,
                 stride_ks, stride_vs, stride_qs, stride_dos, stride_t, stride_dqas, offs_n, offs_d, offs_do, lo, seqlen,
                 qk_scale, sm_scale, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                 IS_CAUSAL: tl.constexpr, D_SPLIT: tl.constexpr, TRANSPOSED: tl.constexpr, ATOMIC_DQ: tl.constexpr,
                 DQ_TRANSPOSED: tl.constexpr, D_CHUNK: tl.constexpr):
    """The pointer path: the query tiles of one query head, Q and dO loaded through registers."""
    offs_m0 = tl.arange(0, BLOCK_M)
    for start_m in range(lo, seqlen, BLOCK_M):
        offs_m = start_m + offs_m0
        # Query rows past the sequence read as zero (q, dO, lse2, delta), which makes their
        # contributions to dK and dV exactly zero without a mask on P.
        q = _load_tile(q_base, offs_m, stride_qs, offs_d, seqlen, HEAD_DIM, BLOCK_D, True)
        do = _load_tile(do_base, offs_m, stride_dos, offs_d, seqlen, HEAD_DIM, BLOCK_D, True)
        lse2 = tl.load(lse_base + offs_m, mask=offs_m < seqlen, other=0.0)
        delta = tl.load(delta_base + offs_m, mask=offs_m < seqlen, other=0.0)
        # This program's columns of dK and dV (all of them unless D_SPLIT), contracted over the query rows.
        do_c = _contraction_operand(do, do_base, dot_base, offs_m, stride_dos, stride_t, offs_do, seqlen, HEAD_DIM,
                                    BLOCK_D, D_SPLIT, TRANSPOSED)
        q_c = _contraction_operand(q, q_base, qt_base, offs_m, stride_qs, stride_t, offs_do, seqlen, HEAD_DIM, BLOCK_D,
                                   D_SPLIT, TRANSPOSED)
        dk, dv = _dkdv_step(dk, dv, k, v, k_dq, q, do, q_c, do_c, lse2, delta, k_base, v_base, q_base, do_base,
                            dqa_base, stride_ks, stride_vs, stride_qs, stride_dos, stride_dqas, offs_m, offs_n, offs_do,
                            seqlen, qk_scale, sm_scale, HEAD_DIM, BLOCK_D, IS_CAUSAL, ATOMIC_DQ, DQ_TRANSPOSED, D_CHUNK)
    return dk, dv


@triton.jit
def _group_desc(base, group_size, seqlen, stride_h, stride_row, BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr,
                HEAD_DIM: tl.constexpr):
    """A tensor descriptor over the query heads of one K/V head's group, [group_size, seqlen, HEAD_DIM]:
    blocks past a sequence's rows or the head dim arrive as zero."""
    return tl.make_tensor_descriptor(base, shape=[group_size, seqlen, HEAD_DIM], strides=[stride_h, stride_row, 1],
                                     block_shape=[1, BLOCK_ROWS, BLOCK_COLS])


@triton.jit
def _dkdv_blocks_tma(dk, dv, k, v, q_base, do_base, lse_base, delta_base, dqa_base, stride_qh, stride_qs, stride_doh,
                     stride_dos, stride_lh, stride_dqah, stride_dqas, offs_n, offs_do, lo, seqlen, group_size, qk_scale,
                     sm_scale, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                     IS_CAUSAL: tl.constexpr, ATOMIC_DQ: tl.constexpr, DQ_TRANSPOSED: tl.constexpr,
                     NUM_STAGES: tl.constexpr):
    """The TMA path: one loop over (query head of the group, query tile) pairs, so dK and dV stay in the
    accumulators (registers on sm_90, tensor memory on sm_100) across the whole group. Q and dO arrive by
    TMA into shared memory through 3-D descriptors over the group's heads, NUM_STAGES tiles in flight (the
    loop's software pipeline issues tile j+1's copies before tile j's products); the descriptors' bounds
    zero-fill rows past the sequence and the padded head dim. lse2 and delta (BLOCK_M fp32 each) stay
    pointer loads: a sequence start in packed input need not be 16-byte aligned for a TMA base."""
    q_src = _group_desc(q_base, group_size, seqlen, stride_qh, stride_qs, BLOCK_M, BLOCK_D, HEAD_DIM)
    do_src = _group_desc(do_base, group_size, seqlen, stride_doh, stride_dos, BLOCK_M, BLOCK_D, HEAD_DIM)
    n_tiles = tl.cdiv(seqlen - lo, BLOCK_M)
    offs_m0 = tl.arange(0, BLOCK_M)
    for i in tl.range(0, group_size * n_tiles, num_stages=NUM_STAGES):
        g = i // n_tiles
        start_m = lo + (i - g * n_tiles) * BLOCK_M
        offs_m = start_m + offs_m0
        q = tl.reshape(q_src.load([g, start_m, 0]), (BLOCK_M, BLOCK_D))
        do = tl.reshape(do_src.load([g, start_m, 0]), (BLOCK_M, BLOCK_D))
        stat = g.to(tl.int64) * stride_lh + offs_m  # delta [B, H, S] has lse2's strides
        lse2 = tl.load(lse_base + stat, mask=offs_m < seqlen, other=0.0)
        delta = tl.load(delta_base + stat, mask=offs_m < seqlen, other=0.0)
        dk, dv = _dkdv_step(dk, dv, k, v, k, q, do, q, do, lse2, delta, q_base, q_base, q_base, do_base,
                            dqa_base + g.to(tl.int64) * stride_dqah, 0, 0, stride_qs, stride_dos, stride_dqas, offs_m,
                            offs_n, offs_do, seqlen, qk_scale, sm_scale, HEAD_DIM, BLOCK_D, IS_CAUSAL, ATOMIC_DQ,
                            DQ_TRANSPOSED, BLOCK_D)
    return dk, dv


@triton.jit
def _attn_bwd_dkdv(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr, cu_seqlens_ptr, qt_ptr, dot_ptr, dqa_ptr,
    stride_qb, stride_qh, stride_qs, stride_kb, stride_kh, stride_ks, stride_vb, stride_vh, stride_vs,
    stride_dob, stride_doh, stride_dos, stride_dkb, stride_dkh, stride_dks, stride_dvb, stride_dvh, stride_dvs,
    stride_lb, stride_lh, stride_tb, stride_th, stride_t, stride_dqab, stride_dqah, stride_dqas,
    n_kv_heads, group_size, seqlen, n_n_blocks, n_programs, qk_scale, sm_scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr, VARLEN: tl.constexpr, NUM_XCDS: tl.constexpr, D_SPLIT: tl.constexpr,
    TRANSPOSED: tl.constexpr, ATOMIC_DQ: tl.constexpr, DQ_TRANSPOSED: tl.constexpr, D_CHUNK: tl.constexpr,
    USE_TMA: tl.constexpr, NUM_STAGES: tl.constexpr,
):
    """The dK/dV program, under the three kernels below: every flag of all three."""
    pid = xcd_remap(tl.program_id(0), n_programs, NUM_XCDS)
    # D_SPLIT consecutive programs share a key tile and each owns BLOCK_D / D_SPLIT columns of dK and dV.
    part = pid % D_SPLIT
    pid = pid // D_SPLIT
    bh = pid // n_n_blocks
    n_block = pid % n_n_blocks
    b = bh // n_kv_heads
    kvh = (bh % n_kv_heads).to(tl.int64)
    seq_start, seqlen, b_mem = _sequence(cu_seqlens_ptr, b, seqlen, VARLEN)
    start_n = n_block * BLOCK_N
    if start_n >= seqlen:
        return
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_do = part * (BLOCK_D // D_SPLIT) + tl.arange(0, BLOCK_D // D_SPLIT)
    # Key rows past the sequence read as zero; the dK/dV rows they produce are masked off at the store.
    k_base = _tile_base(k_ptr, b_mem, kvh, seq_start, stride_kb, stride_kh, stride_ks)
    v_base = _tile_base(v_ptr, b_mem, kvh, seq_start, stride_vb, stride_vh, stride_vs)
    if USE_TMA:
        # The TMA kernel runs with D_SPLIT 1: K is also the dQ share's operand.
        k = _rows_desc(k_base, seqlen, stride_ks, BLOCK_N, BLOCK_D, HEAD_DIM).load([start_n, 0])
        v = _rows_desc(v_base, seqlen, stride_vs, BLOCK_N, BLOCK_D, HEAD_DIM).load([start_n, 0])
    else:
        k = _load_tile(k_base, offs_n, stride_ks, offs_d, seqlen, HEAD_DIM, BLOCK_D, True)
        v = _load_tile(v_base, offs_n, stride_vs, offs_d, seqlen, HEAD_DIM, BLOCK_D, True)
    # ATOMIC_DQ: the K columns of this program's dQ share (all of K unless D_SPLIT).
    if ATOMIC_DQ and D_SPLIT > 1:
        k_dq = _load_tile(k_base, offs_n, stride_ks, offs_do, seqlen, HEAD_DIM, BLOCK_D, True)
    else:
        k_dq = k
    dk = tl.zeros((BLOCK_N, BLOCK_D // D_SPLIT), tl.float32)
    dv = tl.zeros((BLOCK_N, BLOCK_D // D_SPLIT), tl.float32)
    # One loop over the query tiles from the causal diagonal on, mask applied throughout (a compare and a
    # select per score). Splitting off the unmasked tiles into their own loop, as the forward does,
    # spilled registers on sm_80, sm_90 and sm_100 at head_dim 128 (each loop's pipelined buffers stay
    # live), while the single loop fits in 189 registers on sm_90.
    lo = start_n // BLOCK_M * BLOCK_M if IS_CAUSAL else 0
    h0 = kvh * group_size  # the group's first query head
    # delta [B, H, S] has lse2's strides; the atomic dQ buffer is [B, H, S, D].
    lse_base = lse_ptr + b_mem * stride_lb + h0 * stride_lh + seq_start
    delta_base = delta_ptr + b_mem * stride_lb + h0 * stride_lh + seq_start
    if USE_TMA:
        dqa_base = dqa_ptr + b_mem * stride_dqab + h0 * stride_dqah + seq_start * stride_dqas if ATOMIC_DQ else q_ptr
        q_base = _tile_base(q_ptr, b_mem, h0, seq_start, stride_qb, stride_qh, stride_qs)
        do_base = _tile_base(do_ptr, b_mem, h0, seq_start, stride_dob, stride_doh, stride_dos)
        dk, dv = _dkdv_blocks_tma(dk, dv, k, v, q_base, do_base, lse_base, delta_base, dqa_base, stride_qh, stride_qs,
                                  stride_doh, stride_dos, stride_lh, stride_dqah, stride_dqas, offs_n, offs_do, lo,
                                  seqlen, group_size, qk_scale, sm_scale, HEAD_DIM, BLOCK_D, BLOCK_M, IS_CAUSAL,
                                  ATOMIC_DQ, DQ_TRANSPOSED, NUM_STAGES)
    else:
        for g in range(0, group_size):
            h = h0 + g
            q_base = _tile_base(q_ptr, b_mem, h, seq_start, stride_qb, stride_qh, stride_qs)
            do_base = _tile_base(do_ptr, b_mem, h, seq_start, stride_dob, stride_doh, stride_dos)
            dqa_base = dqa_ptr + b_mem * stride_dqab + h * stride_dqah + seq_start * stride_dqas if ATOMIC_DQ \
                else q_base
            # The transposed copies [B, H, head_dim, S] (TRANSPOSED only) share their strides.
            if TRANSPOSED:
                qt_base = qt_ptr + b_mem * stride_tb + h * stride_th + seq_start
                dot_base = dot_ptr + b_mem * stride_tb + h * stride_th + seq_start
            else:
                qt_base = q_base
                dot_base = do_base
            dk, dv = _dkdv_blocks(dk, dv, k, v, k_dq, k_base, v_base, q_base, do_base, qt_base, dot_base,
                                  lse_base + g * stride_lh, delta_base + g * stride_lh, dqa_base, stride_ks, stride_vs,
                                  stride_qs, stride_dos, stride_t, stride_dqas, offs_n, offs_d, offs_do, lo, seqlen,
                                  qk_scale, sm_scale, HEAD_DIM, BLOCK_D, BLOCK_M, IS_CAUSAL, D_SPLIT, TRANSPOSED,
                                  ATOMIC_DQ, DQ_TRANSPOSED, D_CHUNK)
    _store_tile(_tile_base(dk_ptr, b_mem, kvh, seq_start, stride_dkb, stride_dkh, stride_dks), offs_n, stride_dks,
                offs_do, seqlen, dk * sm_scale, HEAD_DIM)
    _store_tile(_tile_base(dv_ptr, b_mem, kvh, seq_start, stride_dvb, stride_dvh, stride_dvs), offs_n, stride_dvs,
                offs_do, seqlen, dv, HEAD_DIM)

# The launched dK/dV kernels, split along the operand path (TMA: no d_split, transposed copies or head-dim chunks)
# and, on the pointer path, the dQ form (atomic dQ adds its share's layout). All keep the whole runtime argument
# list (pointers that are None, strides that are 0). Against the single kernel they replace: the same SASS on
# sm_80 and sm_90; on AMD the early-exit test's compare and branch come out inverted; on sm_100 the early return
# now joins the one exit, so the tensor-memory release is emitted once instead of twice (40-48 fewer
# instructions, none in the loop).


@triton.jit
def _attn_bwd_dkdv_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr, cu_seqlens_ptr, qt_ptr, dot_ptr, dqa_ptr,
    stride_qb, stride_qh, stride_qs, stride_kb, stride_kh, stride_ks, stride_vb, stride_vh, stride_vs,
    stride_dob, stride_doh, stride_dos, stride_dkb, stride_dkh, stride_dks, stride_dvb, stride_dvh, stride_dvs,
    stride_lb, stride_lh, stride_tb, stride_th, stride_t, stride_dqab, stride_dqah, stride_dqas,
    n_kv_heads, group_size, seqlen, n_n_blocks, n_programs, qk_scale, sm_scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr, VARLEN: tl.constexpr, NUM_XCDS: tl.constexpr, D_SPLIT: tl.constexpr,
    TRANSPOSED: tl.constexpr, D_CHUNK: tl.constexpr,
):
    """The deterministic dK/dV pass by pointer loads (sm_80, AMD, d256's d_split, tensors TMA cannot address)."""
    _attn_bwd_dkdv(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr, cu_seqlens_ptr, qt_ptr, dot_ptr, dqa_ptr,
                   stride_qb, stride_qh, stride_qs, stride_kb, stride_kh, stride_ks, stride_vb, stride_vh, stride_vs,
                   stride_dob, stride_doh, stride_dos, stride_dkb, stride_dkh, stride_dks, stride_dvb, stride_dvh,
                   stride_dvs, stride_lb, stride_lh, stride_tb, stride_th, stride_t, stride_dqab, stride_dqah,
                   stride_dqas, n_kv_heads, group_size, seqlen, n_n_blocks, n_programs, qk_scale, sm_scale,
                   HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N, IS_CAUSAL, VARLEN, NUM_XCDS, D_SPLIT, TRANSPOSED, False, False,
                   D_CHUNK, False, None)


@triton.jit
def _attn_bwd_dkdv_atomic_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr, cu_seqlens_ptr, qt_ptr, dot_ptr, dqa_ptr,
    stride_qb, stride_qh, stride_qs, stride_kb, stride_kh, stride_ks, stride_vb, stride_vh, stride_vs,
    stride_dob, stride_doh, stride_dos, stride_dkb, stride_dkh, stride_dks, stride_dvb, stride_dvh, stride_dvs,
    stride_lb, stride_lh, stride_tb, stride_th, stride_t, stride_dqab, stride_dqah, stride_dqas,
    n_kv_heads, group_size, seqlen, n_n_blocks, n_programs, qk_scale, sm_scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr, VARLEN: tl.constexpr, NUM_XCDS: tl.constexpr, D_SPLIT: tl.constexpr,
    TRANSPOSED: tl.constexpr, DQ_TRANSPOSED: tl.constexpr, D_CHUNK: tl.constexpr,
):
    """The pointer path with the atomic dQ share (``deterministic=False``), formed as dQ or dQ^T."""
    _attn_bwd_dkdv(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr, cu_seqlens_ptr, qt_ptr, dot_ptr, dqa_ptr,
                   stride_qb, stride_qh, stride_qs, stride_kb, stride_kh, stride_ks, stride_vb, stride_vh, stride_vs,
                   stride_dob, stride_doh, stride_dos, stride_dkb, stride_dkh, stride_dks, stride_dvb, stride_dvh,
                   stride_dvs, stride_lb, stride_lh, stride_tb, stride_th, stride_t, stride_dqab, stride_dqah,
                   stride_dqas, n_kv_heads, group_size, seqlen, n_n_blocks, n_programs, qk_scale, sm_scale,
                   HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N, IS_CAUSAL, VARLEN, NUM_XCDS, D_SPLIT, TRANSPOSED, True,
                   DQ_TRANSPOSED, D_CHUNK, False, None)


@triton.jit
def _attn_bwd_dkdv_tma_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr, cu_seqlens_ptr, qt_ptr, dot_ptr, dqa_ptr,
    stride_qb, stride_qh, stride_qs, stride_kb, stride_kh, stride_ks, stride_vb, stride_vh, stride_vs,
    stride_dob, stride_doh, stride_dos, stride_dkb, stride_dkh, stride_dks, stride_dvb, stride_dvh, stride_dvs,
    stride_lb, stride_lh, stride_tb, stride_th, stride_t, stride_dqab, stride_dqah, stride_dqas,
    n_kv_heads, group_size, seqlen, n_n_blocks, n_programs, qk_scale, sm_scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr, VARLEN: tl.constexpr, NUM_XCDS: tl.constexpr, ATOMIC_DQ: tl.constexpr,
    DQ_TRANSPOSED: tl.constexpr, NUM_STAGES: tl.constexpr,
):
    """K, V, Q and dO by TMA (sm_90, sm_100), NUM_STAGES query tiles in flight; either dQ form."""
    _attn_bwd_dkdv(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr, cu_seqlens_ptr, qt_ptr, dot_ptr, dqa_ptr,
                   stride_qb, stride_qh, stride_qs, stride_kb, stride_kh, stride_ks, stride_vb, stride_vh, stride_vs,
                   stride_dob, stride_doh, stride_dos, stride_dkb, stride_dkh, stride_dks, stride_dvb, stride_dvh,
                   stride_dvs, stride_lb, stride_lh, stride_tb, stride_th, stride_t, stride_dqab, stride_dqah,
                   stride_dqas, n_kv_heads, group_size, seqlen, n_n_blocks, n_programs, qk_scale, sm_scale,
                   HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N, IS_CAUSAL, VARLEN, NUM_XCDS, 1, False, ATOMIC_DQ,
                   DQ_TRANSPOSED, BLOCK_D, True, NUM_STAGES)


@triton.jit
def _dq_blocks(dq, q, do, lse2, delta, q_base, do_base, k_base, v_base, kt_base, stride_qs, stride_dos, stride_ks,
               stride_vs, stride_t, offs_m, offs_d, offs_do, lo, hi, seqlen, qk_scale, HEAD_DIM: tl.constexpr,
               BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr, IS_CAUSAL: tl.constexpr,
               D_SPLIT: tl.constexpr, TRANSPOSED: tl.constexpr, D_CHUNK: tl.constexpr):
    offs_n0 = tl.arange(0, BLOCK_N)
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + offs_n0
        if D_CHUNK < BLOCK_D:
            # Q and dO are re-read chunk by chunk every key step (cache hits) instead of staying resident.
            s = _scores_by_chunks(q_base, offs_m, stride_qs, k_base, offs_n, stride_ks, seqlen, HEAD_DIM, BLOCK_D,
                                  D_CHUNK, MASKED)
            k = _load_tile(k_base, offs_n, stride_ks, offs_do, seqlen, HEAD_DIM, BLOCK_D, MASKED)
        else:
            k = _load_tile(k_base, offs_n, stride_ks, offs_d, seqlen, HEAD_DIM, BLOCK_D, MASKED)
            v = _load_tile(v_base, offs_n, stride_vs, offs_d, seqlen, HEAD_DIM, BLOCK_D, MASKED)
            s = tl.dot(q, tl.trans(k), input_precision="ieee")
        p = tl.math.exp2(s * qk_scale - lse2[:, None])
        if MASKED:
            p = tl.where(_valid_keys(offs_m, offs_n, seqlen, IS_CAUSAL), p, 0.0)
        if D_CHUNK < BLOCK_D:
            dp = _scores_by_chunks(do_base, offs_m, stride_dos, v_base, offs_n, stride_vs, seqlen, HEAD_DIM, BLOCK_D,
                                   D_CHUNK, MASKED)
        else:
            dp = tl.dot(do, tl.trans(v), input_precision="ieee")
        ds = p * (dp - delta[:, None])
        if D_CHUNK < BLOCK_D and not TRANSPOSED:
            k_c = k  # already this program's columns
        else:
            k_c = _contraction_operand(k, k_base, kt_base, offs_n, stride_ks, stride_t, offs_do, seqlen, HEAD_DIM,
                                       BLOCK_D, D_SPLIT, TRANSPOSED)
        dq = tl.dot(ds.to(k.dtype), k_c, dq, input_precision="ieee")
    return dq


@triton.jit
def _attn_bwd_dq_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, cu_seqlens_ptr, kt_ptr,
    stride_qb, stride_qh, stride_qs, stride_kb, stride_kh, stride_ks, stride_vb, stride_vh, stride_vs,
    stride_dob, stride_doh, stride_dos, stride_dqb, stride_dqh, stride_dqs, stride_lb, stride_lh,
    stride_tb, stride_th, stride_t,
    n_heads, group_size, seqlen, n_m_blocks, n_programs, qk_scale, sm_scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr, VARLEN: tl.constexpr, NUM_XCDS: tl.constexpr, D_SPLIT: tl.constexpr,
    TRANSPOSED: tl.constexpr, D_CHUNK: tl.constexpr,
):
    pid = xcd_remap(tl.program_id(0), n_programs, NUM_XCDS)
    part = pid % D_SPLIT
    b, h, m_block = _query_block(pid // D_SPLIT, n_m_blocks, n_heads, IS_CAUSAL)
    h = h.to(tl.int64)
    kvh = h // group_size
    seq_start, seqlen, b_mem = _sequence(cu_seqlens_ptr, b, seqlen, VARLEN)
    start_m = m_block * BLOCK_M
    if start_m >= seqlen:
        return
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_do = part * (BLOCK_D // D_SPLIT) + tl.arange(0, BLOCK_D // D_SPLIT)
    q_base = _tile_base(q_ptr, b_mem, h, seq_start, stride_qb, stride_qh, stride_qs)
    do_base = _tile_base(do_ptr, b_mem, h, seq_start, stride_dob, stride_doh, stride_dos)
    if D_CHUNK < BLOCK_D:
        q = q_base  # unused: the chunked key loop reads Q and dO itself
        do = do_base
    else:
        q = _load_tile(q_base, offs_m, stride_qs, offs_d, seqlen, HEAD_DIM, BLOCK_D, True)
        do = _load_tile(do_base, offs_m, stride_dos, offs_d, seqlen, HEAD_DIM, BLOCK_D, True)
    stat = b_mem * stride_lb + h * stride_lh + seq_start + offs_m
    lse2 = tl.load(lse_ptr + stat, mask=offs_m < seqlen, other=0.0)
    delta = tl.load(delta_ptr + stat, mask=offs_m < seqlen, other=0.0)
    k_base = _tile_base(k_ptr, b_mem, kvh, seq_start, stride_kb, stride_kh, stride_ks)
    v_base = _tile_base(v_ptr, b_mem, kvh, seq_start, stride_vb, stride_vh, stride_vs)
    kt_base = kt_ptr + b_mem * stride_tb + kvh * stride_th + seq_start if TRANSPOSED else k_base
    dq = tl.zeros((BLOCK_M, BLOCK_D // D_SPLIT), tl.float32)
    full_end, hi = _key_bounds(start_m, seqlen, BLOCK_M, BLOCK_N, IS_CAUSAL)
    dq = _dq_blocks(dq, q, do, lse2, delta, q_base, do_base, k_base, v_base, kt_base, stride_qs, stride_dos, stride_ks,
                    stride_vs, stride_t, offs_m, offs_d, offs_do, 0, full_end, seqlen, qk_scale, HEAD_DIM, BLOCK_D,
                    BLOCK_N, False, IS_CAUSAL, D_SPLIT, TRANSPOSED, D_CHUNK)
    dq = _dq_blocks(dq, q, do, lse2, delta, q_base, do_base, k_base, v_base, kt_base, stride_qs, stride_dos, stride_ks,
                    stride_vs, stride_t, offs_m, offs_d, offs_do, full_end, hi, seqlen, qk_scale, HEAD_DIM, BLOCK_D,
                    BLOCK_N, True, IS_CAUSAL, D_SPLIT, TRANSPOSED, D_CHUNK)
    dq_base = _tile_base(dq_ptr, b_mem, h, seq_start, stride_dqb, stride_dqh, stride_dqs)
    _store_tile(dq_base, offs_m, stride_dqs, offs_do, seqlen, dq * sm_scale, HEAD_DIM)

def _dq_transposed(arch: runtime.Arch, cfg: AttentionConfig) -> bool:
    """Atomic dQ: form the share as dQ^T = K^T dS^T where BLOCK_M (the query rows) is under wgmma's M of 64:
    on sm_90/sm_100, and under the interpreter so the tests run this form (BLOCK_M 16 there)."""
    return (has_tma(arch) or arch.family == "cpu") and cfg.BLOCK_M < 64


def _dkdv_tma(arch: runtime.Arch, cfg: AttentionConfig, block_d: int, *tensors: torch.Tensor) -> bool:
    """The dK/dV kernel reads K, V, Q and dO by TMA where the forward would (:func:`_use_tma`) and the entry
    reads them as stored (no transposed copies, no head-dim chunks: AMD-only options)."""
    return (cfg.d_split == 1 and not cfg.transposed and _d_chunk(cfg, block_d) == block_d
            and _use_tma(arch, *tensors))


def attention_bwd(do, q, k, v, o, lse2, causal: bool, scale: float, cu_seqlens=None, max_seqlen: int = 0, *,
                  arch: runtime.Arch | None = None, dkdv_config: AttentionConfig | None = None,
                  dq_config: AttentionConfig | None = None, deterministic: bool = True,
                  grad_dtype: torch.dtype | None = None, tma: bool | None = None):
    """Returns (dq, dk, dv) shaped and strided like q, k, v (dense strides where those are not), in
    `grad_dtype` (default: the inputs' dtype; torch.float32 keeps partial gradients unrounded for a caller
    that sums several, e.g. ring attention: the kernels store in the output buffer's dtype).

    deterministic=False: one pass of the dK/dV kernel that also adds each key tile's share of dQ to an fp32
    buffer by atomics (5 products instead of 7; dQ's summation order varies run to run). dkdv_config then
    defaults to the ``bwd_atomic`` entry and dq_config is unused.

    tma: force the dK/dV kernel's tensor-descriptor path (K, V, Q and dO by TMA) on or off (default: on
    sm_90/sm_100 and under the interpreter when :func:`_use_tma` allows, and the entry has no transposed
    copies or head-dim chunks)."""
    arch = arch or runtime.arch(q.device)
    B, H, S, D = q.shape
    H_kv = k.shape[1]
    block_d = padded_head_dim(D)
    n_batch, seqlen, longest = _layout(q, cu_seqlens, max_seqlen)
    varlen = cu_seqlens is not None
    xcds = num_xcds(arch)

    delta = torch.empty_like(lse2)
    # A row reduction, not a matrix product: 64 rows x head_dim per program is enough work per program
    # and keeps every target spill-free (35-135 registers across the six targets).
    delta_rows = 64
    delta_blocks = triton.cdiv(S, delta_rows)
    launch(
        _attn_bwd_delta_kernel, (delta_blocks * B * H,),
        o, do, delta, *_strides3(o), *_strides3(do), delta.stride(0), delta.stride(1), H, S, delta_blocks,
        constexprs=dict(HEAD_DIM=D, BLOCK_D=block_d, BLOCK_M=delta_rows),
        options={"num_warps": 4, "num_stages": 1},
    )

    dk = torch.empty_like(k, dtype=grad_dtype)
    dv = torch.empty_like(v, dtype=grad_dtype)
    if attention_bwd_gluon.requested():
        # Opt-in (WAVEFRONT_ATTENTION_BWD_GLUON=1), sm_100 only: the Gluon dK/dV kernel (4 barriers per
        # iteration); compiled and inspected, never run on a GPU. The dQ pass below is the Triton kernel's.
        attention_bwd_gluon.check_target(arch)
        attention_bwd_gluon.check_inputs(q, k, v, cu_seqlens, deterministic)
        attention_bwd_gluon.attention_bwd_dkdv(do, q, k, v, lse2, delta, causal, scale, dk, dv)
        return _dq_pass(do, q, k, v, lse2, delta, causal, scale, cu_seqlens, max_seqlen, arch, dq_config,
                        grad_dtype), dk, dv
    cfg = dkdv_config or attention_config("bwd_dkdv" if deterministic else "bwd_atomic", D, q.dtype, arch)
    qt, dot = (_transposed(q), _transposed(do)) if cfg.transposed else (None, None)
    if tma and (cfg.d_split > 1 or cfg.transposed or _d_chunk(cfg, block_d) < block_d):
        raise ValueError("attention_bwd: tma=True needs a dK/dV entry with d_split 1, no transposed copies and no "
                         f"head-dim chunks (got d_split={cfg.d_split}, transposed={cfg.transposed}, "
                         f"d_chunk={cfg.d_chunk})")
    use_tma = _dkdv_tma(arch, cfg, block_d, q, k, v, do) if tma is None else tma
    if use_tma:
        ensure_descriptor_allocator(q.device)
    # Atomic dQ accumulates in fp32 (zeros: every row's sum starts empty), strided like q where q is dense.
    dq_acc = None if deterministic else torch.zeros_like(q, dtype=torch.float32)
    n_n_blocks = triton.cdiv(max(longest, 1), cfg.BLOCK_N)
    n_programs = n_n_blocks * n_batch * H_kv * cfg.d_split
    if use_tma:
        kernel = _attn_bwd_dkdv_tma_kernel
        flags = dict(ATOMIC_DQ=dq_acc is not None, DQ_TRANSPOSED=_dq_transposed(arch, cfg),
                     NUM_STAGES=cfg.tma_stages or cfg.num_stages)
    elif dq_acc is None:
        kernel, flags = _attn_bwd_dkdv_kernel, dict(D_SPLIT=cfg.d_split, TRANSPOSED=cfg.transposed,
                                                    D_CHUNK=_d_chunk(cfg, block_d))
    else:
        kernel, flags = _attn_bwd_dkdv_atomic_kernel, dict(D_SPLIT=cfg.d_split, TRANSPOSED=cfg.transposed,
                                                           DQ_TRANSPOSED=_dq_transposed(arch, cfg),
                                                           D_CHUNK=_d_chunk(cfg, block_d))
    launch(
        kernel, (n_programs,),
        q_ptr=q, k_ptr=k, v_ptr=v, do_ptr=do, lse_ptr=lse2, delta_ptr=delta, dk_ptr=dk, dv_ptr=dv,
        cu_seqlens_ptr=cu_seqlens, qt_ptr=qt, dot_ptr=dot, dqa_ptr=dq_acc,
        stride_qb=q.stride(0), stride_qh=q.stride(1), stride_qs=q.stride(2),
        stride_kb=k.stride(0), stride_kh=k.stride(1), stride_ks=k.stride(2),
        stride_vb=v.stride(0), stride_vh=v.stride(1), stride_vs=v.stride(2),
        stride_dob=do.stride(0), stride_doh=do.stride(1), stride_dos=do.stride(2),
        stride_dkb=dk.stride(0), stride_dkh=dk.stride(1), stride_dks=dk.stride(2),
        stride_dvb=dv.stride(0), stride_dvh=dv.stride(1), stride_dvs=dv.stride(2),
        stride_lb=lse2.stride(0), stride_lh=lse2.stride(1), **_transposed_strides(qt),
        **({"stride_dqab": 0, "stride_dqah": 0, "stride_dqas": 0} if dq_acc is None else
           {"stride_dqab": dq_acc.stride(0), "stride_dqah": dq_acc.stride(1), "stride_dqas": dq_acc.stride(2)}),
        n_kv_heads=H_kv, group_size=H // H_kv, seqlen=seqlen, n_n_blocks=n_n_blocks, n_programs=n_programs,
        qk_scale=scale * LOG2E, sm_scale=scale,
        constexprs=dict(HEAD_DIM=D, BLOCK_D=block_d, BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N, IS_CAUSAL=causal,
                        VARLEN=varlen, NUM_XCDS=xcds, **flags),
        options=cfg.options(arch),
    )
    if dq_acc is not None:
        return dq_acc.to(grad_dtype or q.dtype), dk, dv
    return _dq_pass(do, q, k, v, lse2, delta, causal, scale, cu_seqlens, max_seqlen, arch, dq_config,
                    grad_dtype), dk, dv


def _dq_pass(do, q, k, v, lse2, delta, causal: bool, scale: float, cu_seqlens, max_seqlen: int, arch: runtime.Arch,
             dq_config: AttentionConfig | None, grad_dtype: torch.dtype | None) -> torch.Tensor:
    """The deterministic backward's second pass: dQ by query tile, recomputing P and dP."""
    H, D = q.shape[1], q.shape[3]
    H_kv = k.shape[1]
    block_d = padded_head_dim(D)
    n_batch, seqlen, longest = _layout(q, cu_seqlens, max_seqlen)
    dq = torch.empty_like(q, dtype=grad_dtype)
    cfg = dq_config or attention_config("bwd_dq", D, q.dtype, arch)
    n_m_blocks = triton.cdiv(max(longest, 1), cfg.BLOCK_M)
    n_programs = n_m_blocks * n_batch * H * cfg.d_split
    kt = _transposed(k) if cfg.transposed else None
    launch(
        _attn_bwd_dq_kernel, (n_programs,),
        q_ptr=q, k_ptr=k, v_ptr=v, do_ptr=do, lse_ptr=lse2, delta_ptr=delta, dq_ptr=dq, cu_seqlens_ptr=cu_seqlens, kt_ptr=kt,
        stride_qb=q.stride(0), stride_qh=q.stride(1), stride_qs=q.stride(2),
        stride_kb=k.stride(0), stride_kh=k.stride(1), stride_ks=k.stride(2),
        stride_vb=v.stride(0), stride_vh=v.stride(1), stride_vs=v.stride(2),
        stride_dob=do.stride(0), stride_doh=do.stride(1), stride_dos=do.stride(2),
        stride_dqb=dq.stride(0), stride_dqh=dq.stride(1), stride_dqs=dq.stride(2),
        stride_lb=lse2.stride(0), stride_lh=lse2.stride(1), **_transposed_strides(kt),
        n_heads=H, group_size=H // H_kv, seqlen=seqlen, n_m_blocks=n_m_blocks, n_programs=n_programs,
        qk_scale=scale * LOG2E, sm_scale=scale,
        constexprs=dict(HEAD_DIM=D, BLOCK_D=block_d, BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N, IS_CAUSAL=causal,
                        VARLEN=cu_seqlens is not None, NUM_XCDS=num_xcds(arch), D_SPLIT=cfg.d_split,
                        TRANSPOSED=cfg.transposed, D_CHUNK=_d_chunk(cfg, block_d)),
        options=cfg.options(arch),
    )
    return dq
