"""Per-row partial statistics of a vocabulary shard, for the vocabulary-parallel cross-entropy.

A rank holds logits x [n_rows, V_r] for classes col_offset .. col_offset + V_r of V (its slice of the
LM head). Per row, with target t, class weights w (indexed by the global class), softcap c:

    x'    = c tanh(x / c)                       (softcap; x' = x without it)
    m_r   = max_j x'_j                          (over this shard's columns)
    s_r   = sum_j exp(x'_j - m_r)               (online over blocks in base 2, as kernels/cross_entropy.py)
    xt_r  = x'_t if col_offset <= t < col_offset + V_r else 0       (the one rank that owns the target)
    wx_r  = sum_j w_j x'_j                      (only with label smoothing; 0 otherwise)

The caller all-reduces m (MAX), then s_r exp(m_r - m), xt_r and wx_r (SUM) and assembles the loss
(wavefront/parallel/vocab_parallel.py); the gradient of the shard needs nothing from other ranks beyond
the global (m, log s), so the backward is the cross-entropy kernel's backward mode on a column slice.

Predicted tokens (optional, WRITE_ARGMAX): the shard's raw (uncapped) logit maximum b_r and the global
column of its first occurrence a_r, in the same read; the caller all-reduces MAX of b_r, then MIN of a_r over
the shards whose b_r is the maximum (the first column overall, torch.argmax's tie rule).

Out: stats [n_rows, 4] = (m_r, s_r, xt_r, wx_r) in fp32 (fp64 for fp64 logits). An ignored row writes
(0, 1, 0, 0) without reading its logits (lse 0: its loss is zeroed by the caller). A target outside
[0, V) that is not ignore_index writes NaN into xt_r on every rank, so the row's loss is NaN everywhere.

Traffic per row, 16-bit logits: reads 2 V_r B (and 4 V_r B of class weights from L2 with smoothing and
weights), writes 16 B; ~4 V_r FLOP (softcap ~10 V_r more). Offsets: the row index is int64 before it
multiplies a stride; targets are loaded as int64.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from wavefront import runtime
from wavefront.kernels._heuristics import acc_dtype, stat_dtype
from wavefront.kernels._launch import launch
from wavefront.kernels._math import tanh
from wavefront.kernels.cross_entropy import argmax_block, argmax_lanes
from wavefront.kernels.row_config import row_config

N_STATS = 4


@triton.jit
def _vocab_shard_stats_kernel(
    logits_ptr, target_ptr, weight_ptr, stats_ptr, best_ptr, best_col_ptr,
    n_cols, n_classes, col_offset, stride_logits_row, stride_target, ignore_index, softcap,
    HAS_WEIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_SMOOTHING: tl.constexpr, WRITE_ARGMAX: tl.constexpr,
    BLOCK_N: tl.constexpr, ACC: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    x_row = logits_ptr + row * stride_logits_row
    out = stats_ptr + 4 * row
    cols0 = tl.arange(0, BLOCK_N)
    log2e: tl.constexpr = 1.4426950408889634

    t = tl.load(target_ptr + row * stride_target).to(tl.int64)
    if t != ignore_index:
        # Per-lane running max and sum (one rescale per lane per block, one cross-lane combine at the end).
        m_lane = tl.full((BLOCK_N,), -float("inf"), ACC)
        s_lane = tl.zeros((BLOCK_N,), ACC)
        wx_lane = tl.zeros((BLOCK_N,), ACC)
        best = tl.full((BLOCK_N,), -float("inf"), ACC)
        best_col = tl.zeros((BLOCK_N,), tl.int32)
        for start in range(0, n_cols, BLOCK_N):
            cols = start + cols0
            mask = cols < n_cols
            xc = tl.load(x_row + cols, mask=mask, other=0.0).to(ACC)
            if WRITE_ARGMAX:
                best, best_col = argmax_block(xc, cols, mask, best, best_col)
            if HAS_SOFTCAP:
                xc = softcap * tanh(xc / softcap)
            xm = tl.where(mask, xc, -float("inf"))
            m_new = tl.maximum(m_lane, xm)
            # A lane that has seen only -inf keeps a zero sum (-inf - -inf would be NaN).
            m_ref = tl.where(m_new == -float("inf"), 0.0, m_new)
            s_lane = s_lane * tl.exp2((m_lane - m_ref) * log2e) + tl.exp2((xm - m_ref) * log2e)
            m_lane = m_new
            if HAS_SMOOTHING:
                if HAS_WEIGHT:
                    w = tl.load(weight_ptr + col_offset + cols, mask=mask, other=0.0).to(ACC)
                    wx_lane += w * tl.where(mask, xc, 0.0)
                else:
                    wx_lane += tl.where(mask, xc, 0.0)
        m = tl.max(m_lane, axis=0)
        m_ref = tl.where(m == -float("inf"), 0.0, m)
        s = tl.sum(s_lane * tl.exp2((m_lane - m_ref) * log2e), axis=0)
        local_t = t - col_offset
        owned = (local_t >= 0) & (local_t < n_cols)
        x_t = tl.load(x_row + tl.where(owned, local_t, 0)).to(ACC)
        if HAS_SOFTCAP:
            x_t = softcap * tanh(x_t / softcap)
        x_t = tl.where(owned, x_t, 0.0)
        # Out of [0, V) and not ignored: NaN on every rank (no rank owns it), never an out-of-bounds read.
        x_t = tl.where((t < 0) | (t >= n_classes), float("nan"), x_t)
        tl.store(out, m)
        tl.store(out + 1, s)
        tl.store(out + 2, x_t)
        tl.store(out + 3, tl.sum(wx_lane, axis=0))
        if WRITE_ARGMAX:
            top, arg = argmax_lanes(best, best_col)
            tl.store(best_ptr + row, top)
            tl.store(best_col_ptr + row, arg.to(tl.int64) + col_offset)
    else:
        tl.store(out, tl.zeros((), ACC))
        tl.store(out + 1, tl.full((), 1.0, ACC))
        tl.store(out + 2, tl.zeros((), ACC))
        tl.store(out + 3, tl.zeros((), ACC))
        if WRITE_ARGMAX:
            tl.store(best_ptr + row, tl.full((), -float("inf"), ACC))
            tl.store(best_col_ptr + row, tl.zeros((), tl.int64) + ignore_index)


def vocab_shard_stats(logits: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None, *, ignore_index: int,
                      label_smoothing: float, softcap: float | None, col_offset: int, n_classes: int,
                      argmax: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """One launch over the rows of a vocabulary shard logits [n_rows, V_r] (unit column stride) with global
    targets [n_rows] (any stride) and class weights [n_classes] (or None). Returns stats [n_rows, 4].
    ``argmax`` (best [n_rows] in the stats' dtype, column [n_rows] int64, contiguous): also write the shard's
    raw logit maximum and the global column of its first occurrence (-inf and ignore_index for ignored rows)."""
    n_rows, n_cols = logits.shape
    if col_offset < 0 or col_offset + n_cols > n_classes:
        raise ValueError(f"vocab_shard_stats: columns [{col_offset}, {col_offset + n_cols}) are not inside the "
                         f"{n_classes} classes")
    stats = torch.empty((n_rows, N_STATS), dtype=stat_dtype(logits.dtype), device=logits.device)
    if n_rows == 0:
        return stats
    cfg = row_config(n_cols, logits.dtype, runtime.arch(logits.device), online=True)
    launch(
        _vocab_shard_stats_kernel, (n_rows,),
        logits_ptr=logits, target_ptr=target, weight_ptr=weight, stats_ptr=stats,
        best_ptr=None if argmax is None else argmax[0], best_col_ptr=None if argmax is None else argmax[1],
        n_cols=n_cols,
        n_classes=n_classes, col_offset=col_offset, stride_logits_row=logits.stride(0),
        stride_target=target.stride(0), ignore_index=ignore_index, softcap=1.0 if softcap is None else softcap,
        constexprs=dict(HAS_WEIGHT=weight is not None, HAS_SOFTCAP=softcap is not None,
                        HAS_SMOOTHING=label_smoothing != 0.0, WRITE_ARGMAX=argmax is not None, BLOCK_N=cfg.BLOCK_N,
                        ACC=acc_dtype(logits.dtype)),
        options=cfg.options(),
    )
    return stats
