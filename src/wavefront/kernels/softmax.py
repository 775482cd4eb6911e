"""Softmax over the last dim, forward and backward.

Per row:  m = max(x),  e = 2^((x - m) * log2(e)),  y = e / sum(e)
Backward: dx = y * (dy - sum(dy * y))            (saved for backward: y, the output)

exp2 with log2(e) folded into the scaled difference maps to one hardware instruction on both vendors
(ex2.approx on NVIDIA, v_exp_f32 on AMD). Accumulation is fp32 (fp64 for fp64 inputs); masked lanes load
-inf so they contribute exp2(-inf) = 0.

Rows that fit one block are read once: forward reads x (2n B for 16-bit) and writes y (2n B), 4n B for
about 4n FLOP; backward reads y, dy and writes dx, 6n B. Wider rows use an online max/sum (one pass for the
statistics, rescaling the running sum when the max grows) and a second pass to write y.

Barriers: at most one block-wide barrier per row (row_config.py, "Barriers"). The forward takes each
thread's 16-byte vector as one group ([BLOCK_N / VEC, VEC], the second axis inside the thread): the
group's max and sum of exponentials in registers, then the groups' (max, sum) pairs merge with the online
rule in a single reduction whose fp32 pair travels packed in 64 bits (shuffles, then one shared-memory
exchange behind one barrier). Wide rows keep the per-group running pair across their column blocks, so
the loop has no cross-thread exchange at all, and reduce once after it. The backward's dot product
sum(dy * y) is one reduction (wide rows: per-lane partials across the blocks, reduced once after the loop).
Before (Triton 3.9, sm_90, `wavefront inspect`): forward 3 barriers per row (max, a write-after-read
barrier, sum), 4 per 8192-column block of a wide row; backward 2 per block of a wide row. After: 1
everywhere, on all six targets. The exp2 count per element is 1 (narrow rows: 2, the output re-derived
from x - max for accuracy, see the kernel).
Predicted (modelled, never measured): at 4 B per element (bf16 in and out) an H100 (3.35 TB/s) moves
0.84 G elements/ms; 2 exp2 per element on 132 SMs x 16 MUFU/clk at 1.755 GHz is 3.7 G/ms, so the
forward stays memory bound and the model's ceiling is the copy bandwidth; with one barrier per row,
we predict 85-90% of peak HBM bandwidth for rows of 4096-16384 columns (the remaining gap: the launch
tail and one exposed load latency per row), against about 75-80% for the 3-4 barrier version.
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
def online_combine(m1, s1, m2, s2):
    """Merge two (max, sum of 2^((x - max) log2 e)) pairs: the online-softmax rule, associative, so one
    tl.reduce over the pairs gives the row's max and sum in a single cross-warp exchange. A side that has
    seen only -inf has sum 0 and is referenced to 0 (-inf - -inf would be NaN)."""
    log2e: tl.constexpr = 1.4426950408889634
    m = tl.maximum(m1, m2)
    m_ref = tl.where(m == -float("inf"), 0.0, m)
    return m, s1 * tl.exp2((m1 - m_ref) * log2e) + s2 * tl.exp2((m2 - m_ref) * log2e)


@triton.jit
def _pack(m, s):
    """Two fp32 values in one 64-bit word (m high, s low): a one-operand reduction moves both through shared
    memory behind one barrier (Triton gives each operand of a tuple reduction its own barrier)."""
    return (m.to(tl.uint32, bitcast=True).to(tl.uint64) << 32) | s.to(tl.uint32, bitcast=True).to(tl.uint64)


@triton.jit
def _unpack(p):
    return ((p >> 32).to(tl.uint32).to(tl.float32, bitcast=True),
            (p & 0xFFFFFFFF).to(tl.uint32).to(tl.float32, bitcast=True))


@triton.jit
def _packed_combine(p1, p2):
    m1, s1 = _unpack(p1)
    m2, s2 = _unpack(p2)
    m, s = online_combine(m1, s1, m2, s2)
    return _pack(m, s)


@triton.jit
def row_max_sum(m, s, ACC: tl.constexpr):
    """The row's (max, sum) from per-lane pairs in one cross-lane reduction: one block-wide barrier when
    the lanes span several warps, none inside one warp. fp32 pairs travel packed in 64 bits (one barrier);
    fp64 pairs as a tuple (two)."""
    if ACC == tl.float32:  # noqa: SIM300 (constexpr dtype, not a Yoda condition)
        m_row, s_row = _unpack(tl.reduce(_pack(m, s), 0, _packed_combine))
    else:
        m_row, s_row = tl.reduce((m, s), 0, online_combine)
    return m_row, s_row


@triton.jit
def _group_max_sum(x):
    """x: [GROUPS, VEC], one 16-byte vector per group, held by one thread: each group's max, that max with
    -inf referenced to 0, 2^((x - max) log2 e) and its sum. Axis 1 never leaves the thread: no shuffle,
    no barrier."""
    log2e: tl.constexpr = 1.4426950408889634
    m = tl.max(x, axis=1)
    m_ref = tl.where(m == -float("inf"), 0.0, m)
    e = tl.exp2((x - m_ref[:, None]) * log2e)
    return m, m_ref, e, tl.sum(e, axis=1)


@triton.jit
def _softmax_fwd_kernel(x_ptr, y_ptr, n_cols, stride_x_row, stride_y_row,
                        SINGLE_PASS: tl.constexpr, BLOCK_N: tl.constexpr, VEC: tl.constexpr, ACC: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_x_row
    y_row = y_ptr + row * stride_y_row
    # The block as [BLOCK_N // VEC, VEC]: each row of the tile is one 16-byte vector in one thread.
    cols0 = tl.arange(0, BLOCK_N // VEC)[:, None] * VEC + tl.arange(0, VEC)[None, :]
    log2e: tl.constexpr = 1.4426950408889634
    if SINGLE_PASS:
        mask = cols0 < n_cols
        x = tl.load(x_row + cols0, mask=mask, other=-float("inf")).to(ACC)
        m_g, _, _, s_g = _group_max_sum(x)
        # The row's (max, sum) from the groups' in one reduction: one block-wide barrier per row.
        m, s = row_max_sum(m_g, s_g, ACC)
        # y from x - m again, not as e * 2^((m_g - m) log2 e): that product rounds two large exponents
        # (up to 4x eager's fp32 error, measured), one exp2 per element more buys it back; the exp2 unit is
        # not the bound at 2-4 B per element. An all -inf row gives NaN (-inf - -inf), as eager does.
        y = tl.exp2((x - m) * log2e) / s
        tl.store(y_row + cols0, y.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        # Per-group running (max, sum) across the blocks: no cross-thread exchange inside the loop.
        m_run = tl.full((BLOCK_N // VEC,), -float("inf"), dtype=ACC)
        s_run = tl.zeros((BLOCK_N // VEC,), dtype=ACC)
        for start in range(0, n_cols, BLOCK_N):
            cols = start + cols0
            x = tl.load(x_row + cols, mask=cols < n_cols, other=-float("inf")).to(ACC)
            m_blk, _, _, s_blk = _group_max_sum(x)
            m_run, s_run = online_combine(m_run, s_run, m_blk, s_blk)
        m, s = row_max_sum(m_run, s_run, ACC)
        inv_s = 1.0 / s
        for start in range(0, n_cols, BLOCK_N):
            cols = start + cols0
            mask = cols < n_cols
            x = tl.load(x_row + cols, mask=mask, other=-float("inf")).to(ACC)
            y = tl.exp2((x - m) * log2e) * inv_s
            tl.store(y_row + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _softmax_bwd_kernel(y_ptr, dy_ptr, dx_ptr, n_cols, stride_y_row, stride_dy_row, stride_dx_row,
                        SINGLE_PASS: tl.constexpr, BLOCK_N: tl.constexpr, VEC: tl.constexpr, ACC: tl.constexpr):
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
        # Per-thread partial dot products across the blocks (one per 16-byte vector group, summed inside the
        # thread: a per-element accumulator cost 6-8 registers and a quarter of the occupancy on sm_80/90/100),
        # one block-wide reduction after the loop.
        groups = tl.arange(0, BLOCK_N // VEC)[:, None] * VEC + tl.arange(0, VEC)[None, :]
        dot_g = tl.zeros((BLOCK_N // VEC,), dtype=ACC)
        for start in range(0, n_cols, BLOCK_N):
            cols = start + groups
            mask = cols < n_cols
            y = tl.load(y_row + cols, mask=mask, other=0.0).to(ACC)
            dy = tl.load(dy_row + cols, mask=mask, other=0.0).to(ACC)
            dot_g += tl.sum(y * dy, axis=1)
        dot = tl.sum(dot_g, axis=0)
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
           constexprs=dict(SINGLE_PASS=cfg.single_pass, BLOCK_N=cfg.BLOCK_N, VEC=cfg.vec, ACC=acc_dtype(x.dtype)),
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
           constexprs=dict(SINGLE_PASS=cfg.single_pass, BLOCK_N=cfg.BLOCK_N, VEC=cfg.vec, ACC=acc_dtype(y.dtype)),
           options=cfg.options())
    return dx

