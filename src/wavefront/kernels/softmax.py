"""Softmax over the last dim, forward and backward.

Per row:  m = max(x),  e = 2^((x - m) * log2(e)),  y = e / sum(e)
Backward: dx = y * (dy - sum(dy * y))            (saved for backward: y, the output)

exp2 with log2(e) folded into the scaled difference maps to one hardware instruction on both vendors
(ex2.approx on NVIDIA, v_exp_f32 on AMD). Accumulation is fp32 (fp64 for fp64 inputs); masked lanes load
-inf so they contribute exp2(-inf) = 0.

Rows that fit one block are read once: forward reads x (2n B for 16-bit) and writes y (2n B), 4n B for
about 4n FLOP; backward reads y, dy and writes dx, 6n B. Wider rows use an online max/sum (one pass for the
statistics, rescaling the running sum when the max grows) and a second pass to write y.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from wavefront import runtime
from wavefront.kernels._heuristics import acc_dtype
from wavefront.kernels._launch import launch
from wavefront.kernels.row_config import row_config


@triton.jit
def _softmax_fwd_kernel(x_ptr, y_ptr, n_cols, stride_x_row, stride_y_row,
                        SINGLE_PASS: tl.constexpr, BLOCK_N: tl.constexpr, ACC: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_x_row
    y_row = y_ptr + row * stride_y_row
    cols0 = tl.arange(0, BLOCK_N)
    log2e: tl.constexpr = 1.4426950408889634
    if SINGLE_PASS:
        mask = cols0 < n_cols
        x = tl.load(x_row + cols0, mask=mask, other=-float("inf")).to(ACC)
        e = tl.exp2((x - tl.max(x, axis=0)) * log2e)
        y = e / tl.sum(e, axis=0)
        tl.store(y_row + cols0, y.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        m = tl.full((), -float("inf"), dtype=ACC)
        s = tl.zeros((), dtype=ACC)
        for start in range(0, n_cols, BLOCK_N):
            cols = start + cols0
            x = tl.load(x_row + cols, mask=cols < n_cols, other=-float("inf")).to(ACC)
            m_new = tl.maximum(m, tl.max(x, axis=0))
            # The running sum was relative to the old max: rescale it (exp2(-inf) = 0 on the first block).
            s = s * tl.exp2((m - m_new) * log2e) + tl.sum(tl.exp2((x - m_new) * log2e), axis=0)
            m = m_new
        inv_s = 1.0 / s
        for start in range(0, n_cols, BLOCK_N):
            cols = start + cols0
            mask = cols < n_cols
            x = tl.load(x_row + cols, mask=mask, other=-float("inf")).to(ACC)
            y = tl.exp2((x - m) * log2e) * inv_s
            tl.store(y_row + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _softmax_bwd_kernel(y_ptr, dy_ptr, dx_ptr, n_cols, stride_y_row, stride_dy_row, stride_dx_row,
                        SINGLE_PASS: tl.constexpr, BLOCK_N: tl.constexpr, ACC: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    y_row = y_ptr + row * stride_y_row
    dy_row = dy_ptr + row * stride_dy_row
    dx_row = dx_ptr + row * stride_dx_row
    cols0 = tl.arange(0, BLOCK_N)
    if SINGLE_PASS:
        mask = cols0 < n_cols
        y = tl.load(y_row + cols0, mask=mask, other=0.0).to(ACC)
        dy = tl.load(dy_row + cols0, mask=mask, other=0.0).to(ACC)
        dx = y * (dy - tl.sum(y * dy, axis=0))
        tl.store(dx_row + cols0, dx.to(dx_ptr.dtype.element_ty), mask=mask)
    else:
        dot = tl.zeros((), dtype=ACC)
        for start in range(0, n_cols, BLOCK_N):
            cols = start + cols0
            mask = cols < n_cols
            y = tl.load(y_row + cols, mask=mask, other=0.0).to(ACC)
            dy = tl.load(dy_row + cols, mask=mask, other=0.0).to(ACC)
            dot += tl.sum(y * dy, axis=0)
        for start in range(0, n_cols, BLOCK_N):
            cols = start + cols0
            mask = cols < n_cols
            y = tl.load(y_row + cols, mask=mask, other=0.0).to(ACC)
            dy = tl.load(dy_row + cols, mask=mask, other=0.0).to(ACC)
            tl.store(dx_row + cols, (y * (dy - dot)).to(dx_ptr.dtype.element_ty), mask=mask)


def softmax_fwd(x: torch.Tensor) -> torch.Tensor:
    """x: [n_rows, n_cols] with unit column stride."""
    n_rows, n_cols = x.shape
    y = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
    if n_rows == 0:
        return y
    cfg = row_config(n_cols, x.dtype, runtime.arch(x.device))
    launch(_softmax_fwd_kernel, (n_rows,), x_ptr=x, y_ptr=y, n_cols=n_cols, stride_x_row=x.stride(0),
           stride_y_row=y.stride(0),
           constexprs=dict(SINGLE_PASS=cfg.single_pass, BLOCK_N=cfg.BLOCK_N, ACC=acc_dtype(x.dtype)),
           options=cfg.options())
    return y


def softmax_bwd(dy: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    n_rows, n_cols = y.shape
    dx = torch.empty((n_rows, n_cols), dtype=y.dtype, device=y.device)
    if n_rows == 0:
        return dx
    cfg = row_config(n_cols, y.dtype, runtime.arch(y.device))
    launch(_softmax_bwd_kernel, (n_rows,), y_ptr=y, dy_ptr=dy, dx_ptr=dx, n_cols=n_cols,
           stride_y_row=y.stride(0), stride_dy_row=dy.stride(0), stride_dx_row=dx.stride(0),
           constexprs=dict(SINGLE_PASS=cfg.single_pass, BLOCK_N=cfg.BLOCK_N, ACC=acc_dtype(y.dtype)),
           options=cfg.options())
    return dx

