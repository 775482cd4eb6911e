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

Which kernel runs each product (the launchers below):
- sm_90 / sm_100 with descriptor-friendly operands (a unit-stride dim, 16-byte aligned rows): the persistent,
  warp-specialized TMA kernels of kernels/linear_tma.py (with split-K for few tiles and a long K);
- otherwise (sm_80, AMD, RDNA, unaligned operands, decode-sized M) the pointer kernels in this file; on AMD
  CDNA the backward products run a persistent grid sized to the CUs (matmul_config.PERSISTENT_PRODUCTS) and
  read reduction-contiguous copies of their transposed operands (PRETRANSPOSE_FAMILIES): MFMA
  operands then come from LDS by ds_read_b128, never one bf16 at a time;
- whether our kernel runs at all, or the vendor BLAS, is decided above this layer (ops/linear.py, by
  matmul_config.gemm_provider).
dbias is accumulated in fp32 and rounded on the host.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from wavefront import runtime
from wavefront.kernels import linear_tma
from wavefront.kernels._launch import ensure_descriptor_allocator, launch
from wavefront.kernels._program_order import grouped_tile, xcd_remap
from wavefront.kernels.linear_epilogue import activation_grad, apply_activation
from wavefront.kernels.matmul_config import (
    PRETRANSPOSE_FAMILIES,
    SPLITK_EPILOGUE,
    TileConfig,
    gemm_config,
    num_xcds,
    persistent_programs,
    split_k,
    tma_config,
)


@triton.jit
def _tile_offsets(tile, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr,
                  NUM_XCDS: tl.constexpr):
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid = xcd_remap(tile, num_pid_m * num_pid_n, NUM_XCDS)
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
def _fwd_tile(tile, x_ptr, w_ptr, bias_ptr, res_ptr, y_ptr, g_ptr, M, N, K, stride_xm, stride_xk, stride_wn, stride_wk,
              stride_rm, stride_rn, stride_ym, stride_yn, stride_gm, stride_gn, ACTIVATION: tl.constexpr,
              HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, SAVE_GRAD: tl.constexpr, EVEN_K: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
              NUM_XCDS: tl.constexpr):
    _, offs_m, offs_n = _tile_offsets(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M, NUM_XCDS)
    acc, _ = _mainloop(x_ptr, x_ptr, w_ptr, offs_m, offs_n, M, N, K, stride_xm, stride_xk, 0, 0, stride_wn,
                       stride_wk, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, False, False)
    rows = offs_m.to(tl.int64)[:, None]
    cols = offs_n[None, :]
    out_mask = (rows < M) & (cols < N)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
    if SAVE_GRAD:
        tl.store(g_ptr + rows * stride_gm + cols * stride_gn, activation_grad(acc, ACTIVATION).to(g_ptr.dtype.element_ty),
                 mask=out_mask)
    y = apply_activation(acc, ACTIVATION)
    if HAS_RESIDUAL:
        y += tl.load(res_ptr + rows * stride_rm + cols * stride_rn, mask=out_mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + rows * stride_ym + cols * stride_yn, y.to(y_ptr.dtype.element_ty), mask=out_mask)


@triton.jit
def _linear_fwd_kernel(
    x_ptr, w_ptr, bias_ptr, res_ptr, y_ptr, g_ptr,
    M, N, K,
    stride_xm, stride_xk, stride_wn, stride_wk, stride_rm, stride_rn, stride_ym, stride_yn, stride_gm, stride_gn,
    ACTIVATION: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, SAVE_GRAD: tl.constexpr,
    EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, NUM_XCDS: tl.constexpr, NUM_PROGRAMS: tl.constexpr,
):
    """NUM_PROGRAMS 0: one tile per program; > 0: a persistent grid of NUM_PROGRAMS programs walking the tiles."""
    if NUM_PROGRAMS == 0:
        _fwd_tile(tl.program_id(0), x_ptr, w_ptr, bias_ptr, res_ptr, y_ptr, g_ptr, M, N, K, stride_xm, stride_xk,
                  stride_wn, stride_wk, stride_rm, stride_rn, stride_ym, stride_yn, stride_gm, stride_gn, ACTIVATION,
                  HAS_BIAS, HAS_RESIDUAL, SAVE_GRAD, EVEN_K, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, NUM_XCDS)
    else:
        for tile in range(tl.program_id(0), tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N), NUM_PROGRAMS):
            _fwd_tile(tile, x_ptr, w_ptr, bias_ptr, res_ptr, y_ptr, g_ptr, M, N, K, stride_xm, stride_xk, stride_wn,
                      stride_wk, stride_rm, stride_rn, stride_ym, stride_yn, stride_gm, stride_gn, ACTIVATION,
                      HAS_BIAS, HAS_RESIDUAL, SAVE_GRAD, EVEN_K, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, NUM_XCDS)


@triton.jit
def _bwd_tile(tile, a_ptr, g_ptr, b_ptr, c_ptr, rowsum_ptr, M, N, K, stride_am, stride_ak, stride_gm, stride_gk,
              stride_bn, stride_bk, stride_cm, stride_cn, SCALE_A: tl.constexpr, ROWSUM: tl.constexpr,
              EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
              GROUP_M: tl.constexpr, NUM_XCDS: tl.constexpr):
    pid_n, offs_m, offs_n = _tile_offsets(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M, NUM_XCDS)
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


@triton.jit
def _linear_bwd_kernel(
    a_ptr, g_ptr, b_ptr, c_ptr, rowsum_ptr,
    M, N, K,
    stride_am, stride_ak, stride_gm, stride_gk, stride_bn, stride_bk, stride_cm, stride_cn,
    SCALE_A: tl.constexpr, ROWSUM: tl.constexpr, EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    NUM_XCDS: tl.constexpr, NUM_PROGRAMS: tl.constexpr,
):
    """NUM_PROGRAMS as in _linear_fwd_kernel."""
    if NUM_PROGRAMS == 0:
        _bwd_tile(tl.program_id(0), a_ptr, g_ptr, b_ptr, c_ptr, rowsum_ptr, M, N, K, stride_am, stride_ak, stride_gm,
                  stride_gk, stride_bn, stride_bk, stride_cm, stride_cn, SCALE_A, ROWSUM, EVEN_K, BLOCK_M, BLOCK_N,
                  BLOCK_K, GROUP_M, NUM_XCDS)
    else:
        for tile in range(tl.program_id(0), tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N), NUM_PROGRAMS):
            _bwd_tile(tile, a_ptr, g_ptr, b_ptr, c_ptr, rowsum_ptr, M, N, K, stride_am, stride_ak, stride_gm,
                      stride_gk, stride_bn, stride_bk, stride_cm, stride_cn, SCALE_A, ROWSUM, EVEN_K, BLOCK_M,
                      BLOCK_N, BLOCK_K, GROUP_M, NUM_XCDS)


# ---------------------------------------------------------------------------------------------------
# Launchers. x: [M, K] with any strides, weight [N, K] with any strides, residual [M, N]; M, N, K >= 1
# (the op layer sends empty problems to the reference). Each product runs the TMA kernels
# (kernels/linear_tma.py) when the architecture has TMA, the table has an entry for M and every operand
# qualifies for a tensor descriptor; otherwise the pointer kernels above. `tma` forces the choice (tests).


def _tma_layout(view: torch.Tensor) -> tuple[bool, int] | None:
    """(stored transposed, row stride) of a logical [rows, red] operand for a tensor descriptor, or None when
    it does not qualify: one unit-stride dimension, 16-byte aligned base and row stride."""
    if view.data_ptr() % 16:
        return None
    e = view.element_size()
    s_rows, s_red = view.stride()
    if s_red == 1 and (s_rows * e) % 16 == 0:
        return False, s_rows
    if s_rows == 1 and (s_red * e) % 16 == 0:
        return True, s_red
    return None


def _tma_plan(M: int, N: int, K: int, dtype: torch.dtype, arch: runtime.Arch, config, kind: str, tma,
              layouts) -> TileConfig | None:
    """The TMA kernels' config, or None for the pointer kernels. tma None: TMA when the architecture, the table
    and every operand allow it; True: TMA or an error; False: the pointer kernels."""
    if tma is False:
        return None
    if any(layout is None for layout in layouts):
        if tma:
            raise ValueError("linear: tma=True, but an operand does not qualify for a tensor descriptor "
                             "(a unit-stride dim, 16-byte aligned base and rows)")
        return None
    cfg = tma_config(M, N, K, dtype, arch, kind)
    if cfg is None and not tma:
        return None
    if cfg is None and config is None:
        raise ValueError(f"linear: tma=True, but {arch.name} has no TMA entry for M={M}")
    return config or cfg


def _tma_launch(kernel, cfg: TileConfig, device, splits: int, *, constexprs: dict, **named) -> torch.Tensor | None:
    """Launch a TMA kernel on a persistent grid of at most one program per SM, over `splits` K slices. With
    split-K (splits > 1) returns the fp32 partials [SPLIT_K, M_pad, N] it wrote, else None."""
    ensure_descriptor_allocator()
    M, N = named["M"], named["N"]
    work = triton.cdiv(M, cfg.BLOCK_M) * triton.cdiv(N, cfg.BLOCK_N) * splits
    programs = min(work, runtime.sm_count(device))
    if splits > 1:
        named["ws_ptr"] = torch.empty((splits, triton.cdiv(M, cfg.BLOCK_M) * cfg.BLOCK_M, N), dtype=torch.float32,
                                      device=device)
    launch(kernel, (programs,),
           constexprs=dict(constexprs, BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N, BLOCK_K=cfg.BLOCK_K,
                           GROUP_M=cfg.GROUP_M, NUM_PROGRAMS=programs, WARP_SPECIALIZE=cfg.warp_specialize),
           options={"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}, **named)
    return named["ws_ptr"] if splits > 1 else None


def _splitk_epilogue(ws: torch.Tensor, y: torch.Tensor, *, bias=None, residual=None, g=None, activation=None) -> None:
    """y = act(sum over slices of ws + bias) + residual (and g = act'), from the split-K partials."""
    splits, M_pad, N = ws.shape
    M = y.shape[0]
    cfg = SPLITK_EPILOGUE
    launch(linear_tma._splitk_epilogue_kernel, (triton.cdiv(M, cfg.BLOCK_M), triton.cdiv(N, cfg.BLOCK_N)),
           ws_ptr=ws, bias_ptr=bias, res_ptr=residual, y_ptr=y, g_ptr=g, M=M, N=N, M_pad=M_pad,
           stride_r=residual.stride(0) if residual is not None else 0, stride_y=y.stride(0),
           stride_g=g.stride(0) if g is not None else 0,
           constexprs=dict(ACTIVATION=activation or "none", HAS_BIAS=bias is not None,
                           HAS_RESIDUAL=residual is not None, SAVE_GRAD=g is not None, SPLIT_K=splits,
                           BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N),
           options={"num_warps": cfg.num_warps, "num_stages": cfg.num_stages})


def _gemm_launch(kernel, dtype: torch.dtype, arch: runtime.Arch, config, heavy: bool, *, constexprs: dict,
                 **named) -> None:
    M, N, K = named["M"], named["N"], named["K"]
    cfg = config or gemm_config(M, N, K, dtype, arch, heavy=heavy)
    tiles = triton.cdiv(M, cfg.BLOCK_M) * triton.cdiv(N, cfg.BLOCK_N)
    device = (named["x_ptr"] if "x_ptr" in named else named["a_ptr"]).device
    product = "fwd" if kernel is _linear_fwd_kernel else "bwd"
    programs = persistent_programs(tiles, cfg, arch, runtime.sm_count(device), product)
    launch(kernel, (programs or tiles,),
           constexprs=dict(constexprs, EVEN_K=K % cfg.BLOCK_K == 0, BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N,
                           BLOCK_K=cfg.BLOCK_K, GROUP_M=cfg.GROUP_M, NUM_XCDS=num_xcds(arch), NUM_PROGRAMS=programs),
           options=cfg.options(arch), **named)


def linear_fwd(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor | None,
               activation: str | None, save_grad: bool, *, arch: runtime.Arch | None = None,
               config: TileConfig | None = None, tma: bool | None = None, splits: int | None = None):
    """Returns (y [M, N], g [M, N] or None): g = act'(z), written when save_grad (needs an activation).
    tma / splits force the path and the split-K count (tests); by default the config tables decide."""
    arch = arch or runtime.arch(x.device)
    M, K = x.shape
    N = weight.shape[0]
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    g = torch.empty((M, N), dtype=x.dtype, device=x.device) if save_grad else None
    epilogue = dict(ACTIVATION=activation or "none", HAS_BIAS=bias is not None, HAS_RESIDUAL=residual is not None,
                    SAVE_GRAD=save_grad)
    x_l, w_l, y_l = _tma_layout(x), _tma_layout(weight), _tma_layout(y)
    layouts = [x_l if x_l and not x_l[0] else None, w_l, y_l]
    if residual is not None:
        r_l = _tma_layout(residual)
        layouts.append(r_l if r_l and not r_l[0] else None)
    kind = "epilogue" if activation else "residual" if residual is not None else "light"
    cfg = _tma_plan(M, N, K, x.dtype, arch, config, kind, tma, layouts)
    if cfg is not None:
        assert x_l is not None and w_l is not None  # a TMA config means every layout qualified (_tma_plan)
        n_splits = splits or split_k(M, N, K, cfg, runtime.sm_count(x.device))
        operands = dict(x_ptr=x, w_ptr=weight, M=M, N=N, K=K, stride_x=x_l[1], stride_w=w_l[1])
        if n_splits > 1:
            # The K slices' partials; the epilogue runs after them in _splitk_epilogue_kernel.
            ws = _tma_launch(linear_tma._linear_fwd_tma_splitk_kernel, cfg, x.device, n_splits, ws_ptr=None,
                             **operands, constexprs=dict(W_T=w_l[0], SPLIT_K=n_splits))
        else:
            ws = _tma_launch(
                linear_tma._linear_fwd_tma_kernel, cfg, x.device, 1, **operands,
                bias_ptr=bias, res_ptr=residual, y_ptr=y, g_ptr=g,
                stride_r=residual.stride(0) if residual is not None else 0,
                stride_y=y.stride(0), stride_g=g.stride(0) if g is not None else 0,
                constexprs=dict(epilogue, W_T=w_l[0]),
            )
        if ws is not None:
            _splitk_epilogue(ws, y, bias=bias, residual=residual, g=g, activation=activation)
        return y, g
    _gemm_launch(
        _linear_fwd_kernel, x.dtype, arch, config, activation is not None or residual is not None,
        x_ptr=x, w_ptr=weight, bias_ptr=bias, res_ptr=residual, y_ptr=y, g_ptr=g, M=M, N=N, K=K,
        stride_xm=x.stride(0), stride_xk=x.stride(1), stride_wn=weight.stride(0), stride_wk=weight.stride(1),
        stride_rm=residual.stride(0) if residual is not None else 0,
        stride_rn=residual.stride(1) if residual is not None else 0,
        stride_ym=y.stride(0), stride_yn=y.stride(1),
        stride_gm=g.stride(0) if g is not None else 0, stride_gn=g.stride(1) if g is not None else 0,
        constexprs=epilogue,
    )
    return y, g


def _bwd_product(a: torch.Tensor, g: torch.Tensor | None, b: torch.Tensor, c: torch.Tensor,
                 rowsum: torch.Tensor | None, arch: runtime.Arch, config, tma, splits) -> None:
    """c = (a * g) b^T for logical views a [M, K], g like a (or None), b [N, K]; rowsum = row sums of a * g."""
    M, K = a.shape
    N = b.shape[0]
    a_l, b_l, c_l = _tma_layout(a), _tma_layout(b), _tma_layout(c)
    g_l = _tma_layout(g) if g is not None else a_l
    same_g = g_l is not None and a_l is not None and g_l[0] == a_l[0]
    layouts = [a_l, b_l, c_l if c_l and not c_l[0] else None, g_l if same_g else None]
    flags = dict(SCALE_A=g is not None, ROWSUM=rowsum is not None)
    cfg = _tma_plan(M, N, K, a.dtype, arch, config, "light" if g is None else "prologue", tma, layouts)
    if cfg is not None:
        n_splits = splits or split_k(M, N, K, cfg, runtime.sm_count(a.device))
        partial_sums = None
        if rowsum is not None and n_splits > 1:
            partial_sums = torch.empty((n_splits, M), dtype=torch.float32, device=a.device)
        ws = _tma_launch(
            linear_tma._linear_bwd_tma_kernel, cfg, a.device, n_splits,
            a_ptr=a, g_ptr=g if g is not None else a, b_ptr=b, c_ptr=c,
            rowsum_ptr=rowsum if partial_sums is None else partial_sums, ws_ptr=None, M=M, N=N, K=K,
            stride_a=a_l[1], stride_g=g_l[1], stride_b=b_l[1], stride_c=c.stride(0),
            constexprs=dict(flags, A_T=a_l[0], B_T=b_l[0], SPLIT_K=n_splits),
        )
        if ws is not None:
            _splitk_epilogue(ws, c)
        if partial_sums is not None:
            torch.sum(partial_sums, 0, out=rowsum)
        return
    g_or_a = g if g is not None else a
    _gemm_launch(
        _linear_bwd_kernel, a.dtype, arch, config, True,
        a_ptr=a, g_ptr=g_or_a, b_ptr=b, c_ptr=c, rowsum_ptr=rowsum, M=M, N=N, K=K,
        stride_am=a.stride(0), stride_ak=a.stride(1), stride_gm=g_or_a.stride(0), stride_gk=g_or_a.stride(1),
        stride_bn=b.stride(0), stride_bk=b.stride(1), stride_cm=c.stride(0), stride_cn=c.stride(1),
        constexprs=flags,
    )


def linear_bwd(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, g: torch.Tensor | None, needs_dx: bool,
               needs_dw: bool, has_bias: bool, *, arch: runtime.Arch | None = None,
               config: TileConfig | None = None, tma: bool | None = None, splits: int | None = None):
    """Returns (dx [M, K] or None, dweight [N, K] or None, dbias [N] or None).

    dy: [M, N]; g: the saved act'(z) (None without an activation): dz = dy * g.
    """
    arch = arch or runtime.arch(x.device)
    M, K = x.shape
    N = weight.shape[0]
    pretranspose = arch.family in PRETRANSPOSE_FAMILIES
    dx = dw = db = None
    if needs_dx:
        # dx [M, K] = dz [M, N] @ (W^T [K, N])^T
        dx = torch.empty((M, K), dtype=x.dtype, device=x.device)
        w_t = weight.t().contiguous() if pretranspose else weight.t()
        _bwd_product(dy, g, w_t, dx, None, arch, config, tma, splits)
    if needs_dw or has_bias:
        # dW [N, K] = dz^T [N, M] @ (x^T [K, M])^T; db = the row sums of dz^T, from the same pass.
        dw = torch.empty((N, K), dtype=weight.dtype, device=x.device)
        # dbias accumulates into fp32 and is rounded on the host: a 16-bit row-sum store would reach memory
        # through a narrow (ds_write_b16 / ds_read_u16) shared-memory layout conversion on AMD.
        db = torch.empty((N,), dtype=torch.float32, device=x.device) if has_bias else None
        if pretranspose:
            # One pass forms dz^T contiguous (the product rounded once, as the prologue rounds it).
            dz_t = torch.empty((N, M), dtype=dy.dtype, device=dy.device)
            if g is None:
                dz_t.copy_(dy.t())
            else:
                torch.mul(dy.t(), g.t(), out=dz_t)
            _bwd_product(dz_t, None, x.t().contiguous(), dw, db, arch, config, tma, splits)
        else:
            _bwd_product(dy.t(), None if g is None else g.t(), x.t(), dw, db, arch, config, tma, splits)
        if not needs_dw:
            dw = None
        if db is not None:
            db = db.to(weight.dtype)
    return dx, dw, db
