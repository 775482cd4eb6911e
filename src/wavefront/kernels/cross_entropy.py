"""Cross-entropy over the last dim (the vocabulary), loss and gradient, one kernel for every mode.

Per row i with logits x (V = n_cols), target t, class weights w (all ones without weights), label
smoothing eps, z-loss coefficient z and optional softcap c:

    x'    = c tanh(x / c)                          (softcap; x' = x without it)
    m     = max_j x'_j,  log_s = log sum_j exp(x'_j - m),  lse = m + log_s
            (online over blocks in base 2: s = sum 2^((x' - m) log2 e), the running sum rescaled by
            2^((m_old - m_new) log2 e) when the max grows; log2(e) is folded into the scaled difference)
    loss  = (1 - eps) w_t (lse - x'_t) + eps (W lse - sum_j w_j x'_j) / V + z lse^2,   W = sum_j w_j
    loss  = 0 for an ignored row (t == ignore_index)

This is F.cross_entropy's definition with weights and label smoothing (the smoothing term is weighted by
the class weights, like PyTorch's), plus PaLM's z-loss, which is not class-weighted. With p = softmax(x')
and r the row's upstream scale (the reduction's 1/denominator times the incoming gradient):

    dloss/dx'_j = r (A p_j - (1 - eps) w_t [j == t] - eps w_j / V),   A = (1 - eps) w_t + eps W / V + 2 z lse
    dloss/dx_j  = dloss/dx'_j (1 - tanh^2(x_j / c))                    (softcap; 4e/(1+e)^2 form, _math.py)

Saved per row: the statistics (m, log_s) as two fp32 numbers, not lse = m + log_s: the backward
evaluates p_j = exp((x'_j - m) - log_s), where x'_j - m is exact near the max; a single fp32 lse would
put ulp(lse) ~ |x| eps of relative error into every probability (4x eager's error at logits ~100).

Modes (constexpr): COMPUTE_LSE (forward: loss and statistics) and WRITE_GRAD (the gradient above). The
default forward writes loss and statistics and reads each logit once; the backward reads the saved
statistics and each logit once more and writes the gradient (no second statistics pass). The fused linear cross-entropy and the
opt-in in-place mode set both flags: the gradient is written in the same launch, into ``grad_ptr``,
which may be the logits buffer itself (each block is read before it is overwritten).

Rows wider than the single-pass limit of row_config.py are processed in blocks of BLOCK_N: the
statistics pass reads each block once with the online max/sum (rescaling the running sum when the max
grows); writing the gradient in the same launch then reads the row a second time (from L2 at vocabulary
sizes up to ~256k x 2 B per row in flight per SM). Rows that fit one block are read once in every mode.

Few long rows (an eval or decode batch of 1-8 rows at a 128k-262k vocabulary would run 1-8 programs on a
132-304 SM/CU GPU) are split over several programs per row where row_config.py's table says so
(``row_splits``): each program of ``_ce_partial_kernel`` reduces one chunk of its row with the online
rule and writes (m_i, s_i, sum_wx_i, sum_w_i), 16 B; ``_ce_combine_kernel`` takes m = max_i m_i and
s = sum_i s_i 2^((m_i - m) log2 e), the online rescale once more, and writes the loss and statistics.
The gradient (backward mode) is written by the same split grid, each program its chunk. Bytes: the row
is read once as before, plus 32 B per chunk (partials written and read): +128 B on one 128256-column bf16
row split 4 ways, measured by workbench.static.traffic: 256,662 B against the 256,532 B minimum).

Predicted token (WRITE_ARGMAX, statistics mode only): the first column of the row's largest raw logit (before
the softcap, which is monotone), torch.argmax's rule, or ignore_index for an ignored row; in the same read as
the statistics: each lane keeps its running maximum and the column where it first appeared (a strictly greater
value replaces it, and a lane's columns rise block by block), and the lanes combine once after the loop (the
maximum, then the smallest column holding it; without a softcap the running maximum is the softmax's own and
only the column is extra). Split rows: each chunk's program writes its maximum and column
(8 B), the combine takes the first chunk holding the row's maximum. Cost: 8 B written per row (int64), no read.

Traffic per row, 16-bit logits, vocabulary V: forward reads 2V B and writes 12 B (loss, statistics), ~6V FLOP
(softcap adds ~10V), intensity ~3 FLOP/B; backward reads 2V B, writes 2V B. Class weights are read per
row too but stay in L2 (4V B shared by all rows).

Gradient in the forward (the op's ``grad_in_forward`` / ``inplace_backward``): the forward launch writes the
gradient scaled by the upstream scale the caller's reduction gives when the loss itself is differentiated
(``assumed``: 1/denominator for a mean), and the backward runs ``_ce_rescale_kernel``: per row it compares
the upstream scale that arrived with the assumed one, on the device (no host synchronization), and touches
the row only when they differ (then it multiplies by their ratio: reads and writes 2V B for 16-bit). A loss
differentiated as returned moves 2V B read + 2V B written per row in all (the logits read once), against
2V + 2V + 2V B for the forward/backward pair. Rows wider than the single-pass limit read the logits twice
in that forward launch (statistics, then gradient: the second read from L2 when the row stays resident).

Targets outside [0, V) other than ignore_index never address memory out of bounds: the row's target
logit is read at index 0 instead and the row's loss and gradient are NaN, so the error is visible in the
result. (The op layer raises a ValueError first where checking is free of a device synchronization.)

Offsets: the row index is int64 before it multiplies a stride; targets are loaded as int64.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from wavefront import runtime
from wavefront.kernels._heuristics import acc_dtype, stat_dtype
from wavefront.kernels._launch import launch
from wavefront.kernels._math import tanh, tanh_parts
from wavefront.kernels.row_config import row_config, row_splits
from wavefront.kernels.softmax import row_max_sum


@triton.jit
def _capped(x, softcap, HAS_SOFTCAP: tl.constexpr):
    if HAS_SOFTCAP:
        x = softcap * tanh(x / softcap)
    return x


@triton.jit
def argmax_block(x, cols, mask, best, best_col):
    """One block of the per-lane running argmax of the raw logits x: a strictly greater value replaces the
    lane's best, so a lane (whose columns rise block by block) keeps the first of equal values."""
    take = tl.where(mask, x, -float("inf")) > best
    return tl.where(take, x, best), tl.where(take, cols, best_col)


@triton.jit
def argmax_lanes(best, best_col):
    """The row's (max, first column of the max) from its lanes; an all -inf row gives column 0 (torch.argmax's)."""
    top = tl.max(best, axis=0)
    return top, tl.min(tl.where(best == top, best_col, 2147483647), axis=0)


@triton.jit
def _grad_block(x, cols, mask, t, m, log_s, coef, on_target, smooth_w, w_ptr, col_offset, softcap, scale,
                HAS_WEIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_SMOOTHING: tl.constexpr):
    """The gradient of one block of raw logits x (fp32) at slice columns `cols` (classes col_offset + cols);
    t is the target relative to the slice; masked lanes give 0."""
    if HAS_SOFTCAP:
        th, sech2, _ = tanh_parts(x / softcap)
        xc = softcap * th
    else:
        xc = x
    # exp(x' - lse) as exp(((x' - m) - log_s)): x' - m is exact near the max, where p matters; folding lse
    # into one number would cost ulp(lse) ~ |x| eps of relative error in every probability.
    p = tl.exp2(((xc - m) - log_s) * 1.4426950408889634)
    g = coef * p
    if HAS_SMOOTHING:
        if HAS_WEIGHT:
            g -= smooth_w * tl.load(w_ptr + col_offset + cols, mask=mask, other=0.0).to(xc.dtype)
        else:
            g -= smooth_w
    g = tl.where(cols == t, g - on_target, g) * scale
    if HAS_SOFTCAP:
        g = g * sech2
    return tl.where(mask, g, 0.0)


@triton.jit
def _target(target_ptr, weight_ptr, row, stride_target, ignore_index, n_classes, HAS_WEIGHT: tl.constexpr,
            ACC: tl.constexpr):
    """The row's target (safe to index with), whether it counts, the NaN poison of an out-of-range target,
    its class weight (0 when ignored), the class count as a float and its reciprocal."""
    t = tl.load(target_ptr + row * stride_target).to(tl.int64)
    valid = t != ignore_index
    in_range = (t >= 0) & (t < n_classes)
    # Out-of-range targets read index 0 (never out of bounds) and poison the row with NaN below.
    t_safe = tl.where(in_range, t, 0)
    poison = tl.where(valid & (~in_range), float("nan"), 0.0)
    if HAS_WEIGHT:
        w_t = tl.load(weight_ptr + t_safe).to(ACC)
    else:
        w_t = tl.full((), 1.0, ACC)
    w_t = tl.where(valid, w_t, 0.0)
    # n_classes arrives as a constexpr when it is 1 (Triton specializes 1): build the float from a tensor.
    n_f = tl.zeros((), ACC) + n_classes
    return t_safe, valid, poison, w_t, n_f, 1.0 / n_f


@triton.jit
def _store_loss(loss_ptr, stats_ptr, row, x_row, m, s, sum_w, sum_wx, t_safe, w_t, inv_n, poison, label_smoothing,
                z_loss, softcap, HAS_SOFTCAP: tl.constexpr, HAS_SMOOTHING: tl.constexpr, ACC: tl.constexpr):
    """From the row's max m and sum s = sum exp(x' - m): the loss and the statistics (m, log s); returns
    (log s, lse)."""
    log_s = tl.log2(s) * 0.6931471805599453
    lse = m + log_s
    x_t = _capped(tl.load(x_row + t_safe).to(ACC), softcap, HAS_SOFTCAP)
    loss = (1.0 - label_smoothing) * w_t * ((m - x_t) + log_s)
    if HAS_SMOOTHING:
        # eps (W lse - sum_j w_j x'_j) / V, divided before subtracting so the two terms stay O(|x|).
        # Only when smoothing is on: at eps = 0 a -inf logit would add 0 * inf = NaN.
        loss += label_smoothing * (lse * (sum_w * inv_n) - sum_wx * inv_n)
    # z lse^2 only when z > 0: lse^2 overflows for logits near the fp32 maximum (0 * inf = NaN).
    loss += tl.where(z_loss > 0.0, z_loss * lse * lse, 0.0)
    tl.store(loss_ptr + row, loss + poison)
    tl.store(stats_ptr + 2 * row, m)
    tl.store(stats_ptr + 2 * row + 1, log_s)
    return log_s, lse


@triton.jit
def _online_block(x_row, weight_ptr, cols, mask, m_lane, s_lane, wx_lane, w_lane, best, best_col, softcap,
                  HAS_WEIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_SMOOTHING: tl.constexpr,
                  WRITE_ARGMAX: tl.constexpr, ACC: tl.constexpr):
    """One block of the per-lane running max and sum (and the smoothing sums, and the raw logits' argmax)."""
    log2e: tl.constexpr = 1.4426950408889634
    x = tl.load(x_row + cols, mask=mask, other=0.0).to(ACC)
    if WRITE_ARGMAX and HAS_SOFTCAP:
        best, best_col = argmax_block(x, cols, mask, best, best_col)
    xc = _capped(x, softcap, HAS_SOFTCAP)
    xm = tl.where(mask, xc, -float("inf"))
    if WRITE_ARGMAX and not HAS_SOFTCAP:
        # Uncapped, the softmax's running maximum is the raw one: only the column is tracked (one vector
        # per lane fewer than a separate maximum).
        best_col = tl.where(xm > m_lane, cols, best_col)
    m_new = tl.maximum(m_lane, xm)
    # A lane that has seen only -inf keeps a zero sum (-inf - -inf would be NaN).
    m_ref = tl.where(m_new == -float("inf"), 0.0, m_new)
    s_lane = s_lane * tl.exp2((m_lane - m_ref) * log2e) + tl.exp2((xm - m_ref) * log2e)
    if HAS_SMOOTHING:
        if HAS_WEIGHT:
            w = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(ACC)
            wx_lane += w * xc
            w_lane += w
        else:
            wx_lane += tl.where(mask, xc, 0.0)
    return m_new, s_lane, wx_lane, w_lane, best, best_col


@triton.jit
def _ce_kernel(
    logits_ptr, target_ptr, weight_ptr, loss_ptr, stats_ptr, grad_ptr, scale_ptr, argmax_ptr,
    n_cols, n_classes, col_offset, split_cols, stride_logits_row, stride_grad_row, stride_target, stride_scale,
    ignore_index, label_smoothing, z_loss, softcap,
    HAS_WEIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_SMOOTHING: tl.constexpr, COMPUTE_LSE: tl.constexpr,
    WRITE_GRAD: tl.constexpr, WRITE_ARGMAX: tl.constexpr, SINGLE_PASS: tl.constexpr, BLOCK_N: tl.constexpr,
    ACC: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    x_row = logits_ptr + row * stride_logits_row
    cols0 = tl.arange(0, BLOCK_N)
    log2e: tl.constexpr = 1.4426950408889634
    # The gradient loop covers columns [lo, hi): the whole row, or this program's chunk of a split row
    # (backward mode only; split_cols = n_cols otherwise). Column indices stay int32 like n_cols (int64 loop
    # bounds doubled this kernel's registers on sm_90); a chunk starts on a block boundary (lo = 0 unsplit),
    # and hi is formed without overflowing.
    lo = tl.multiple_of(tl.program_id(1) * split_cols, BLOCK_N)
    hi = tl.minimum(lo, n_cols - split_cols) + split_cols
    t_safe, valid, poison, w_t, n_f, inv_n = _target(target_ptr, weight_ptr, row, stride_target, ignore_index,
                                                     n_classes, HAS_WEIGHT, ACC)

    if valid:
        x_single = tl.zeros((BLOCK_N,), ACC)
        sum_w = n_f
        if COMPUTE_LSE:
            sum_wx = tl.zeros((), ACC)
            if SINGLE_PASS:
                mask = cols0 < n_cols
                x_single = tl.load(x_row + cols0, mask=mask, other=0.0).to(ACC)
                if WRITE_ARGMAX:
                    best, best_col = argmax_block(x_single, cols0, mask, tl.full((BLOCK_N,), -float("inf"), ACC),
                                                   tl.zeros((BLOCK_N,), tl.int32))
                    _, arg = argmax_lanes(best, best_col)
                    tl.store(argmax_ptr + row, arg.to(tl.int64))
                xc_single = _capped(x_single, softcap, HAS_SOFTCAP)
                m = tl.max(tl.where(mask, xc_single, -float("inf")), axis=0)
                s = tl.sum(tl.where(mask, tl.exp2((xc_single - m) * log2e), 0.0), axis=0)
                if HAS_SMOOTHING:
                    if HAS_WEIGHT:
                        w = tl.load(weight_ptr + cols0, mask=mask, other=0.0).to(ACC)
                        sum_wx = tl.sum(w * xc_single, axis=0)
                        sum_w = tl.sum(w, axis=0)
                    else:
                        sum_wx = tl.sum(tl.where(mask, xc_single, 0.0), axis=0)
            else:
                # Per-lane running max and sum: each lane rescales only its own sum, so the loop has no
                # cross-lane reduction (no barrier per block); the lanes combine once after the loop.
                m_lane = tl.full((BLOCK_N,), -float("inf"), ACC)
                s_lane = tl.zeros((BLOCK_N,), ACC)
                wx_lane = tl.zeros((BLOCK_N,), ACC)
                w_lane = tl.zeros((BLOCK_N,), ACC)
                best = tl.full((BLOCK_N,), -float("inf"), ACC)
                best_col = tl.zeros((BLOCK_N,), tl.int32)
                for start in range(0, n_cols, BLOCK_N):
                    cols = start + cols0
                    m_lane, s_lane, wx_lane, w_lane, best, best_col = _online_block(
                        x_row, weight_ptr, cols, cols < n_cols, m_lane, s_lane, wx_lane, w_lane, best, best_col,
                        softcap, HAS_WEIGHT, HAS_SOFTCAP, HAS_SMOOTHING, WRITE_ARGMAX, ACC)
                if WRITE_ARGMAX:
                    if HAS_SOFTCAP:
                        _, arg = argmax_lanes(best, best_col)
                    else:
                        _, arg = argmax_lanes(m_lane, best_col)
                    tl.store(argmax_ptr + row, arg.to(tl.int64))
                # The lanes' (max, sum) pairs in one reduction: one block-wide barrier, not three.
                m, s = row_max_sum(m_lane, s_lane, ACC)
                if HAS_SMOOTHING:
                    sum_wx = tl.sum(wx_lane, axis=0)
                    if HAS_WEIGHT:
                        sum_w = tl.sum(w_lane, axis=0)
            log_s, lse = _store_loss(loss_ptr, stats_ptr, row, x_row, m, s, sum_w, sum_wx, t_safe, w_t, inv_n, poison,
                                     label_smoothing, z_loss, softcap, HAS_SOFTCAP, HAS_SMOOTHING, ACC)
        else:
            m = tl.load(stats_ptr + 2 * row).to(ACC)
            log_s = tl.load(stats_ptr + 2 * row + 1).to(ACC)
            lse = m + log_s
            if HAS_SMOOTHING and HAS_WEIGHT:
                sum_w = tl.zeros((), ACC)
                for start in range(0, n_classes, BLOCK_N):
                    cols = start + cols0
                    sum_w += tl.sum(tl.load(weight_ptr + cols, mask=cols < n_classes, other=0.0).to(ACC), axis=0)
        if WRITE_GRAD:
            g_row = grad_ptr + row * stride_grad_row
            G_DTYPE = grad_ptr.dtype.element_ty
            scale = tl.load(scale_ptr + row * stride_scale).to(ACC)
            on_target = (1.0 - label_smoothing) * w_t
            coef = on_target + tl.where(z_loss > 0.0, 2.0 * z_loss * lse, 0.0)
            smooth_w = 0.0
            if HAS_SMOOTHING:
                coef += label_smoothing * sum_w * inv_n
                smooth_w = label_smoothing * inv_n
            if SINGLE_PASS and COMPUTE_LSE:
                mask = cols0 < n_cols
                g = _grad_block(x_single, cols0, mask, t_safe, m, log_s, coef, on_target, smooth_w, weight_ptr, 0,
                                softcap, scale, HAS_WEIGHT, HAS_SOFTCAP, HAS_SMOOTHING)
                tl.store(g_row + cols0, (g + poison).to(G_DTYPE), mask=mask)
            else:
                # A column slice (backward mode) sees its classes from col_offset on: the target and the class
                # weights are indexed relative to the slice.
                for start in range(lo, hi, BLOCK_N):
                    cols = start + cols0
                    mask = cols < hi
                    x = tl.load(x_row + cols, mask=mask, other=0.0).to(ACC)
                    g = _grad_block(x, cols, mask, t_safe - col_offset, m, log_s, coef, on_target, smooth_w,
                                    weight_ptr, col_offset, softcap, scale, HAS_WEIGHT, HAS_SOFTCAP, HAS_SMOOTHING)
                    tl.store(g_row + cols, (g + poison).to(G_DTYPE), mask=mask)
    else:
        # An ignored row: zero loss and gradient, and the row's logits are never read (its predicted token is
        # ignore_index).
        if COMPUTE_LSE:
            tl.store(loss_ptr + row, tl.zeros((), ACC))
            tl.store(stats_ptr + 2 * row, tl.zeros((), ACC))
            tl.store(stats_ptr + 2 * row + 1, tl.zeros((), ACC))
            if WRITE_ARGMAX:
                tl.store(argmax_ptr + row, tl.zeros((), tl.int64) + ignore_index)
        if WRITE_GRAD:
            g_row = grad_ptr + row * stride_grad_row
            zero = tl.zeros((BLOCK_N,), grad_ptr.dtype.element_ty)
            for start in range(lo, hi, BLOCK_N):
                cols = start + cols0
                tl.store(g_row + cols, zero, mask=cols < hi)


@triton.jit
def _ce_partial_kernel(
    logits_ptr, target_ptr, weight_ptr, part_ptr, part_best_ptr, part_col_ptr, n_cols, split_cols,
    stride_logits_row, stride_target, ignore_index, softcap,
    HAS_WEIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_SMOOTHING: tl.constexpr, WRITE_ARGMAX: tl.constexpr,
    BLOCK_N: tl.constexpr, ACC: tl.constexpr,
):
    """A split row's chunk (program (row, part)): its max m, sum exp(x' - m) and smoothing sums, 16 B to
    part_ptr[row, part] (and with WRITE_ARGMAX its raw max and the first column of it, 8 B more). An ignored
    row's chunks are not read (the combine writes its zeros)."""
    row = tl.program_id(0).to(tl.int64)
    part = tl.program_id(1).to(tl.int64)
    out = part_ptr + (row * tl.num_programs(1) + part) * 4
    t = tl.load(target_ptr + row * stride_target).to(tl.int64)
    if t != ignore_index:
        x_row = logits_ptr + row * stride_logits_row
        cols0 = tl.arange(0, BLOCK_N)
        lo = tl.multiple_of(tl.program_id(1) * split_cols, BLOCK_N)
        hi = tl.minimum(lo, n_cols - split_cols) + split_cols
        m_lane = tl.full((BLOCK_N,), -float("inf"), ACC)
        s_lane = tl.zeros((BLOCK_N,), ACC)
        wx_lane = tl.zeros((BLOCK_N,), ACC)
        w_lane = tl.zeros((BLOCK_N,), ACC)
        best = tl.full((BLOCK_N,), -float("inf"), ACC)
        best_col = tl.zeros((BLOCK_N,), tl.int32) + lo
        for start in range(lo, hi, BLOCK_N):
            cols = start + cols0
            m_lane, s_lane, wx_lane, w_lane, best, best_col = _online_block(
                x_row, weight_ptr, cols, cols < hi, m_lane, s_lane, wx_lane, w_lane, best, best_col, softcap,
                HAS_WEIGHT, HAS_SOFTCAP, HAS_SMOOTHING, WRITE_ARGMAX, ACC)
        if WRITE_ARGMAX:
            if HAS_SOFTCAP:
                top, arg = argmax_lanes(best, best_col)
            else:
                top, arg = argmax_lanes(m_lane, best_col)
            at = row * tl.num_programs(1) + part
            tl.store(part_best_ptr + at, top)
            tl.store(part_col_ptr + at, arg)
        # A chunk of only -inf logits (a padded vocabulary) has m = -inf and s = 0; the combine weighs it 0.
        m, s = row_max_sum(m_lane, s_lane, ACC)
        tl.store(out, m)
        tl.store(out + 1, s)
        tl.store(out + 2, tl.sum(wx_lane, axis=0))
        tl.store(out + 3, tl.sum(w_lane, axis=0))


@triton.jit
def _ce_combine_kernel(
    logits_ptr, target_ptr, weight_ptr, part_ptr, part_best_ptr, part_col_ptr, loss_ptr, stats_ptr, argmax_ptr,
    n_parts, n_classes, stride_logits_row, stride_target, ignore_index, label_smoothing, z_loss, softcap,
    HAS_WEIGHT: tl.constexpr, HAS_SOFTCAP: tl.constexpr, HAS_SMOOTHING: tl.constexpr, WRITE_ARGMAX: tl.constexpr,
    BLOCK_S: tl.constexpr, ACC: tl.constexpr,
):
    """A split row's loss and statistics from its chunks' partials: the max of the maxima, the sums
    rescaled to it (the online rule, once), the smoothing sums added; the argmax is the first chunk's column
    among the chunks that hold the raw maximum (chunks are in column order)."""
    row = tl.program_id(0).to(tl.int64)
    t_safe, valid, poison, w_t, n_f, inv_n = _target(target_ptr, weight_ptr, row, stride_target, ignore_index,
                                                     n_classes, HAS_WEIGHT, ACC)
    if valid:
        k = tl.arange(0, BLOCK_S)
        in_parts = k < n_parts
        part = part_ptr + (row * n_parts + k) * 4
        m_part = tl.load(part, mask=in_parts, other=-float("inf"))
        m = tl.max(m_part, axis=0)
        s = tl.sum(tl.where(in_parts, tl.load(part + 1, mask=in_parts, other=0.0) *
                            tl.exp2((m_part - m) * 1.4426950408889634), 0.0), axis=0)
        sum_w = n_f
        sum_wx = tl.zeros((), ACC)
        if HAS_SMOOTHING:
            sum_wx = tl.sum(tl.load(part + 2, mask=in_parts, other=0.0), axis=0)
            if HAS_WEIGHT:
                sum_w = tl.sum(tl.load(part + 3, mask=in_parts, other=0.0), axis=0)
        _store_loss(loss_ptr, stats_ptr, row, logits_ptr + row * stride_logits_row, m, s, sum_w, sum_wx, t_safe, w_t,
                    inv_n, poison, label_smoothing, z_loss, softcap, HAS_SOFTCAP, HAS_SMOOTHING, ACC)
        if WRITE_ARGMAX:
            best = tl.load(part_best_ptr + row * n_parts + k, mask=in_parts, other=-float("inf"))
            col = tl.load(part_col_ptr + row * n_parts + k, mask=in_parts, other=0)
            _, arg = argmax_lanes(best, tl.where(in_parts, col, 2147483647))
            tl.store(argmax_ptr + row, arg.to(tl.int64))
    else:
        tl.store(loss_ptr + row, tl.zeros((), ACC))
        tl.store(stats_ptr + 2 * row, tl.zeros((), ACC))
        tl.store(stats_ptr + 2 * row + 1, tl.zeros((), ACC))
        if WRITE_ARGMAX:
            tl.store(argmax_ptr + row, tl.zeros((), tl.int64) + ignore_index)


@triton.jit
def _ce_rescale_kernel(grad_ptr, dloss_ptr, assumed_ptr, n_cols, stride_grad_row, stride_dloss, stride_assumed,
                       BLOCK_N: tl.constexpr, ACC: tl.constexpr):
    """grad[row] *= dloss[row] / assumed[row], only where they differ: an equal pair reads 8 bytes, no row."""
    row = tl.program_id(0).to(tl.int64)
    dloss = tl.load(dloss_ptr + row * stride_dloss).to(ACC)
    assumed = tl.load(assumed_ptr + row * stride_assumed).to(ACC)
    if dloss != assumed:  # NaN upstream also takes this branch and poisons the row, as it should
        ratio = dloss / assumed
        g_row = grad_ptr + row * stride_grad_row
        for start in range(0, n_cols, BLOCK_N):
            cols = start + tl.arange(0, BLOCK_N)
            mask = cols < n_cols
            g = tl.load(g_row + cols, mask=mask, other=0.0).to(ACC)
            tl.store(g_row + cols, (g * ratio).to(grad_ptr.dtype.element_ty), mask=mask)


def rescale_rows_(grad: torch.Tensor, dloss: torch.Tensor, assumed: torch.Tensor) -> torch.Tensor:
    """In place: each row of grad [n_rows, V] (unit column stride) scaled by dloss / assumed (0-d or
    [n_rows] tensors), rows whose pair is equal untouched. Returns grad."""
    n_rows, n_cols = grad.shape
    if n_rows == 0 or n_cols == 0:
        return grad
    cfg = row_config(n_cols, grad.dtype, runtime.arch(grad.device))
    launch(_ce_rescale_kernel, (n_rows,), grad_ptr=grad, dloss_ptr=dloss, assumed_ptr=assumed, n_cols=n_cols,
           stride_grad_row=grad.stride(0), stride_dloss=dloss.stride(0) if dloss.dim() else 0,
           stride_assumed=assumed.stride(0) if assumed.dim() else 0,
           constexprs=dict(BLOCK_N=cfg.BLOCK_N, ACC=acc_dtype(grad.dtype)), options=cfg.options())
    return grad


def check_column_slice(n_cols: int, col_offset: int, n_classes: int | None, compute_stats: bool) -> int:
    """The number of classes of a (possibly sliced) row; a slice is only meaningful in backward mode."""
    if n_classes is None:
        n_classes = n_cols
    if col_offset < 0 or col_offset + n_cols > n_classes:
        raise ValueError(f"cross_entropy_rows: columns [{col_offset}, {col_offset + n_cols}) are not inside the "
                         f"{n_classes} classes")
    if compute_stats and n_cols != n_classes:
        raise ValueError("cross_entropy_rows: the statistics need whole rows; a column slice needs saved stats")
    return n_classes


def cross_entropy_rows(logits: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None, *,
                       ignore_index: int, label_smoothing: float, z_loss: float, softcap: float | None,
                       stats: torch.Tensor | None = None, grad: torch.Tensor | None = None,
                       scale: torch.Tensor | None = None, col_offset: int = 0, n_classes: int | None = None,
                       argmax: torch.Tensor | None = None) -> tuple[torch.Tensor | None, torch.Tensor]:
    """One launch over the rows of logits [n_rows, V] (unit column stride); target [n_rows] (any stride).

    stats None: compute the per-row loss and statistics [n_rows, 2] = (max, log-sum-exp below the max),
    returned as (loss, stats). stats given (from an earlier call): backward mode, loss is None. grad
    given: also write the gradient there (it may be `logits` itself), scaled per row by ``scale`` (a 0-d
    or [n_rows] tensor, any stride). In backward mode `logits` may be a column slice of rows of
    ``n_classes`` classes starting at class ``col_offset`` (the fused linear cross-entropy's dweight pass).
    ``argmax`` (int64 [n_rows], contiguous; statistics mode only): also write each row's predicted class, the
    first column of the raw (uncapped) logits' maximum, or ignore_index for an ignored row, in the same read.
    """
    n_rows, n_cols = logits.shape
    compute_stats = stats is None
    n_classes = check_column_slice(n_cols, col_offset, n_classes, compute_stats)
    if argmax is not None and not compute_stats:
        raise ValueError("cross_entropy_rows: the argmax is written by the statistics pass (stats=None)")
    stat = stat_dtype(logits.dtype)
    loss = torch.empty(n_rows, dtype=stat, device=logits.device) if compute_stats else None
    if compute_stats:
        stats = torch.empty((n_rows, 2), dtype=stat, device=logits.device)
    if n_rows == 0:
        return loss, stats
    write_grad = grad is not None
    if write_grad and scale is None:
        raise ValueError("cross_entropy_rows: a gradient needs its per-row scale")
    arch = runtime.arch(logits.device)
    cfg = row_config(n_cols, logits.dtype, arch, online=True)
    n_splits, split_cols = (1, n_cols) if cfg.single_pass else row_splits(
        n_rows, n_cols, cfg.BLOCK_N, arch, runtime.sm_count(logits.device))
    common = dict(HAS_WEIGHT=weight is not None, HAS_SOFTCAP=softcap is not None,
                  HAS_SMOOTHING=label_smoothing != 0.0, WRITE_ARGMAX=argmax is not None, ACC=acc_dtype(logits.dtype))
    if n_splits > 1 and compute_stats:
        # Few long rows: the statistics from n_splits programs per row and a combine; the gradient (if asked)
        # then in backward mode below, split the same way.
        part = torch.empty((n_rows, n_splits, 4), dtype=stat, device=logits.device)
        part_best = part_col = None
        if argmax is not None:
            part_best = torch.empty((n_rows, n_splits), dtype=stat, device=logits.device)
            part_col = torch.empty((n_rows, n_splits), dtype=torch.int32, device=logits.device)
        launch(_ce_partial_kernel, (n_rows, n_splits), logits_ptr=logits, target_ptr=target, weight_ptr=weight,
               part_ptr=part, part_best_ptr=part_best, part_col_ptr=part_col, n_cols=n_cols, split_cols=split_cols, stride_logits_row=logits.stride(0),
               stride_target=target.stride(0), ignore_index=ignore_index, softcap=1.0 if softcap is None else softcap,
               constexprs=dict(common, BLOCK_N=cfg.BLOCK_N), options=cfg.options())
        launch(_ce_combine_kernel, (n_rows,), logits_ptr=logits, target_ptr=target, weight_ptr=weight, part_ptr=part,
               part_best_ptr=part_best, part_col_ptr=part_col, loss_ptr=loss, stats_ptr=stats, argmax_ptr=argmax,
               n_parts=n_splits, n_classes=n_classes,
               stride_logits_row=logits.stride(0), stride_target=target.stride(0), ignore_index=ignore_index,
               label_smoothing=label_smoothing, z_loss=z_loss, softcap=1.0 if softcap is None else softcap,
               constexprs=dict(common, BLOCK_S=max(2, triton.next_power_of_2(n_splits))),
               options={"num_warps": 1, "num_stages": 1})
        if not write_grad:
            return loss, stats
        compute_stats = False
        common["WRITE_ARGMAX"] = False
    launch(
        _ce_kernel, (n_rows, n_splits),
        logits_ptr=logits, target_ptr=target, weight_ptr=weight, loss_ptr=loss, stats_ptr=stats, grad_ptr=grad,
        scale_ptr=scale, argmax_ptr=argmax, n_cols=n_cols, n_classes=n_classes, col_offset=col_offset, split_cols=split_cols,
        stride_logits_row=logits.stride(0), stride_grad_row=grad.stride(0) if write_grad else 0,
        stride_target=target.stride(0),
        stride_scale=(scale.stride(0) if scale.dim() else 0) if write_grad else 0,
        ignore_index=ignore_index, label_smoothing=label_smoothing, z_loss=z_loss,
        softcap=1.0 if softcap is None else softcap,
        constexprs=dict(common, COMPUTE_LSE=compute_stats, WRITE_GRAD=write_grad, SINGLE_PASS=cfg.single_pass,
                        BLOCK_N=cfg.BLOCK_N),
        options=cfg.options(),
    )
    return loss, stats
