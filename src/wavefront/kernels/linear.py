"""Linear with a fused epilogue, forward and backward: one tiled GEMM kernel with a fused prologue for the
backward products.

Forward (torch.nn.functional.linear semantics, weight stored [N, K]):

    z = x W^T + b                          x [M, K], W [N, K], b [N]       (fp32 accumulator)
    y = act(z) + r                         act in {none, relu, gelu, gelu_tanh, silu}, r [M, N] residual

The bias, the activation and the residual are applied to the fp32 accumulator before the single rounding
to the output dtype, so they cost no pass over memory (eager: three extra reads and writes of [M, N]).
With an activation and gradients required, the epilogue also writes g = act'(z) (input dtype) for
backward: recomputing z would cost a full GEMM; saving z and differentiating in the backward would put
the transcendental act' (erf, exp) inside the backward GEMMs' K loops, where each element of z is
revisited once per output tile column: about 64 evaluations per element for a Llama MLP projection,
more fp32 work than the matrix units' share of the product, and on sm_80 the branchy erf made ptxas spill
3 KB per thread. Saving g costs the same one [M, N] write as saving z.

Backward (the residual's gradient is dy itself):

    dz = dy * g                            applied in the GEMM prologue: each dy tile is multiplied by the
                                           saved g tile right after it is loaded, in fp32, then rounded to
                                           the input dtype for the matrix unit
    dx = dz W                              [M, N] x [N, K]
    dW = dz^T x                            [N, M] x [M, K]
    db = sum_rows dz                       accumulated by the dW product's programs as they stream dz

    act'(z): relu 1[z > 0]; gelu Phi(z) + z phi(z); gelu_tanh
    0.5 (1 + t) + 0.5 z (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 z^2), t = tanh(sqrt(2/pi) (z + 0.044715 z^3));
    silu s (1 + z (1 - s)), s = sigmoid(z).

All three products are the same kernel, ``C = epilogue(prologue(A) B^T)``, given strided views:
forward A = x, B = W; dx: A = dy [M, N], B = W^T (a [K, N] view); dW: A = dy^T (an [N, M] view), B = x^T.
No operand is copied or transposed in memory: the kernel takes both strides of every operand.

Saved for backward: x, W, and g = act'(z) when there is an activation. Bias-only and no-epilogue calls
save nothing extra.

FLOPs: 2 M N K forward, 4 M N K backward. Bytes (16-bit, minimum): forward reads x, W, b, r and writes
y: 2 (M K + N K + N + 2 M N) (+ 2 M N for g). Intensity at M = 8192, N = K = 4096: about 2000 FLOP/B:
compute bound, tiles sized for the matrix units.

Ragged shapes: rows and columns past M or N are read from wrapped indices (``% M``) so loads need no
mask, and masked only at the store; the K loop masks its last tile unless K is a multiple of BLOCK_K.
Programs walk tiles in grouped order and, on MI300X, XCD-remapped order (kernels/_program_order.py).
Row offsets are int64 before they multiply a stride.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from wavefront import runtime
from wavefront.kernels._launch import launch
from wavefront.kernels._program_order import grouped_tile, xcd_remap
from wavefront.kernels.matmul_config import TileConfig, gemm_config, num_xcds

# Globals read inside @triton.jit functions must be constexpr (the compiler rejects plain floats; the
# interpreter does not, so only the ahead-of-time compile test catches it). In expressions they follow a
# tensor operand: the interpreter turns `constexpr * tensor` into a constexpr wrapping a tensor.
SQRT1_2 = tl.constexpr(0.7071067811865476)
SQRT_2_OVER_PI = tl.constexpr(0.7978845608028654)
INV_SQRT_2PI = tl.constexpr(0.3989422804014327)
GELU_C = tl.constexpr(0.044715)


@triton.jit
def _tanh(u):
    # 1 - 2 / (e^{2u} + 1): saturates cleanly to +-1 (e^{2u} -> inf or 0) without a libdevice call.
    return 1.0 - 2.0 / (tl.math.exp2(u * 2.8853900817779268) + 1.0)


@triton.jit
def _activation(z, ACTIVATION: tl.constexpr):
    if ACTIVATION == "relu":
        y = tl.maximum(z, 0.0, propagate_nan=tl.PropagateNan.ALL)
    elif ACTIVATION == "gelu":
        y = 0.5 * z * (1.0 + tl.math.erf(z * SQRT1_2))
    elif ACTIVATION == "gelu_tanh":
        y = 0.5 * z * (1.0 + _tanh((z + z * z * z * GELU_C) * SQRT_2_OVER_PI))
    elif ACTIVATION == "silu":
        y = z * tl.sigmoid(z)
    else:
        y = z
    return y


@triton.jit
def _activation_grad(z, ACTIVATION: tl.constexpr):
    if ACTIVATION == "relu":
        d = tl.where(z > 0.0, 1.0, 0.0)
    elif ACTIVATION == "gelu":
        d = 0.5 * (1.0 + tl.math.erf(z * SQRT1_2)) + z * INV_SQRT_2PI * tl.math.exp(-0.5 * z * z)
    elif ACTIVATION == "gelu_tanh":
        t = _tanh((z + z * z * z * GELU_C) * SQRT_2_OVER_PI)
        d = 0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * SQRT_2_OVER_PI * (1.0 + z * z * GELU_C * 3.0)
    else:  # silu
        s = tl.sigmoid(z)
        d = s * (1.0 + z * (1.0 - s))
    return d


@triton.jit
def _tile_offsets(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr,
                  NUM_XCDS: tl.constexpr):
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid = xcd_remap(tl.program_id(0), num_pid_m * num_pid_n, NUM_XCDS)
    pid_m, pid_n = grouped_tile(pid, num_pid_m, num_pid_n, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    return pid_n, offs_m, offs_n


@triton.jit
def _mainloop(a_ptr, g_ptr, b_ptr, offs_m, offs_n, M, N, K, stride_am, stride_ak, stride_gm, stride_gk,
              stride_bn, stride_bk, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
              EVEN_K: tl.constexpr, SCALE_A: tl.constexpr, ROWSUM: tl.constexpr):
    """acc = prologue(A)[offs_m, :] @ B[offs_n, :]^T in fp32, and the row sums of prologue(A) if ROWSUM.
    SCALE_A: the prologue multiplies A elementwise by G (same shape and strides as A)."""
    # Wrapped rows: every load is in bounds, so the loads carry no row mask; the store masks them.
    rows_a = tl.max_contiguous(tl.multiple_of(offs_m % M, BLOCK_M), BLOCK_M).to(tl.int64)
    rows_b = tl.max_contiguous(tl.multiple_of(offs_n % N, BLOCK_N), BLOCK_N).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rows_a[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + rows_b[:, None] * stride_bn + offs_k[None, :] * stride_bk
    if SCALE_A:
        g_ptrs = g_ptr + rows_a[:, None] * stride_gm + offs_k[None, :] * stride_gk
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    rowsum = tl.zeros((BLOCK_M,), tl.float32)
    for kb in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            k_ok = offs_k[None, :] < K - kb * BLOCK_K
            a = tl.load(a_ptrs, mask=k_ok, other=0.0)
            b = tl.load(b_ptrs, mask=k_ok, other=0.0)
        if SCALE_A:
            if EVEN_K:
                g = tl.load(g_ptrs)
            else:
                g = tl.load(g_ptrs, mask=k_ok, other=0.0)
            dz = a.to(tl.float32) * g.to(tl.float32)
            if ROWSUM:
                rowsum += tl.sum(dz, 1)
            a = dz.to(a.dtype)
            g_ptrs += BLOCK_K * stride_gk
        elif ROWSUM:
            rowsum += tl.sum(a.to(tl.float32), 1)
        # fp32 operands get IEEE fp32 products (eager fp32 semantics); 16-bit operands use the MMA.
        acc = tl.dot(a, tl.trans(b), acc, input_precision="ieee")
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    return acc, rowsum


@triton.jit
def _linear_fwd_kernel(
    x_ptr, w_ptr, bias_ptr, res_ptr, y_ptr, g_ptr,
    M, N, K,
    stride_xm, stride_xk, stride_wn, stride_wk, stride_rm, stride_rn, stride_ym, stride_yn, stride_gm, stride_gn,
    ACTIVATION: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, SAVE_GRAD: tl.constexpr,
    EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, NUM_XCDS: tl.constexpr,
):
    _, offs_m, offs_n = _tile_offsets(M, N, BLOCK_M, BLOCK_N, GROUP_M, NUM_XCDS)
    acc, _ = _mainloop(x_ptr, x_ptr, w_ptr, offs_m, offs_n, M, N, K, stride_xm, stride_xk, 0, 0, stride_wn,
                       stride_wk, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, False, False)
    rows = offs_m.to(tl.int64)[:, None]
    cols = offs_n[None, :]
    out_mask = (rows < M) & (cols < N)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
    if SAVE_GRAD:
        tl.store(g_ptr + rows * stride_gm + cols * stride_gn, _activation_grad(acc, ACTIVATION).to(g_ptr.dtype.element_ty),
                 mask=out_mask)
    y = _activation(acc, ACTIVATION)
    if HAS_RESIDUAL:
        y += tl.load(res_ptr + rows * stride_rm + cols * stride_rn, mask=out_mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + rows * stride_ym + cols * stride_yn, y.to(y_ptr.dtype.element_ty), mask=out_mask)


@triton.jit
def _linear_bwd_kernel(
    a_ptr, g_ptr, b_ptr, c_ptr, rowsum_ptr,
    M, N, K,
    stride_am, stride_ak, stride_gm, stride_gk, stride_bn, stride_bk, stride_cm, stride_cn,
    SCALE_A: tl.constexpr, ROWSUM: tl.constexpr, EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    NUM_XCDS: tl.constexpr,
):
    pid_n, offs_m, offs_n = _tile_offsets(M, N, BLOCK_M, BLOCK_N, GROUP_M, NUM_XCDS)
    acc, rowsum = _mainloop(a_ptr, g_ptr, b_ptr, offs_m, offs_n, M, N, K, stride_am, stride_ak, stride_gm,
                            stride_gk, stride_bn, stride_bk, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, SCALE_A, ROWSUM)
    rows = offs_m.to(tl.int64)[:, None]
    cols = offs_n[None, :]
    tl.store(c_ptr + rows * stride_cm + cols * stride_cn, acc.to(c_ptr.dtype.element_ty),
             mask=(rows < M) & (cols < N))
    if ROWSUM:
        # Every column of programs streams the whole of A; the first column's programs own the result.
        owned_rows = tl.where(pid_n == 0, M, 0)
        tl.store(rowsum_ptr + offs_m, rowsum.to(rowsum_ptr.dtype.element_ty), mask=offs_m < owned_rows)


# ---------------------------------------------------------------------------------------------------
# Launchers. x: [M, K] with any strides, weight [N, K] with any strides, residual [M, N]; M, N, K >= 1
# (the op layer sends empty problems to the reference).


def _gemm_launch(kernel, M: int, N: int, K: int, dtype: torch.dtype, arch: runtime.Arch, config, heavy: bool,
                 *args, constexprs: dict) -> None:
    cfg = config or gemm_config(M, N, K, dtype, arch, heavy=heavy)
    grid = (triton.cdiv(M, cfg.BLOCK_M) * triton.cdiv(N, cfg.BLOCK_N),)
    launch(kernel, grid, *args,
           constexprs=dict(constexprs, EVEN_K=K % cfg.BLOCK_K == 0, BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N,
                           BLOCK_K=cfg.BLOCK_K, GROUP_M=cfg.GROUP_M, NUM_XCDS=num_xcds(arch)),
           options=cfg.options(arch))


def linear_fwd(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor | None,
               activation: str | None, save_grad: bool, *, arch: runtime.Arch | None = None,
               config: TileConfig | None = None):
    """Returns (y [M, N], g [M, N] or None): g = act'(z), written when save_grad (needs an activation)."""
    arch = arch or runtime.arch(x.device)
    M, K = x.shape
    N = weight.shape[0]
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    g = torch.empty((M, N), dtype=x.dtype, device=x.device) if save_grad else None
    _gemm_launch(
        _linear_fwd_kernel, M, N, K, x.dtype, arch, config, activation is not None or residual is not None,
        x, weight, bias, residual, y, g, M, N, K,
        x.stride(0), x.stride(1), weight.stride(0), weight.stride(1),
        *(residual.stride() if residual is not None else (0, 0)), y.stride(0), y.stride(1),
        *(g.stride() if g is not None else (0, 0)),
        constexprs=dict(ACTIVATION=activation or "none", HAS_BIAS=bias is not None,
                        HAS_RESIDUAL=residual is not None, SAVE_GRAD=save_grad),
    )
    return y, g


def linear_bwd(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, g: torch.Tensor | None, needs_dx: bool,
               needs_dw: bool, has_bias: bool, *, arch: runtime.Arch | None = None,
               config: TileConfig | None = None):
    """Returns (dx [M, K] or None, dweight [N, K] or None, dbias [N] or None).

    dy: [M, N]; g: the saved act'(z) (None without an activation): dz = dy * g.
    """
    arch = arch or runtime.arch(x.device)
    M, K = x.shape
    N = weight.shape[0]
    g_or_dy = g if g is not None else dy
    dx = dw = db = None
    if needs_dx:
        # dx [M, K] = dz [M, N] @ (W^T [K, N])^T
        dx = torch.empty((M, K), dtype=x.dtype, device=x.device)
        _gemm_launch(
            _linear_bwd_kernel, M, K, N, x.dtype, arch, config, True,
            dy, g_or_dy, weight, dx, None, M, K, N,
            dy.stride(0), dy.stride(1), g_or_dy.stride(0), g_or_dy.stride(1),
            weight.stride(1), weight.stride(0), dx.stride(0), dx.stride(1),
            constexprs=dict(SCALE_A=g is not None, ROWSUM=False),
        )
    if needs_dw or has_bias:
        # dW [N, K] = dz^T [N, M] @ (x^T [K, M])^T; db = the row sums of dz^T, from the same pass.
        dw = torch.empty((N, K), dtype=weight.dtype, device=x.device)
        db = torch.empty((N,), dtype=weight.dtype, device=x.device) if has_bias else None
        _gemm_launch(
            _linear_bwd_kernel, N, K, M, x.dtype, arch, config, True,
            dy, g_or_dy, x, dw, db, N, K, M,
            dy.stride(1), dy.stride(0), g_or_dy.stride(1), g_or_dy.stride(0),
            x.stride(1), x.stride(0), dw.stride(0), dw.stride(1),
            constexprs=dict(SCALE_A=g is not None, ROWSUM=has_bias),
        )
        if not needs_dw:
            dw = None
    return dx, dw, db
