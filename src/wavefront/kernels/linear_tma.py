"""Linear on TMA-capable NVIDIA GPUs (sm_90 Hopper, sm_100 Blackwell): the products of kernels/linear.py
(same math, same epilogue and prologue, same saved tensors; read that file's docstring for the formulas)
as persistent, warp-specialized kernels whose operands move by TMA tensor descriptors.

    C = epilogue(prologue(A) B^T)           A [M, K], B [N, K] logical views; C [M, N]

- **TMA** (``tl.make_tensor_descriptor``): each operand tile is one bulk tensor copy
  (``cp.async.bulk.tensor``, SASS ``UTMALDG``) into swizzled shared memory that wgmma / tcgen05 read
  directly, and the output leaves by ``UTMASTG``. The copy engine zero-fills reads past the tensor's edge
  and drops writes past it, so ragged M, N and K need no masks and no wrapped indices.
- **Transposed operands in place**: an operand stored with its reduction dimension outermost (dW's dy^T
  and x^T, dx's W^T) gets a descriptor over the tensor as it lies in memory and a transposed shared-memory
  view (``A_T``/``B_T``); no copy, no narrow shared-memory reads.
- **Persistent** grid of ``NUM_PROGRAMS`` (one per SM) walking tiles in grouped order
  (kernels/_program_order.py): no tail wave of short-lived programs, and the next tile's loads overlap
  this tile's epilogue.
- **Warp specialization** (``tl.range(..., warp_specialize=True)``): a producer issues the TMA loads into a
  ring of ``num_stages`` buffers while the consumers run the matrix unit and the epilogue; the compiler
  rebalances registers between them with ``setmaxnreg``. On sm_90 Triton 3.9's Hopper warp specializer
  acts only on an unflattened tile loop with ``num_warps=4``, which it turns into one producer and two
  consumer warpgroups (384 threads; flattened, or with 8 warps, it emits no ``setmaxnreg``: checked by
  compiling); sm_100 specializes either way (tcgen05 issue, TMA and epilogue partitions).

- **Split-K** where the output has too few tiles to fill the GPU and K is long (the rule in
  kernels/matmul_config.py): work items are (tile, K slice) pairs, each writes its fp32 partial product to a
  workspace [SPLIT_K, M, N], and ``_splitk_epilogue_kernel`` sums the slices and applies the epilogue. The
  forward's split form is its own kernel, ``_linear_fwd_tma_splitk_kernel``, over the same body as
  ``_linear_fwd_tma_kernel`` (which carries the epilogue flags and no SPLIT_K).

Descriptors need a unit stride along their last dimension and 16-byte aligned rows and base; the launcher
(kernels/linear.py) checks that and falls back to the pointer kernels otherwise. The interpreter runs
these kernels too (tests exercise them on CPU).
"""

from __future__ import annotations

import triton
import triton.language as tl

from wavefront.kernels._program_order import grouped_tile
from wavefront.kernels.linear_epilogue import activation_grad, apply_activation


@triton.jit
def _operand_desc(ptr, rows, red, stride, BLOCK_ROWS: tl.constexpr, BLOCK_K: tl.constexpr, T: tl.constexpr):
    """Descriptor of an operand whose logical view is [rows, red]; T: stored as [red, rows] (rows unit-stride)."""
    if T:
        desc = tl.make_tensor_descriptor(ptr, shape=[red, rows], strides=[stride, 1], block_shape=[BLOCK_K, BLOCK_ROWS])
    else:
        desc = tl.make_tensor_descriptor(ptr, shape=[rows, red], strides=[stride, 1], block_shape=[BLOCK_ROWS, BLOCK_K])
    return desc


@triton.jit
def _load_rows_k(desc, off_rows, off_k, T: tl.constexpr):
    """The [BLOCK_ROWS, BLOCK_K] tile of a logical [rows, red] operand (a shared-memory transpose when T)."""
    if T:
        tile = tl.trans(desc.load([off_k, off_rows]))
    else:
        tile = desc.load([off_rows, off_k])
    return tile


@triton.jit
def _load_k_cols(desc, off_cols, off_k, T: tl.constexpr):
    """The [BLOCK_K, BLOCK_COLS] tile of B^T for a logical [cols, red] operand B."""
    if T:
        tile = desc.load([off_k, off_cols])
    else:
        tile = tl.trans(desc.load([off_cols, off_k]))
    return tile


@triton.jit
def _linear_fwd_tma(
    x_ptr, w_ptr, bias_ptr, res_ptr, y_ptr, g_ptr, ws_ptr, M, N, K, stride_x, stride_w, stride_r, stride_y, stride_g,
    ACTIVATION: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, SAVE_GRAD: tl.constexpr,
    W_T: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, NUM_PROGRAMS: tl.constexpr, WARP_SPECIALIZE: tl.constexpr,
):
    """The forward product's body, shared by its two kernels: the tile loop of x W^T, then (SPLIT_K 1) the
    epilogue y = act(x W^T + b) + r, g = act'(x W^T + b), or (SPLIT_K > 1) the fp32 partial of one K slice."""
    x_desc = _operand_desc(x_ptr, M, K, stride_x, BLOCK_M, BLOCK_K, False)
    w_desc = _operand_desc(w_ptr, N, K, stride_w, BLOCK_N, BLOCK_K, W_T)
    if SPLIT_K > 1:
        ws_desc = _partials_desc(ws_ptr, M, N, SPLIT_K, BLOCK_M, BLOCK_N)
    else:
        y_desc = tl.make_tensor_descriptor(y_ptr, shape=[M, N], strides=[stride_y, 1], block_shape=[BLOCK_M, BLOCK_N])
        if HAS_RESIDUAL:
            r_desc = tl.make_tensor_descriptor(res_ptr, shape=[M, N], strides=[stride_r, 1],
                                               block_shape=[BLOCK_M, BLOCK_N])
        if SAVE_GRAD:
            g_desc = tl.make_tensor_descriptor(g_ptr, shape=[M, N], strides=[stride_g, 1],
                                               block_shape=[BLOCK_M, BLOCK_N])
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    k_per_split = tl.cdiv(k_tiles, SPLIT_K)
    for work in tl.range(tl.program_id(0), num_pid_m * num_pid_n * SPLIT_K, NUM_PROGRAMS, flatten=False,
                         warp_specialize=WARP_SPECIALIZE):
        split = work % SPLIT_K
        pid_m, pid_n = grouped_tile(work // SPLIT_K, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        for kb in range(split * k_per_split, tl.minimum(k_tiles, (split + 1) * k_per_split)):
            a = _load_rows_k(x_desc, off_m, kb * BLOCK_K, False)
            b = _load_k_cols(w_desc, off_n, kb * BLOCK_K, W_T)
            acc = tl.dot(a, b, acc, input_precision="ieee")
        if SPLIT_K > 1:
            ws_desc.store([split * num_pid_m * BLOCK_M + off_m, off_n], acc)
        else:
            if HAS_BIAS:
                offs_n = off_n + tl.arange(0, BLOCK_N)
                acc += tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
            if SAVE_GRAD:
                g_desc.store([off_m, off_n], activation_grad(acc, ACTIVATION).to(g_ptr.dtype.element_ty))
            y = apply_activation(acc, ACTIVATION)
            if HAS_RESIDUAL:
                y += r_desc.load([off_m, off_n]).to(tl.float32)
            y_desc.store([off_m, off_n], y.to(y_ptr.dtype.element_ty))


@triton.jit
def _linear_fwd_tma_kernel(
    x_ptr, w_ptr, bias_ptr, res_ptr, y_ptr, g_ptr,
    M, N, K,
    stride_x, stride_w, stride_r, stride_y, stride_g,
    ACTIVATION: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, SAVE_GRAD: tl.constexpr,
    W_T: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, NUM_PROGRAMS: tl.constexpr, WARP_SPECIALIZE: tl.constexpr,
):
    """y = act(x W^T + b) + r, g = act'(x W^T + b). x [M, K] rows unit-stride; W [N, K] (W_T: stored [K, N])."""
    _linear_fwd_tma(x_ptr, w_ptr, bias_ptr, res_ptr, y_ptr, g_ptr, None, M, N, K, stride_x, stride_w, stride_r,
                    stride_y, stride_g, ACTIVATION, HAS_BIAS, HAS_RESIDUAL, SAVE_GRAD, W_T, 1, BLOCK_M, BLOCK_N,
                    BLOCK_K, GROUP_M, NUM_PROGRAMS, WARP_SPECIALIZE)


@triton.jit
def _linear_fwd_tma_splitk_kernel(
    x_ptr, w_ptr, ws_ptr,
    M, N, K,
    stride_x, stride_w,
    W_T: tl.constexpr, SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, NUM_PROGRAMS: tl.constexpr, WARP_SPECIALIZE: tl.constexpr,
):
    """x W^T in SPLIT_K (> 1) K slices: fp32 partial products into ws [SPLIT_K, M, N]; the epilogue (bias,
    activation, residual) runs in _splitk_epilogue_kernel."""
    _linear_fwd_tma(x_ptr, w_ptr, None, None, None, None, ws_ptr, M, N, K, stride_x, stride_w, 0, 0, 0, "none",
                    False, False, False, W_T, SPLIT_K, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, NUM_PROGRAMS,
                    WARP_SPECIALIZE)


@triton.jit
def _partials_desc(ws_ptr, M, N, SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """fp32 partial products [SPLIT_K, M_pad, N] seen as 2-D [SPLIT_K * M_pad, N], M_pad = M rounded up to
    BLOCK_M: a tile's rows past M land in its own slab's padding, never in the next slab. (A 3-D descriptor
    with a [1, BLOCK_M, BLOCK_N] block stops Triton 3.9's Hopper warp specializer.)"""
    return tl.make_tensor_descriptor(ws_ptr, shape=[SPLIT_K * tl.cdiv(M, BLOCK_M) * BLOCK_M, N], strides=[N, 1],
                                     block_shape=[BLOCK_M, BLOCK_N])


@triton.jit
def _linear_bwd_tma_kernel(
    a_ptr, g_ptr, b_ptr, c_ptr, rowsum_ptr, ws_ptr,
    M, N, K,
    stride_a, stride_g, stride_b, stride_c,
    SCALE_A: tl.constexpr, ROWSUM: tl.constexpr, A_T: tl.constexpr, B_T: tl.constexpr, SPLIT_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    NUM_PROGRAMS: tl.constexpr, WARP_SPECIALIZE: tl.constexpr,
):
    """C = (A * G) B^T (SCALE_A: the dz = dy * act'(z) prologue; G stored like A), and the row sums of A * G
    (ROWSUM: dbias, fp32). A [M, K] (A_T: stored [K, M]), B [N, K] (B_T: stored [K, N]), C [M, N].
    SPLIT_K > 1: fp32 partials into ws [SPLIT_K, M, N] and rowsum [SPLIT_K, M], summed afterwards."""
    a_desc = _operand_desc(a_ptr, M, K, stride_a, BLOCK_M, BLOCK_K, A_T)
    b_desc = _operand_desc(b_ptr, N, K, stride_b, BLOCK_N, BLOCK_K, B_T)
    if SCALE_A:
        g_desc = _operand_desc(g_ptr, M, K, stride_g, BLOCK_M, BLOCK_K, A_T)
    if SPLIT_K > 1:
        ws_desc = _partials_desc(ws_ptr, M, N, SPLIT_K, BLOCK_M, BLOCK_N)
    else:
        c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[stride_c, 1],
                                           block_shape=[BLOCK_M, BLOCK_N])
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    k_per_split = tl.cdiv(k_tiles, SPLIT_K)
    for work in tl.range(tl.program_id(0), num_pid_m * num_pid_n * SPLIT_K, NUM_PROGRAMS, flatten=False,
                         warp_specialize=WARP_SPECIALIZE):
        split = work % SPLIT_K
        pid_m, pid_n = grouped_tile(work // SPLIT_K, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        rowsum = tl.zeros((BLOCK_M,), tl.float32)
        for kb in range(split * k_per_split, tl.minimum(k_tiles, (split + 1) * k_per_split)):
            a = _load_rows_k(a_desc, off_m, kb * BLOCK_K, A_T)
            if SCALE_A:
                # The prologue in fp32, rounded once to the input dtype for the matrix unit.
                dz = a.to(tl.float32) * _load_rows_k(g_desc, off_m, kb * BLOCK_K, A_T).to(tl.float32)
                if ROWSUM:
                    rowsum += tl.sum(dz, 1)
                a = dz.to(a.dtype)
            elif ROWSUM:
                rowsum += tl.sum(a.to(tl.float32), 1)
            b = _load_k_cols(b_desc, off_n, kb * BLOCK_K, B_T)
            acc = tl.dot(a, b, acc, input_precision="ieee")
        if SPLIT_K > 1:
            ws_desc.store([split * num_pid_m * BLOCK_M + off_m, off_n], acc)
        else:
            c_desc.store([off_m, off_n], acc.to(c_ptr.dtype.element_ty))
        if ROWSUM:
            # Every column of tiles streams the whole of A; the first column's tiles own the result.
            offs_m = off_m + tl.arange(0, BLOCK_M)
            owned_rows = tl.where(pid_n == 0, M, 0)
            tl.store(rowsum_ptr + split * M + offs_m, rowsum, mask=offs_m < owned_rows)


@triton.jit
def _splitk_epilogue_kernel(
    ws_ptr, bias_ptr, res_ptr, y_ptr, g_ptr,
    M, N, M_pad,
    stride_r, stride_y, stride_g,
    ACTIVATION: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, SAVE_GRAD: tl.constexpr,
    SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    """y = act(sum_s ws[s] + b) + r (and g = act'): the split-K products' reduction and epilogue, one [M, N]
    tile per program; the backward products use it with no epilogue flags. ws: [SPLIT_K, M_pad, N] fp32."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    rows = offs_m.to(tl.int64)[:, None]
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for s in range(SPLIT_K):
        acc += tl.load(ws_ptr + (rows + s * M_pad) * N + offs_n[None, :], mask=mask, other=0.0)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
    if SAVE_GRAD:
        tl.store(g_ptr + rows * stride_g + offs_n[None, :], activation_grad(acc, ACTIVATION).to(g_ptr.dtype.element_ty),
                 mask=mask)
    y = apply_activation(acc, ACTIVATION)
    if HAS_RESIDUAL:
        y += tl.load(res_ptr + rows * stride_r + offs_n[None, :], mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + rows * stride_y + offs_n[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)
