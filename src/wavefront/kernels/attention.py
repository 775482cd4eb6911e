"""Attention (FlashAttention-2 style), forward and backward, with GQA/MQA, causal masking and packed
variable-length sequences.

Per (batch, head), with Q [S, D], K and V [S, D] (K/V head ``h // group`` for GQA), scale ``s``:

    S_ij = s * q_i . k_j                  (masked to -inf where j > i when causal, or j >= seqlen)
    P    = softmax_j(S)                   O = P V
    lse_i = log sum_j exp(S_ij)           (saved for backward in base 2, lse2 = lse log2 e, fp32)

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

Forward on sm_90 and sm_100 (USE_TMA, WARP_SPECIALIZE): Q, K, V and O move by TMA through one tensor
descriptor per (batch, head) sequence, whose bounds (the sequence, the true head dim) zero-fill ragged
tails and padded columns and clip the O store; the key loop is warp-specialized (``tl.range(...,
warp_specialize=True)``: a TMA producer warp and consumer warpgroups, registers moved by setmaxnreg;
tcgen05 with the accumulators in tensor memory on sm_100). Triton 3.9 partitions only a kernel whose
work is one loop (sm_90 gives up on, or fails to compile, a second loop or a peeled block; sm_100 spills
with two), so there every block goes through the masked step and blocks before the diagonal pass the
mask untouched (a compare, an or and a select per score). Programs past a packed sequence's end run
empty loops instead of returning early, for the same reason; their stores fall outside the descriptor.
sm_80 and AMD use pointer loads, as do tensors whose strides TMA cannot address (``_tma_ready``).
``pipeline_qk`` (PIPELINE; sm_90's second candidate) instead issues the next block's QK^T before this
block's softmax, without warp specialization (Triton 3.9's Hopper data partitioning aborts on that loop):
the wgmma wait stays 0 in the PTX (Triton waits for every wgmma whose result a non-MMA op reads), but ptxas
places the 66 exp2s of block j between the wgmma issues of block j+1 and that wait, where the default
waits before its first exp2 (docs/kernels-attention-gemm.md has both instruction sequences).

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

Non-deterministic backward (``deterministic=False``, ATOMIC_DQ): the dK/dV pass alone, where each
program also forms its key tile's share of dQ, s dS K ([BLOCK_M, D] per query tile), and adds it to an
fp32 [B, H, S, D] buffer with relaxed atomics; the launcher rounds that buffer to the input dtype. Five
matmul passes instead of seven (no dQ kernel, no second recomputation of S and dP); the price is
S / BLOCK_N fp32 atomic adds per dQ element (non-causal; about half causal), the fp32 buffer (zero fill,
one read), and a summation order that varies run to run. dK and dV are bit for bit the deterministic ones.

Operand layouts. A product that contracts over the sequence (P V forward; P^T dO, dS^T Q, dS K backward)
reads its second operand along a dimension that is not contiguous in memory. On AMD, Triton then writes
the tile to LDS and reads it back one 16-bit element per ds_read_u16; with ``transposed`` the launcher
makes [B, H, head_dim, S] copies (V forward; Q, dO and K backward: one extra read and write of each, S D
elements against the kernels' S^2 D work) and the kernels read them sequence-contiguous. With head_dim
256 the dK/dV (dQ) accumulators of a tile wide enough for wgmma/tcgen05 do not fit the registers:
``d_split`` programs share a key (query) tile, each accumulating BLOCK_D / d_split columns and
recomputing S and dP (d_split 4 for dK/dV: 2.5x that kernel's matrix work). On RDNA3 (wave32 WMMA,
operands replicated over the half-waves) even the tiles a program keeps across its loop (Q and dO in dQ, Q
forward, K and V in dK/dV) fill the registers at head_dim >= 128: ``d_chunk`` (D_CHUNK < BLOCK_D) sums S
and dP over head-dim chunks whose operands are loaded inside the loop, re-reading the kept tile from the
cache each step (one extra tile read per step, no extra matrix work); the accumulators stay whole.

Saved for backward: Q, K, V, O and lse2 ([B, H, S] fp32). Nothing of size S x S.

FP8 output (FP8_GROUP = G > 0; ops.attention's ``quantize=``): the epilogue also quantizes O for an FP8
o_proj, whose input row is one token's H * D values. With x the O tile as stored (rounded to O's dtype),
per row and G-column group: s = FP8_MAX / max(amax, EPS) (power of two with FP8_POW2), q = fp8_rne(clamp(
x s, +-FP8_MAX)), kernels/quantize.py's helpers, so the bits equal ops.quantize of O's [B, S, H * D] view.
G divides D (1 x 128 tiles at D = 128, 1 x 32 MX blocks), so a group never leaves the program's head; the
rowwise and tensorwise scales need every head's amax and are refused by the op. Writes 1 + 4 / G bytes per
element of O more, and saves the separate quantize pass's read of O (2 bytes per element in bf16). With
FP8_GROUP = 0 the kernel compiles to the same machine code as without the option.

Rounding: the scaled score x = c S' is rounded once and both m = max x and x - m use that value, so
the largest entry of every row is exactly exp2(0) = 1 (a one-key row reproduces V exactly). lse stays in
base 2: converting to natural log and back would add two fp32 roundings at |lse|, which reaches 20-100
for peaked softmaxes, each an error shared by a whole row of the recomputed P.

Packed variable-length input (``cu_seqlens``): q is [1, H, total, D] and k/v [1, H_kv, total, D], the
sequences concatenated along the sequence axis; sequence b occupies rows cu_seqlens[b]:cu_seqlens[b+1]
and attends only within itself. lse2 is then [1, H, total].

FLOPs (field convention, non-causal): forward 4 B H S^2 D; causal half that. Bytes (16-bit, minimum):
forward reads Q, K, V and writes O: 2 B (2 H + 2 H_kv) S D, plus 4 B H S for lse2. Intensity at
S = 8192, D = 128, H = H_kv: 4 S^2 D / (8 S D) = S/2 = 4096 FLOP/B, far right of every ridge point:
compute bound, so the tiles are sized for the matrix units, not for bandwidth.

Program order: a 1-D grid, head-major (programs sharing a K/V head are consecutive, so their K/V stays in
L2), remapped on MI300X so those programs share an XCD (kernels/_program_order.py). Causal forward and
dQ programs start from the last query tile (the longest row of work) so the tail of the grid is short.

Offsets: sequence, batch and head offsets are promoted to int64 before they multiply a stride.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from wavefront import runtime
from wavefront.kernels._launch import ensure_descriptor_allocator, launch
from wavefront.kernels._program_order import xcd_remap
from wavefront.kernels.attention_config import AttentionConfig, attention_config, has_tma, padded_head_dim
from wavefront.kernels.matmul_config import num_xcds
from wavefront.kernels.quantize import EPS, _abs_ignoring_nan, _scale_from_amax, _to_fp8

LOG2E = 1.4426950408889634
_FP8_EPS = tl.constexpr(EPS)  # the FP8 scale's amax floor, kernels/quantize.py's (a global read inside @jit)


@triton.jit
def _load_tile(base, rows, stride_row, cols, n_rows, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
               CHECK_ROWS: tl.constexpr):
    """A [rows, BLOCK_D] tile; rows past n_rows and padded head-dim columns read as zero."""
    ptrs = base + rows[:, None].to(tl.int64) * stride_row + cols[None, :]
    if CHECK_ROWS:
        if HEAD_DIM == BLOCK_D:
            tile = tl.load(ptrs, mask=rows[:, None] < n_rows, other=0.0)
        else:
            tile = tl.load(ptrs, mask=(rows[:, None] < n_rows) & (cols[None, :] < HEAD_DIM), other=0.0)
    else:
        if HEAD_DIM == BLOCK_D:
            tile = tl.load(ptrs)
        else:
            tile = tl.load(ptrs, mask=cols[None, :] < HEAD_DIM, other=0.0)
    return tile


@triton.jit
def _store_tile(base, rows, stride_row, cols, n_rows, tile, HEAD_DIM: tl.constexpr):
    ptrs = base + rows[:, None].to(tl.int64) * stride_row + cols[None, :]
    tl.store(ptrs, tile.to(base.dtype.element_ty), mask=(rows[:, None] < n_rows) & (cols[None, :] < HEAD_DIM))


@triton.jit
def _scores_by_chunks(a_base, a_rows, stride_a, b_base, b_rows, stride_b, seqlen, HEAD_DIM: tl.constexpr,
                      BLOCK_D: tl.constexpr, D_CHUNK: tl.constexpr, B_CHECK: tl.constexpr):
    """A B^T for two row tiles read from memory D_CHUNK head-dim columns at a time (RDNA3: no full-width
    operand stays live across the loop; chunks wholly in the padding past HEAD_DIM are skipped). A is the
    tile the program keeps for its whole loop (Q forward and dQ, K and V in dK/dV): its chunk loads are
    volatile because they are loop-invariant, and LLVM would otherwise hoist them out of the loop, holding
    every chunk at once (as many registers as the full-width tile: the spills came back). On AMD the volatile
    flag only pins the load in place: the buffer loads keep their cache policy (no glc/dlc bits)."""
    acc = tl.zeros((a_rows.shape[0], b_rows.shape[0]), tl.float32)
    for c in tl.static_range(0, BLOCK_D, D_CHUNK):
        if c < HEAD_DIM:
            cols = c + tl.arange(0, D_CHUNK)
            a = tl.load(a_base + a_rows[:, None].to(tl.int64) * stride_a + cols[None, :],
                        mask=(a_rows[:, None] < seqlen) & (cols[None, :] < HEAD_DIM), other=0.0, volatile=True)
            b = _load_tile(b_base, b_rows, stride_b, cols, seqlen, HEAD_DIM, BLOCK_D, B_CHECK)
            acc = tl.dot(a, tl.trans(b), acc, input_precision="ieee")
    return acc


@triton.jit
def _sequence(cu_seqlens_ptr, b, seqlen, VARLEN: tl.constexpr):
    """(first row in memory, length, batch index in memory) of sequence b."""
    if VARLEN:
        start = tl.load(cu_seqlens_ptr + b).to(tl.int64)
        length = (tl.load(cu_seqlens_ptr + b + 1).to(tl.int64) - start).to(tl.int32)
        b_mem = b * 0
    else:
        start = (b * 0).to(tl.int64)
        length = seqlen
        b_mem = b
    return start, length, b_mem.to(tl.int64)


@triton.jit
def _key_bounds(start_m, seqlen, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, IS_CAUSAL: tl.constexpr):
    """Key range of a query tile: [0, full_end) needs no mask, [full_end, hi) does."""
    if IS_CAUSAL:
        hi = tl.minimum(start_m + BLOCK_M, seqlen)
        full_end = tl.minimum(start_m + 1, seqlen) // BLOCK_N * BLOCK_N
    else:
        hi = seqlen
        full_end = seqlen // BLOCK_N * BLOCK_N
    return full_end, hi


@triton.jit
def _tile_base(ptr, b_mem, head, seq_start, stride_b, stride_h, stride_s):
    """Address of row 0 of one (batch, head) sequence: the start of its tiles."""
    return ptr + b_mem * stride_b + head * stride_h + seq_start * stride_s


@triton.jit
def _valid_keys(offs_m, offs_n, seqlen, IS_CAUSAL: tl.constexpr):
    """[BLOCK_M, BLOCK_N] mask of the keys a query block may see: inside the sequence, and at or before
    the query when causal."""
    valid = offs_n[None, :] < seqlen
    if IS_CAUSAL:
        valid = valid & (offs_m[:, None] >= offs_n[None, :])
    return valid


@triton.jit
def _query_block(pid, n_m_blocks, n_heads, IS_CAUSAL: tl.constexpr):
    """(batch, head, query block) of a forward or dQ program. Causal grids run the longest
    query blocks (the last ones, which see the most keys) first, so the tail of the launch is short."""
    bh = pid // n_m_blocks
    m_block = pid % n_m_blocks
    if IS_CAUSAL:
        m_block = n_m_blocks - 1 - m_block
    return bh // n_heads, bh % n_heads, m_block


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
                      BLOCK_D: tl.constexpr, GROUP: tl.constexpr, FP8_MAX: tl.constexpr, POW2: tl.constexpr):
    """FP8 copy of one program's O tile (already rounded to O's dtype) with one scale per GROUP columns of a
    row, written where ops.quantize puts it for the [tokens, heads * head_dim] view of O: element (t, h, d) at
    (t * n_heads + h) * HEAD_DIM + d, its scale at (t * n_heads + h) * (HEAD_DIM // GROUP) + d // GROUP.
    The groups never cross a head (GROUP divides HEAD_DIM), so this program owns each group whole. Padded
    head-dim columns hold zeros (V reads them as zero) and are not stored."""
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
def _attn_fwd_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, cu_seqlens_ptr, vt_ptr,
    stride_qb, stride_qh, stride_qs, stride_kb, stride_kh, stride_ks, stride_vb, stride_vh, stride_vs,
    stride_ob, stride_oh, stride_os, stride_lb, stride_lh, stride_tb, stride_th, stride_t,
    n_heads, group_size, seqlen, n_m_blocks, n_programs, qk_scale, q8_ptr, s8_ptr,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr, VARLEN: tl.constexpr, NUM_XCDS: tl.constexpr, USE_TMA: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr, V_TRANSPOSED: tl.constexpr, PIPELINE: tl.constexpr, D_CHUNK: tl.constexpr,
    FP8_GROUP: tl.constexpr, FP8_MAX: tl.constexpr, FP8_POW2: tl.constexpr,
):
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
                          b_mem * seqlen + seq_start, h64, n_heads, HEAD_DIM, BLOCK_D, FP8_GROUP, FP8_MAX, FP8_POW2)


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
def _dkdv_blocks(dk, dv, k, v, k_dq, k_base, v_base, q_base, do_base, qt_base, dot_base, lse_base, delta_base, dqa_base,
                 stride_ks, stride_vs, stride_qs, stride_dos, stride_t, stride_dqas, offs_n, offs_d, offs_do, lo, seqlen,
                 qk_scale, sm_scale, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
                 IS_CAUSAL: tl.constexpr, D_SPLIT: tl.constexpr, TRANSPOSED: tl.constexpr, ATOMIC_DQ: tl.constexpr,
                 DQ_TRANSPOSED: tl.constexpr, D_CHUNK: tl.constexpr):
    offs_m0 = tl.arange(0, BLOCK_M)
    for start_m in range(lo, seqlen, BLOCK_M):
        offs_m = start_m + offs_m0
        # Query rows past the sequence read as zero (q, dO, lse2, delta), which makes their
        # contributions to dK and dV exactly zero without a mask on P.
        q = _load_tile(q_base, offs_m, stride_qs, offs_d, seqlen, HEAD_DIM, BLOCK_D, True)
        do = _load_tile(do_base, offs_m, stride_dos, offs_d, seqlen, HEAD_DIM, BLOCK_D, True)
        lse2 = tl.load(lse_base + offs_m, mask=offs_m < seqlen, other=0.0)
        delta = tl.load(delta_base + offs_m, mask=offs_m < seqlen, other=0.0)
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
        # This program's columns of dK and dV (all of them unless D_SPLIT), contracted over the query rows.
        do_c = _contraction_operand(do, do_base, dot_base, offs_m, stride_dos, stride_t, offs_do, seqlen, HEAD_DIM,
                                    BLOCK_D, D_SPLIT, TRANSPOSED)
        dv = tl.dot(p_t.to(do.dtype), do_c, dv, input_precision="ieee")
        if D_CHUNK < BLOCK_D:
            dp_t = _scores_by_chunks(v_base, offs_n, stride_vs, do_base, offs_m, stride_dos, seqlen, HEAD_DIM, BLOCK_D,
                                     D_CHUNK, True)
        else:
            dp_t = tl.dot(v, tl.trans(do), input_precision="ieee")
        ds_t = p_t * (dp_t - delta[None, :])
        q_c = _contraction_operand(q, q_base, qt_base, offs_m, stride_qs, stride_t, offs_do, seqlen, HEAD_DIM, BLOCK_D,
                                   D_SPLIT, TRANSPOSED)
        dk = tl.dot(ds_t.to(q.dtype), q_c, dk, input_precision="ieee")
        if ATOMIC_DQ:
            # The fifth product: this key tile's share of dQ = s dS K, added to the fp32 dQ buffer (its
            # columns offs_do; relaxed order: the sums need atomicity, not ordering). DQ_TRANSPOSED forms
            # dQ^T = K^T dS^T, so the head dim is the MMA's M: wgmma needs M >= 64, and BLOCK_M (the query
            # rows) is 32 in sm_90's spill-free tile (the transposed form spills on sm_80, so it is not
            # the only form).
            if DQ_TRANSPOSED:
                dq_t = tl.dot(tl.trans(k_dq), ds_t.to(k.dtype), input_precision="ieee") * sm_scale
                dq_ptrs = dqa_base + offs_m[None, :].to(tl.int64) * stride_dqas + offs_do[:, None]
                tl.atomic_add(dq_ptrs, dq_t, mask=(offs_m[None, :] < seqlen) & (offs_do[:, None] < HEAD_DIM),
                              sem="relaxed")
            else:
                dq = tl.dot(tl.trans(ds_t.to(k.dtype)), k_dq, input_precision="ieee") * sm_scale
                dq_ptrs = dqa_base + offs_m[:, None].to(tl.int64) * stride_dqas + offs_do[None, :]
                tl.atomic_add(dq_ptrs, dq, mask=(offs_m[:, None] < seqlen) & (offs_do[None, :] < HEAD_DIM),
                              sem="relaxed")
    return dk, dv


@triton.jit
def _attn_bwd_dkdv_kernel(
    q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr, cu_seqlens_ptr, qt_ptr, dot_ptr, dqa_ptr,
    stride_qb, stride_qh, stride_qs, stride_kb, stride_kh, stride_ks, stride_vb, stride_vh, stride_vs,
    stride_dob, stride_doh, stride_dos, stride_dkb, stride_dkh, stride_dks, stride_dvb, stride_dvh, stride_dvs,
    stride_lb, stride_lh, stride_tb, stride_th, stride_t, stride_dqab, stride_dqah, stride_dqas,
    n_kv_heads, group_size, seqlen, n_n_blocks, n_programs, qk_scale, sm_scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    IS_CAUSAL: tl.constexpr, VARLEN: tl.constexpr, NUM_XCDS: tl.constexpr, D_SPLIT: tl.constexpr,
    TRANSPOSED: tl.constexpr, ATOMIC_DQ: tl.constexpr, DQ_TRANSPOSED: tl.constexpr, D_CHUNK: tl.constexpr,
):
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
    k = _load_tile(k_base, offs_n, stride_ks, offs_d, seqlen, HEAD_DIM, BLOCK_D, True)
    v = _load_tile(v_base, offs_n, stride_vs, offs_d, seqlen, HEAD_DIM, BLOCK_D, True)
    # ATOMIC_DQ: the K columns of this program's dQ share (all of K unless D_SPLIT).
    if ATOMIC_DQ and D_SPLIT > 1:
        k_dq = _load_tile(_tile_base(k_ptr, b_mem, kvh, seq_start, stride_kb, stride_kh, stride_ks), offs_n,
                          stride_ks, offs_do, seqlen, HEAD_DIM, BLOCK_D, True)
    else:
        k_dq = k
    dk = tl.zeros((BLOCK_N, BLOCK_D // D_SPLIT), tl.float32)
    dv = tl.zeros((BLOCK_N, BLOCK_D // D_SPLIT), tl.float32)
    # One loop over the query tiles from the causal diagonal on, mask applied throughout (a compare and a
    # select per score). Splitting off the unmasked tiles into their own loop, as the forward does,
    # spilled registers on sm_80, sm_90 and sm_100 at head_dim 128 (each loop's pipelined buffers stay
    # live), while the single loop fits in 189 registers on sm_90.
    lo = start_n // BLOCK_M * BLOCK_M if IS_CAUSAL else 0
    for g in range(0, group_size):
        h = kvh * group_size + g
        q_base = _tile_base(q_ptr, b_mem, h, seq_start, stride_qb, stride_qh, stride_qs)
        do_base = _tile_base(do_ptr, b_mem, h, seq_start, stride_dob, stride_doh, stride_dos)
        # delta [B, H, S] has lse2's strides.
        lse_base = lse_ptr + b_mem * stride_lb + h * stride_lh + seq_start
        delta_base = delta_ptr + b_mem * stride_lb + h * stride_lh + seq_start
        dqa_base = dqa_ptr + b_mem * stride_dqab + h * stride_dqah + seq_start * stride_dqas if ATOMIC_DQ else q_base
        # The transposed copies [B, H, head_dim, S] (TRANSPOSED only) share their strides.
        if TRANSPOSED:
            qt_base = qt_ptr + b_mem * stride_tb + h * stride_th + seq_start
            dot_base = dot_ptr + b_mem * stride_tb + h * stride_th + seq_start
        else:
            qt_base = q_base
            dot_base = do_base
        dk, dv = _dkdv_blocks(dk, dv, k, v, k_dq, k_base, v_base, q_base, do_base, qt_base, dot_base, lse_base,
                              delta_base, dqa_base, stride_ks, stride_vs, stride_qs, stride_dos, stride_t, stride_dqas,
                              offs_n, offs_d, offs_do, lo, seqlen, qk_scale, sm_scale, HEAD_DIM, BLOCK_D, BLOCK_M,
                              IS_CAUSAL, D_SPLIT, TRANSPOSED, ATOMIC_DQ, DQ_TRANSPOSED, D_CHUNK)
    _store_tile(_tile_base(dk_ptr, b_mem, kvh, seq_start, stride_dkb, stride_dkh, stride_dks), offs_n, stride_dks,
                offs_do, seqlen, dk * sm_scale, HEAD_DIM)
    _store_tile(_tile_base(dv_ptr, b_mem, kvh, seq_start, stride_dvb, stride_dvh, stride_dvs), offs_n, stride_dvs,
                offs_do, seqlen, dv, HEAD_DIM)


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


# ---------------------------------------------------------------------------------------------------
# Launchers. q: [B, H, S, D], k/v: [B, H_kv, S, D], each with unit stride along D (the op layer
# guarantees it). Varlen: B == 1 and cu_seqlens [n_seqs + 1] (int32 or int64) on q's device.


def _layout(q: torch.Tensor, cu_seqlens: torch.Tensor | None, max_seqlen: int):
    """(batch programs, seqlen used by the dense path, longest sequence) for the grid."""
    if cu_seqlens is None:
        return q.shape[0], q.shape[2], q.shape[2]
    return cu_seqlens.numel() - 1, 0, max_seqlen


def _strides3(t: torch.Tensor) -> tuple[int, int, int]:
    return t.stride(0), t.stride(1), t.stride(2)


def _tma_ready(*tensors: torch.Tensor) -> bool:
    """Whether every tensor meets the TMA descriptor's rules: 16-byte aligned base, unit last stride, and
    every other stride a multiple of 16 bytes (so each (batch, head, sequence start) base stays aligned)."""
    for t in tensors:
        size = t.element_size()
        if t.data_ptr() % 16 or t.stride(-1) != 1 or any(s * size % 16 for s in t.stride()[:-1]):
            return False
    return True


def _use_tma(arch: runtime.Arch, *tensors: torch.Tensor) -> bool:
    """TMA on sm_90 and later, and under the interpreter (which runs tensor descriptors, so the tests cover
    this path); pointer loads on sm_80, AMD, and for tensors TMA cannot address."""
    return (arch.family == "cpu" or has_tma(arch)) and _tma_ready(*tensors)


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
        _attn_fwd_kernel, (n_programs,),
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
                        USE_TMA=use_tma, WARP_SPECIALIZE=use_tma and cfg.warp_specialize, V_TRANSPOSED=vt is not None,
                        PIPELINE=use_tma and cfg.pipeline_qk and not cfg.warp_specialize,
                        D_CHUNK=block_d if use_tma else _d_chunk(cfg, block_d),
                        FP8_GROUP=fp8_group if o8 is not None else 0,
                        FP8_MAX=float(torch.finfo(fp8_dtype).max) if o8 is not None else 0.0,
                        FP8_POW2=bool(fp8_pow2)),
        options=cfg.options(arch),
    )
    return (o, lse2) if o8 is None else (o, lse2, o8, s8)


def _d_chunk(cfg: AttentionConfig, block_d: int) -> int:
    """The head-dim columns per chunk of the score products; block_d (no chunking) unless the entry sets d_chunk."""
    return min(cfg.d_chunk, block_d) if cfg.d_chunk else block_d


def _transposed(t: torch.Tensor) -> torch.Tensor:
    """[B, H, S, D] -> a [B, H, D, S] copy, sequence contiguous (one extra read and write of t)."""
    return t.transpose(2, 3).contiguous()


def _transposed_strides(t: torch.Tensor | None) -> dict:
    if t is None:
        return {"stride_tb": 0, "stride_th": 0, "stride_t": 0}
    return {"stride_tb": t.stride(0), "stride_th": t.stride(1), "stride_t": t.stride(2)}


def _dq_transposed(arch: runtime.Arch, cfg: AttentionConfig) -> bool:
    """Atomic dQ: form the share as dQ^T = K^T dS^T where BLOCK_M (the query rows) is under wgmma's M of 64:
    on sm_90/sm_100, and under the interpreter so the tests run this form (BLOCK_M 16 there)."""
    return (has_tma(arch) or arch.family == "cpu") and cfg.BLOCK_M < 64


def attention_bwd(do, q, k, v, o, lse2, causal: bool, scale: float, cu_seqlens=None, max_seqlen: int = 0, *,
                  arch: runtime.Arch | None = None, dkdv_config: AttentionConfig | None = None,
                  dq_config: AttentionConfig | None = None, deterministic: bool = True):
    """Returns (dq, dk, dv) shaped and strided like q, k, v (dense strides where those are not).

    deterministic=False: one pass of the dK/dV kernel that also adds each key tile's share of dQ to an fp32
    buffer by atomics (5 products instead of 7; dQ's summation order varies run to run). dkdv_config then
    defaults to the ``bwd_atomic`` entry and dq_config is unused."""
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

    dk = torch.empty_like(k)
    dv = torch.empty_like(v)
    cfg = dkdv_config or attention_config("bwd_dkdv" if deterministic else "bwd_atomic", D, q.dtype, arch)
    qt, dot = (_transposed(q), _transposed(do)) if cfg.transposed else (None, None)
    # Atomic dQ accumulates in fp32 (zeros: every row's sum starts empty), strided like q where q is dense.
    dq_acc = None if deterministic else torch.zeros_like(q, dtype=torch.float32)
    n_n_blocks = triton.cdiv(max(longest, 1), cfg.BLOCK_N)
    n_programs = n_n_blocks * n_batch * H_kv * cfg.d_split
    launch(
        _attn_bwd_dkdv_kernel, (n_programs,),
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
                        VARLEN=varlen, NUM_XCDS=xcds, D_SPLIT=cfg.d_split, TRANSPOSED=cfg.transposed,
                        ATOMIC_DQ=dq_acc is not None, DQ_TRANSPOSED=_dq_transposed(arch, cfg),
                        D_CHUNK=_d_chunk(cfg, block_d)),
        options=cfg.options(arch),
    )
    if dq_acc is not None:
        return dq_acc.to(q.dtype), dk, dv
    dq = torch.empty_like(q)
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
                        VARLEN=varlen, NUM_XCDS=xcds, D_SPLIT=cfg.d_split, TRANSPOSED=cfg.transposed,
                        D_CHUNK=_d_chunk(cfg, block_d)),
        options=cfg.options(arch),
    )
    return dq, dk, dv
