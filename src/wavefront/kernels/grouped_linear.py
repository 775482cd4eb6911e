"""Grouped linear for mixture-of-experts MLPs: one launch computes every expert's product over its ragged
group of tokens, forward and backward, with the SwiGLU epilogue fused for the gate/up projection.

Tokens arrive in expert-contiguous order; group e is rows [offsets[e-1], offsets[e]) of x (group 0 starts
at 0), ``offsets`` (E,) lives on the device (the ``offs`` convention of ``torch._grouped_mm``), and rows
past offsets[-1] are padding. Weights are per-expert nn.Linear layouts, W [E, N, K] (out x in).

    z_g = x_g W_e^T                         x_g [T_g, K], W_e [N, K], fp32 accumulator
    y_g = z_g                               activation None: y [T, N]
    y_g = silu(a) * b, (a, b) = z_g split   activation "swiglu": y [T, N/2], a = z[:, :N/2], b = z[:, N/2:]
                                            (the Hugging Face gate_up_proj layout)
    y[padding rows] = 0

Backward (dz = dy without an activation):

    da = dy * b * s (1 + a (1 - s)),  db = dy * a s,  s = sigmoid(a)      dz = [da, db]  [T, N]
    dx_g = dz_g W_e                         [T_g, N] x [N, K]: the forward kernel with W read transposed
    dW_e = dz_g^T x_g                       [N, T_g] x [T_g, K]: a reduction over the group's tokens;
                                            zero for an empty group
    dx[padding rows] = 0

Saved for backward: x, W, offsets and, with SwiGLU, the pre-activation z [T, N] in the input dtype, written
by the forward's epilogue. Recomputing z would cost a second grouped GEMM (2 T N K FLOPs) to save one
[T, N] write and read; Hugging Face's eager experts keep the same tensor alive (the gate_up_proj output).
dz is formed by one elementwise pass (_swiglu_bwd_kernel) because both backward products read it: fusing
it into their prologues would evaluate the sigmoid once per output tile column instead of once.

The SwiGLU epilogue is its own kernel, ``_grouped_gemm_swiglu_kernel``, over the same body as
``_grouped_gemm_kernel`` (the forward without an activation, and dx; no epilogue flag).

FLOPs: 2 T N K forward, 4 T N K backward (T = offsets[-1] routed rows). Bytes (16-bit, minimum): forward
reads x and W, writes y: 2 (T K + E N K + T N_out) (+ 2 T N for z with SwiGLU). Intensity of the forward
at 8192 tokens: Mixtral-8x7B's gate/up (top-2: T = 16384, E = 8, N = 2 x 14336, K = 4096) about 1100
FLOP/B with z; Qwen3-30B-A3B's (top-8: T = 65536, E = 128, N = 2 x 768, K = 2048, 512 rows per expert on
average) about 300 FLOP/B and its down projection about 270: at the H100's ridge (989 TFLOP/s over
3.35 TB/s, 295 FLOP/B), so small experts are as much a bandwidth problem as a matrix-unit one.

Tile schedule. Group g's rows split into ceil(T_g / BLOCK_M) row tiles, so a product holds at most
ceil(T / BLOCK_M) + E + 1 row tiles (one partial tile per group, plus the padding rows as a pseudo-group E
that writes zeros). The host sizes the grid by that bound and never reads offsets. A one-program launch
(_tile_table_kernel) writes the prefix sum of row tiles per group (E_POW2 int32, padded with the total);
each GEMM program locates a virtual tile's group by a branchless binary search of that table (_locate:
log2 E_POW2 scalar loads, cached) and reads the group's rows from offsets (two scalar loads). Virtual
tiles past the real count locate no group and store nothing. (Vector forms of the search, a scan or
reductions over E_POW2 lanes inside the tile loop, stop Triton 3.9's Hopper warp specializer: the scan at
any E, the reductions from E_POW2 = 128.)

Which kernel runs (kernels/grouped_config.py decides): on sm_90 / sm_100 a persistent grid (one program per
SM) walks the tiles and operands move by TMA tensor descriptors: x (or dz) as one [T, K] descriptor, W as
one [E N, K] descriptor (read transposed for dx: a shared-memory view, no copy of W; with SwiGLU as
[2 E, N/2, K], so one box holds a tile's gate and up rows). Rows of a tile past
its group's end read the next group's rows, which only feed masked output rows; a W tile past expert e's N
rows reads expert e + 1, which only feeds masked output columns, and in dx the K loop's columns past N are
zero-filled in dz by the copy engine. The dW product reduces over tokens, where neighbouring groups' rows
would enter the sum: it builds its descriptors per group (base at the group's first row, shape [T_g, .]),
so the copy engine zero-fills past the group's end. Outputs leave through masked stores (a group's last
row tile must not write the next group's rows). Elsewhere (sm_80, AMD, unaligned operands) the same
kernels load through pointers with masks; on AMD CDNA the operands whose reduction dim is strided
(dx: W^T; dW: dz^T and x^T) are first copied reduction-contiguous, as kernels/linear.py does, so the MFMA
operands come from LDS by wide reads (a strided reduction dim reaches the MFMA by ds_read_u16).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from wavefront import runtime
from wavefront.kernels._launch import ensure_descriptor_allocator, launch
from wavefront.kernels._program_order import grouped_tile
from wavefront.kernels.grouped_config import GroupedPlan, grouped_plan, swiglu_bwd_config


@triton.jit
def _group_bounds(offsets_ptr, T, E, E_POW2: tl.constexpr):
    """Per group lane (E experts, lane E the padding rows, lanes past E empty): first row and end row."""
    lane = tl.arange(0, E_POW2)
    ends = tl.load(offsets_ptr + lane, mask=lane < E, other=0).to(tl.int32)
    starts = tl.load(offsets_ptr + lane - 1, mask=(lane >= 1) & (lane <= E), other=0).to(tl.int32)
    ends = tl.minimum(tl.where(lane == E, T, ends), T)
    starts = tl.minimum(starts, T)
    # Lanes past the padding pseudo-group, and any decreasing offset, hold no rows.
    ends = tl.where(lane <= E, tl.maximum(ends, starts), starts)
    return lane, starts, ends


@triton.jit
def _tile_table_kernel(offsets_ptr, table_ptr, T, E, BLOCK_M: tl.constexpr, E_POW2: tl.constexpr):
    """table[g] = row tiles of groups 0..g (the inclusive prefix sum), one program. A separate launch because
    a scan inside the GEMM kernels stops Triton 3.9's Hopper warp specializer ("other parent ops")."""
    lane, starts, ends = _group_bounds(offsets_ptr, T, E, E_POW2)
    tl.store(table_ptr + lane, tl.cumsum((ends - starts + BLOCK_M - 1) // BLOCK_M, 0))


@triton.jit
def _group_rows(g, offsets_ptr, T, E):
    """(first row, end row) of group g by two scalar loads: experts 0..E-1, the padding pseudo-group E (its rows
    end at T), and an empty range past it. Clamped to [0, T]; a decreasing offset gives an empty group."""
    start = tl.where(g > 0, tl.load(offsets_ptr + tl.maximum(tl.minimum(g, E) - 1, 0)), 0).to(tl.int32)
    end = tl.where(g < E, tl.load(offsets_ptr + tl.minimum(g, E - 1)), T).to(tl.int32)
    start = tl.minimum(start, T)
    end = tl.where(g <= E, tl.maximum(tl.minimum(end, T), start), start)
    return start, end


@triton.jit
def _locate(v, offsets_ptr, table_ptr, T, E, BLOCK_M: tl.constexpr, E_POW2: tl.constexpr):
    """(group, first row, end row) of virtual row tile v: g = how many prefix sums are <= v, by a branchless
    binary search over the E_POW2-entry table (log2 E_POW2 scalar loads; the table is non-decreasing)."""
    g = v * 0
    half: tl.constexpr = E_POW2 // 2
    for step in tl.static_range(E_POW2.bit_length() - 1):
        probe = g + (half >> step)
        g = tl.where(tl.load(table_ptr + probe - 1) <= v, probe, g)
    first_tile = tl.where(g > 0, tl.load(table_ptr + tl.maximum(g - 1, 0)), 0)
    start, end = _group_rows(g, offsets_ptr, T, E)
    return g, start + (v - first_tile) * BLOCK_M, end


@triton.jit
def _gemm_tile(a_ptr, b_ptr, a_desc, b_desc, e, row0, off_n, T, N, N_OUT, K, stride_am, stride_be, stride_bn,
               stride_bk, k_tiles, DUAL: tl.constexpr, B_T: tl.constexpr, USE_TMA: tl.constexpr,
               EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """acc = A[row0:+BLOCK_M, :] @ B_e[off_n:+BLOCK_N, :]^T in fp32 over k_tiles reduction tiles, and with DUAL
    acc2 = the same against rows N_OUT + off_n (SwiGLU's up half), sharing each A tile. B_e is the logical
    [N, K] operand of expert e; B_T: stored [K, N] (dx's W_e^T).

    DUAL with TMA loads the gate and up tiles as one [2, BLOCK_N, BLOCK_K] box of W seen as [2 E, N/2, K] and
    runs one [BLOCK_M, 2 BLOCK_N] product, split after the loop: one accumulator, which Triton 3.9's Blackwell
    warp specializer requires (two tensor-memory accumulators in one loop trip its partitioner), and one
    wgmma n128 instead of two n64 on Hopper."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    acc2 = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    if DUAL and USE_TMA:
        both = tl.zeros((BLOCK_M, 2 * BLOCK_N), tl.float32)
        for kb in range(0, k_tiles):
            a = a_desc.load([row0, kb * BLOCK_K])
            b = tl.reshape(b_desc.load([e * 2, off_n, kb * BLOCK_K]), [2 * BLOCK_N, BLOCK_K])
            both = tl.dot(a, tl.trans(b), both, input_precision="ieee")
        acc, acc2 = tl.split(tl.permute(tl.reshape(both, [BLOCK_M, 2, BLOCK_N]), [0, 2, 1]))
    elif USE_TMA:
        for kb in range(0, k_tiles):
            a = a_desc.load([row0, kb * BLOCK_K])
            if B_T:
                b = b_desc.load([e * K + kb * BLOCK_K, off_n])
            else:
                b = tl.trans(b_desc.load([e * N + off_n, kb * BLOCK_K]))
            acc = tl.dot(a, b, acc, input_precision="ieee")
            if DUAL:
                b2 = tl.trans(b_desc.load([e * N + N_OUT + off_n, kb * BLOCK_K]))
                acc2 = tl.dot(a, b2, acc2, input_precision="ieee")
    else:
        # Rows past T are clamped and B's rows past N_OUT wrap: loads stay in bounds without row or column
        # masks, and the store masks what they fed.
        rows = tl.minimum(row0 + tl.arange(0, BLOCK_M), T - 1).to(tl.int64)
        cols = ((off_n + tl.arange(0, BLOCK_N)) % N_OUT).to(tl.int64)
        offs_k = tl.arange(0, BLOCK_K)
        a_ptrs = a_ptr + rows[:, None] * stride_am + offs_k[None, :]
        b_ptrs = b_ptr + e.to(tl.int64) * stride_be + cols[None, :] * stride_bn + offs_k[:, None] * stride_bk
        for kb in range(0, k_tiles):
            k_ok = offs_k < K - kb * BLOCK_K
            if EVEN_K:
                a = tl.load(a_ptrs)
                b = tl.load(b_ptrs)
            else:
                a = tl.load(a_ptrs, mask=k_ok[None, :], other=0.0)
                b = tl.load(b_ptrs, mask=k_ok[:, None], other=0.0)
            # fp32 operands get IEEE fp32 products (eager fp32 semantics); 16-bit operands use the MMA.
            acc = tl.dot(a, b, acc, input_precision="ieee")
            if DUAL:
                if EVEN_K:
                    b2 = tl.load(b_ptrs + N_OUT * stride_bn)
                else:
                    b2 = tl.load(b_ptrs + N_OUT * stride_bn, mask=k_ok[:, None], other=0.0)
                acc2 = tl.dot(a, b2, acc2, input_precision="ieee")
            a_ptrs += BLOCK_K
            b_ptrs += BLOCK_K * stride_bk
    return acc, acc2


@triton.jit
def _grouped_gemm(
    a_ptr, b_ptr, offsets_ptr, table_ptr, c_ptr, z_ptr, T, N, K, E, max_m_tiles,
    stride_am, stride_be, stride_bn, stride_bk, stride_cm, stride_zm,
    SWIGLU: tl.constexpr, SAVE_Z: tl.constexpr, B_T: tl.constexpr, USE_TMA: tl.constexpr, EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    E_POW2: tl.constexpr, NUM_PROGRAMS: tl.constexpr, WARP_SPECIALIZE: tl.constexpr,
):
    """C_g = epilogue(A_g B_e^T) for every group: the body of both grouped GEMM kernels. A [T, K] (unit stride
    along K); B_e the logical [N, K] operand of expert e: W_e (forward), or with B_T W_e^T, stored as W_e [K, N]
    (dx: N is in_features, K the reduction over out_features). SWIGLU: C [T, N/2] = silu(a) * b of the two
    halves, and SAVE_Z writes z = [a, b] [T, N]. NUM_PROGRAMS 0: one virtual tile per program (grid =
    max_tiles, the programs past the real tile count exit); > 0: a persistent grid walking the tiles."""
    if SWIGLU:
        N_OUT = N // 2
    else:
        N_OUT = N
    num_pid_n = tl.cdiv(N_OUT, BLOCK_N)
    # The host's bound on row tiles: tiles past the groups' real count locate no group (zero K loop, nothing
    # stored). Looping to the device-side count instead stops Triton 3.9's Hopper warp specializer.
    num_pid_m = max_m_tiles
    if USE_TMA:
        a_desc = tl.make_tensor_descriptor(a_ptr, shape=[T, K], strides=[stride_am, 1], block_shape=[BLOCK_M, BLOCK_K])
        if SWIGLU:
            # [2 E, N/2, K]: expert e's gate rows are slab 2 e, its up rows slab 2 e + 1.
            b_desc = tl.make_tensor_descriptor(b_ptr, shape=[E * 2, N_OUT, K], strides=[N_OUT * stride_bn, stride_bn, 1],
                                               block_shape=[2, BLOCK_N, BLOCK_K])
        elif B_T:
            # W stored [E, K, N] as far as this product sees it: E K rows of N (the reduction rows of dx).
            b_desc = tl.make_tensor_descriptor(b_ptr, shape=[E * K, N], strides=[stride_bk, 1],
                                               block_shape=[BLOCK_K, BLOCK_N])
        else:
            b_desc = tl.make_tensor_descriptor(b_ptr, shape=[E * N, K], strides=[stride_bn, 1],
                                               block_shape=[BLOCK_N, BLOCK_K])
    else:
        a_desc = a_ptr
        b_desc = b_ptr
    if NUM_PROGRAMS == 0:
        first = tl.program_id(0)
        last = first + 1
        step = 1
    else:
        first = tl.program_id(0)
        last = num_pid_m * num_pid_n
        step = NUM_PROGRAMS
    k_tiles_all = tl.cdiv(K, BLOCK_K)
    for tile in tl.range(first, last, step, flatten=False, warp_specialize=WARP_SPECIALIZE):
        pid_m, pid_n = grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M)
        g, row0, row_end = _locate(pid_m, offsets_ptr, table_ptr, T, E, BLOCK_M, E_POW2)
        e = tl.minimum(g, E - 1)
        # The padding pseudo-group (g == E) runs no K loop: its tiles store zeros.
        k_tiles = tl.where(g < E, k_tiles_all, 0)
        off_n = pid_n * BLOCK_N
        acc, up = _gemm_tile(a_ptr, b_ptr, a_desc, b_desc, e, row0, off_n, T, N, N_OUT, K, stride_am, stride_be,
                             stride_bn, stride_bk, k_tiles, SWIGLU, B_T, USE_TMA, EVEN_K, BLOCK_M, BLOCK_N, BLOCK_K)
        rows = (row0 + tl.arange(0, BLOCK_M)).to(tl.int64)[:, None]
        cols = off_n + tl.arange(0, BLOCK_N)[None, :]
        mask = (rows < row_end) & (cols < N_OUT)
        if SWIGLU:
            if SAVE_Z:
                tl.store(z_ptr + rows * stride_zm + cols, acc.to(z_ptr.dtype.element_ty), mask=mask)
                tl.store(z_ptr + rows * stride_zm + N_OUT + cols, up.to(z_ptr.dtype.element_ty), mask=mask)
            acc = acc * tl.sigmoid(acc) * up
        tl.store(c_ptr + rows * stride_cm + cols, acc.to(c_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _grouped_gemm_kernel(
    a_ptr, b_ptr, offsets_ptr, table_ptr, c_ptr,
    T, N, K, E, max_m_tiles,
    stride_am, stride_be, stride_bn, stride_bk, stride_cm,
    B_T: tl.constexpr, USE_TMA: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, E_POW2: tl.constexpr, NUM_PROGRAMS: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr,
):
    """C_g = A_g B_e^T: the forward without an epilogue, and dx (B_T)."""
    _grouped_gemm(a_ptr, b_ptr, offsets_ptr, table_ptr, c_ptr, None, T, N, K, E, max_m_tiles, stride_am, stride_be,
                  stride_bn, stride_bk, stride_cm, 0, False, False, B_T, USE_TMA, EVEN_K, BLOCK_M, BLOCK_N, BLOCK_K,
                  GROUP_M, E_POW2, NUM_PROGRAMS, WARP_SPECIALIZE)


@triton.jit
def _grouped_gemm_swiglu_kernel(
    a_ptr, b_ptr, offsets_ptr, table_ptr, c_ptr, z_ptr,
    T, N, K, E, max_m_tiles,
    stride_am, stride_be, stride_bn, stride_bk, stride_cm, stride_zm,
    SAVE_Z: tl.constexpr, USE_TMA: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, E_POW2: tl.constexpr, NUM_PROGRAMS: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr,
):
    """C_g = silu(a) * b of the gate and up halves of x_g W_e^T (the forward with the SwiGLU epilogue), and z =
    [a, b] with SAVE_Z. W [E, N, K] rows gate then up."""
    _grouped_gemm(a_ptr, b_ptr, offsets_ptr, table_ptr, c_ptr, z_ptr, T, N, K, E, max_m_tiles, stride_am, stride_be,
                  stride_bn, stride_bk, stride_cm, stride_zm, True, SAVE_Z, False, USE_TMA, EVEN_K, BLOCK_M, BLOCK_N, BLOCK_K,
                  GROUP_M, E_POW2, NUM_PROGRAMS, WARP_SPECIALIZE)


@triton.jit
def _grouped_dw_kernel(
    a_ptr, b_ptr, offsets_ptr, c_ptr,
    T, N, K, E,
    stride_a_row, stride_a_tok, stride_b_row, stride_b_tok, stride_ce, stride_cn,
    USE_TMA: tl.constexpr, ALIGNED_TOKENS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, NUM_PROGRAMS: tl.constexpr, WARP_SPECIALIZE: tl.constexpr,
):
    """dW_e [N, K] = A_e B_e^T over group e's tokens: A = dz^T (logical [N, T]), B = x^T (logical [K, T]).
    Here BLOCK_M tiles N, BLOCK_N tiles K and BLOCK_K tiles the tokens. Pointer loads take any strides (AMD:
    token-contiguous copies, ALIGNED_TOKENS: padded to whole BLOCK_K token blocks); TMA takes dz [T, N] and
    x [T, K] row-major with per-group descriptors."""
    num_pid_m = tl.cdiv(N, BLOCK_M)
    num_pid_n = tl.cdiv(K, BLOCK_N)
    per_expert = num_pid_m * num_pid_n
    if NUM_PROGRAMS == 0:
        first = tl.program_id(0)
        last = first + 1
        step = 1
    else:
        first = tl.program_id(0)
        last = E * per_expert
        step = NUM_PROGRAMS
    for tile in tl.range(first, last, step, flatten=False, warp_specialize=WARP_SPECIALIZE):
        e = tile // per_expert
        pid_m, pid_n = grouped_tile(tile % per_expert, num_pid_m, num_pid_n, GROUP_M)
        start, end = _group_rows(e, offsets_ptr, T, E)
        n_tok = end - start
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        if USE_TMA:
            # Per-group descriptors: the copy engine zero-fills rows past the group's end. An empty group runs
            # no iteration; its descriptors get one row so their shape stays valid.
            desc_rows = tl.maximum(n_tok, 1)
            a_desc = tl.make_tensor_descriptor(a_ptr + start.to(tl.int64) * stride_a_tok, shape=[desc_rows, N],
                                               strides=[stride_a_tok, 1], block_shape=[BLOCK_K, BLOCK_M])
            b_desc = tl.make_tensor_descriptor(b_ptr + start.to(tl.int64) * stride_b_tok, shape=[desc_rows, K],
                                               strides=[stride_b_tok, 1], block_shape=[BLOCK_K, BLOCK_N])
            for kb in range(0, tl.cdiv(n_tok, BLOCK_K)):
                a = tl.trans(a_desc.load([kb * BLOCK_K, off_m]))
                b = b_desc.load([kb * BLOCK_K, off_n])
                acc = tl.dot(a, b, acc, input_precision="ieee")
        else:
            # Output rows and columns past N and K wrap: loads stay in bounds, the store masks them.
            rows_a = ((off_m + tl.arange(0, BLOCK_M)) % N).to(tl.int64)
            rows_b = ((off_n + tl.arange(0, BLOCK_N)) % K).to(tl.int64)
            toks = tl.arange(0, BLOCK_K)
            if ALIGNED_TOKENS:
                # Token-contiguous copies padded to whole token blocks: blocks start on a multiple of BLOCK_K, the
                # loads are unmasked and vectorize (a mask along the contiguous dim would split them into 16-bit
                # loads and 16-bit LDS writes), and tokens outside the group are zeroed in registers.
                first = tl.multiple_of(start - start % BLOCK_K, BLOCK_K)
                n_blocks = tl.cdiv(start + n_tok - first, BLOCK_K)
                a_ptrs = a_ptr + rows_a[:, None] * stride_a_row + (first + toks)[None, :]
                b_ptrs = b_ptr + rows_b[None, :] * stride_b_row + (first + toks)[:, None]
            else:
                first = start
                n_blocks = tl.cdiv(n_tok, BLOCK_K)
                a_ptrs = a_ptr + rows_a[:, None] * stride_a_row + (start + toks).to(tl.int64)[None, :] * stride_a_tok
                b_ptrs = b_ptr + rows_b[None, :] * stride_b_row + (start + toks).to(tl.int64)[:, None] * stride_b_tok
            for kb in range(0, n_blocks):
                tok = first + kb * BLOCK_K + toks
                in_group = (tok >= start) & (tok < start + n_tok)
                if ALIGNED_TOKENS:
                    a = tl.where(in_group[None, :], tl.load(a_ptrs), 0.0)
                    b = tl.where(in_group[:, None], tl.load(b_ptrs), 0.0)
                else:
                    a = tl.load(a_ptrs, mask=in_group[None, :], other=0.0)
                    b = tl.load(b_ptrs, mask=in_group[:, None], other=0.0)
                acc = tl.dot(a, b, acc, input_precision="ieee")
                a_ptrs += BLOCK_K * stride_a_tok
                b_ptrs += BLOCK_K * stride_b_tok
        rows = (off_m + tl.arange(0, BLOCK_M)).to(tl.int64)[:, None]
        cols = off_n + tl.arange(0, BLOCK_N)[None, :]
        tl.store(c_ptr + e.to(tl.int64) * stride_ce + rows * stride_cn + cols, acc.to(c_ptr.dtype.element_ty),
                 mask=(rows < N) & (cols < K))


@triton.jit
def _swiglu_bwd_kernel(dy_ptr, z_ptr, dz_ptr, T, N_OUT, stride_dy, stride_z, stride_dz,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """dz = [dy * b * s (1 + a (1 - s)), dy * a s] from z = [a, b], s = sigmoid(a); fp32, rounded once."""
    rows = (tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)[:, None]
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    mask = (rows < T) & (cols < N_OUT)
    dy = tl.load(dy_ptr + rows * stride_dy + cols, mask=mask, other=0.0).to(tl.float32)
    a = tl.load(z_ptr + rows * stride_z + cols, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(z_ptr + rows * stride_z + N_OUT + cols, mask=mask, other=0.0).to(tl.float32)
    s = tl.sigmoid(a)
    tl.store(dz_ptr + rows * stride_dz + cols, (dy * b * s * (1.0 + a * (1.0 - s))).to(dz_ptr.dtype.element_ty),
             mask=mask)
    tl.store(dz_ptr + rows * stride_dz + N_OUT + cols, (dy * a * s).to(dz_ptr.dtype.element_ty), mask=mask)


# ---------------------------------------------------------------------------------------------------
# Launchers. x / dz: [T, K] with unit stride along K; weight [E, N, K] contiguous; offsets (E,) int32 or
# int64 on x's device; T, N, K >= 1 (the op layer sends empty problems to the reference).


def _tma_ok(*tensors: torch.Tensor) -> bool:
    """Every operand qualifies for a tensor descriptor: unit last stride, 16-byte aligned base and rows (the
    weight, seen as one [E N, K] matrix, must be contiguous)."""
    for t in tensors:
        if t.dim() == 3 and not t.is_contiguous():
            return False
        e = t.element_size()
        if t.stride(-1) != 1 or t.data_ptr() % 16 or any((s * e) % 16 for s in t.stride()[:-1]):
            return False
    return True


def _e_pow2(E: int) -> int:
    return triton.next_power_of_2(E + 1)


def _launch_gemm(a: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor, c: torch.Tensor,
                 z: torch.Tensor | None, plan: GroupedPlan, *, swiglu: bool, b_t: bool) -> None:
    T, K_red = a.shape
    E = weight.shape[0]
    N = weight.shape[2] if b_t else weight.shape[1]
    cfg = plan.config
    n_out = N // 2 if swiglu else N
    max_m_tiles = triton.cdiv(T, cfg.BLOCK_M) + E + 1
    max_tiles = max_m_tiles * triton.cdiv(n_out, cfg.BLOCK_N)
    programs = min(max_tiles, plan.programs) if plan.programs else 0
    if plan.use_tma:
        ensure_descriptor_allocator()
    e_pow2 = _e_pow2(E)
    table = torch.empty((e_pow2,), dtype=torch.int32, device=a.device)
    launch(_tile_table_kernel, (1,), offsets_ptr=offsets, table_ptr=table, T=T, E=E,
           constexprs=dict(BLOCK_M=cfg.BLOCK_M, E_POW2=e_pow2), options={"num_warps": 4, "num_stages": 1})
    # B_e as the logical [N, K_red] operand: W_e itself, or W_e^T for dx.
    operands = dict(a_ptr=a, b_ptr=weight, offsets_ptr=offsets, table_ptr=table, c_ptr=c, T=T, N=N, K=K_red, E=E,
                    max_m_tiles=max_m_tiles, stride_am=a.stride(0), stride_be=weight.stride(0),
                    stride_bn=weight.stride(2) if b_t else weight.stride(1),
                    stride_bk=weight.stride(1) if b_t else weight.stride(2), stride_cm=c.stride(0))
    schedule = dict(USE_TMA=plan.use_tma, EVEN_K=K_red % cfg.BLOCK_K == 0, BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N,
                    BLOCK_K=cfg.BLOCK_K, GROUP_M=cfg.GROUP_M, E_POW2=e_pow2, NUM_PROGRAMS=programs,
                    WARP_SPECIALIZE=cfg.warp_specialize and programs > 0)
    if swiglu:
        launch(_grouped_gemm_swiglu_kernel, (programs or max_tiles,), **operands, z_ptr=z,
               stride_zm=z.stride(0) if z is not None else 0, constexprs=dict(SAVE_Z=z is not None, **schedule),
               options=cfg.options(plan.arch))
    else:
        launch(_grouped_gemm_kernel, (programs or max_tiles,), **operands, constexprs=dict(B_T=b_t, **schedule),
               options=cfg.options(plan.arch))


def grouped_linear_fwd(x: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor, swiglu: bool, save_z: bool,
                       *, arch: runtime.Arch | None = None, tma: bool | None = None):
    """Returns (y [T, N] or [T, N/2] with swiglu, z [T, N] or None): z = x_g W_e^T, written when save_z."""
    arch = arch or runtime.arch(x.device)
    T, K = x.shape
    E, N, _ = weight.shape
    y = torch.empty((T, N // 2 if swiglu else N), dtype=x.dtype, device=x.device)
    z = torch.empty((T, N), dtype=x.dtype, device=x.device) if save_z else None
    use_tma = _tma_ok(x, weight) if tma is None else tma
    plan = grouped_plan("fwd_swiglu" if swiglu else "fwd", T, N, K, x.dtype, arch, x.device, use_tma)
    _launch_gemm(x, weight, offsets, y, z, plan, swiglu=swiglu, b_t=False)
    return y, z


def swiglu_bwd(dy: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """dz [T, N] from dy [T, N/2] and the saved pre-activation z [T, N]."""
    T, N = z.shape
    dz = torch.empty_like(z)
    cfg = swiglu_bwd_config()
    launch(_swiglu_bwd_kernel, (triton.cdiv(T, cfg.BLOCK_M), triton.cdiv(N // 2, cfg.BLOCK_N)),
           dy_ptr=dy, z_ptr=z, dz_ptr=dz, T=T, N_OUT=N // 2, stride_dy=dy.stride(0), stride_z=z.stride(0),
           stride_dz=dz.stride(0), constexprs=dict(BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N),
           options={"num_warps": cfg.num_warps, "num_stages": cfg.num_stages})
    return dz


def _token_major(view: torch.Tensor, block: int) -> torch.Tensor:
    """A token-contiguous copy of a logical [rows, T] view, T padded to whole blocks: [rows, ceil(T / block) *
    block], the whole of it passed to the kernel, whose unmasked loads of a group's last token block reach into
    the padding. The padding values are never used (the kernel zeroes tokens outside each group after loading);
    they are zeroed so that no load reads memory nothing wrote."""
    rows, T = view.shape
    out = torch.empty((rows, triton.cdiv(T, block) * block), dtype=view.dtype, device=view.device)
    out[:, :T].copy_(view)
    out[:, T:].zero_()
    return out


def grouped_linear_bwd(dz: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor,
                       needs_dx: bool, needs_dw: bool, *, arch: runtime.Arch | None = None,
                       tma: bool | None = None):
    """Returns (dx [T, K] or None, dW [E, N, K] or None) from dz [T, N] (dy, or swiglu_bwd's output)."""
    arch = arch or runtime.arch(x.device)
    T, K = x.shape
    E, N, _ = weight.shape
    dx = dw = None
    if needs_dx:
        dx = torch.empty((T, K), dtype=x.dtype, device=x.device)
        use_tma = _tma_ok(dz, weight) if tma is None else tma
        plan = grouped_plan("dx", T, K, N, x.dtype, arch, x.device, use_tma)
        w = weight
        if plan.pretranspose and not plan.use_tma:
            # W^T reduction-contiguous, [E, K, N] stored; read as "W" of the [E, K, N] forward problem.
            _launch_gemm(dz, weight.transpose(1, 2).contiguous(), offsets, dx, None, plan, swiglu=False, b_t=False)
        else:
            _launch_gemm(dz, w, offsets, dx, None, plan, swiglu=False, b_t=True)
    if needs_dw:
        dw = torch.empty((E, N, K), dtype=weight.dtype, device=x.device)
        use_tma = _tma_ok(dz, x) if tma is None else tma
        plan = grouped_plan("dw", N, K, T, x.dtype, arch, x.device, use_tma)
        cfg = plan.config
        a, b = dz.t(), x.t()  # logical [N, T] and [K, T]
        aligned = plan.pretranspose and not plan.use_tma
        if aligned:
            a, b = _token_major(a, cfg.BLOCK_K), _token_major(b, cfg.BLOCK_K)
        tiles = E * triton.cdiv(N, cfg.BLOCK_M) * triton.cdiv(K, cfg.BLOCK_N)
        programs = min(tiles, plan.programs) if plan.programs else 0
        if plan.use_tma:
            ensure_descriptor_allocator()
        launch(_grouped_dw_kernel, (programs or tiles,),
               a_ptr=a, b_ptr=b, offsets_ptr=offsets, c_ptr=dw, T=T, N=N, K=K, E=E,
               stride_a_row=a.stride(0), stride_a_tok=a.stride(1), stride_b_row=b.stride(0), stride_b_tok=b.stride(1),
               stride_ce=dw.stride(0), stride_cn=dw.stride(1),
               constexprs=dict(USE_TMA=plan.use_tma, ALIGNED_TOKENS=aligned, BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N,
                               BLOCK_K=cfg.BLOCK_K, GROUP_M=cfg.GROUP_M, NUM_PROGRAMS=programs,
                               WARP_SPECIALIZE=cfg.warp_specialize and programs > 0),
               options=cfg.options(plan.arch))
    return dx, dw
