"""RMSNorm and LayerNorm (optionally fused with a residual add), forward and backward.

Per row of n = n_cols elements, with w' = w + offset (Gemma stores w - 1 and uses offset 1):

    s     = x + residual                  (add variant; s is rounded to the input dtype and returned)
    mean  = sum(s) / n                    (LayerNorm only; RMSNorm uses mean = 0)
    rstd  = 1 / sqrt(sum((s - mean)^2) / n + eps)
    xhat  = (s - mean) * rstd
    y     = xhat * w' + b

Casting (RMSNorm): ``cast="llama"`` rounds xhat to the input dtype before multiplying by the weight
(Hugging Face Llama); ``cast="gemma"`` multiplies in fp32 and rounds once (Gemma). LayerNorm always
multiplies in fp32. Statistics accumulate in fp32 (fp64 for fp64 inputs). ``cast="input"`` (ROUND_STATS)
computes in the input dtype, as eager PyTorch does on a 16-bit tensor without an upcast: each square,
the mean square, mean + eps, rstd, xhat and w' are rounded to the input dtype where eager rounds them
(the sums still accumulate in fp32, as eager's reductions do); the stored rstd is the rounded one. A few
conversions in registers, no byte more (fp32/fp64 inputs: identical to "llama"); at llama3-8b_hidden bf16
(`wavefront inspect`): the same bytes, registers 32 -> 30 (sm_80/sm_100), 34 -> 29 (sm_90, occupancy 75% ->
100%), 39 -> 49 (gfx90a/gfx942) and 44 -> 52 (gfx1100) with occupancy unchanged; the backward is the same kernel.

Backward, with g = dy * w' and c1 = sum(xhat * g) / n, c2 = sum(g) / n:

    dx = rstd * (g - xhat * c1)           (RMSNorm)
    dx = rstd * (g - xhat * c1 - c2)      (LayerNorm)
    evaluated as g * rstd - xhat * (c1 * rstd) [- c2 * rstd]: the order autograd's chain rule uses, which
    loses less to cancellation when xhat^2 is near 1 (narrow rows).
    dx += d(new residual)                 (add variant: both x and residual receive dx)
    dw = sum over rows of dy * xhat,  db = sum over rows of dy

Saved for backward: the normalized input (s, or x), mean (LayerNorm) and rstd, fp32 per row.

The forward runs ``rows_per_program`` rows per program (row_config.py: one today, because holding w across
rows costs occupancy, measured there); with WEIGHT_FIRST it loads the weight before the row so its latency
overlaps the reductions (on where inspect shows no occupancy cost: gfx90a/gfx942; RMSNorm at 8192 columns
on sm_90 would go from 32 to 39 registers and 100% to 75% occupancy). The backward is persistent: about ``PERSISTENT_PROGRAMS_PER_SM``
programs per SM/CU, each owning a contiguous range of rows, with w read once per program and dw/db
accumulated in registers. dw/db are deterministic: each backward program writes one row of an fp32 partial
buffer [n_programs, n_cols] once (no atomics), and the host sums the partials in a fixed order.

Traffic per row, 16-bit input of width n, single pass: forward reads x (2n B) and writes y (2n B) plus
4-8 B of statistics: about 4n B for 5n FLOP (RMSNorm), intensity ~1.2 FLOP/B, deeply memory bound. Each
forward program also reads w (and b): 2n B more requested per row, served from L1/L2 (the vector is
shared by every row), which a persistent forward would avoid at the price of registers: holding w across
rows cost 14-49 more registers per thread on sm_90 and halved occupancy at 8192-16384 columns (measured
with `wavefront inspect`), so the forward keeps one row per program. Backward reads x, dy and writes dx:
6n B; per program, once, w and the 4n B dw (db) partial. The single-pass backward's row loop is
software-pipelined by Triton where row_config.py says so (``STAGES`` = 3 on NVIDIA): rows r + 1 and r + 2 are
copied into shared memory by cp.async while row r is reduced, so the next row's load latency hides behind
this row's barriers and reductions, at no occupancy cost (the copies are not in registers; measured in
row_config.py; the machine code shows the wait `DEPBAR.LE SB0, 0x3` before row r's barrier leaving row r + 1's
three copies in flight). With PREFETCH the next row is held in registers instead (manual double buffering):
off on every target (it cost occupancy everywhere, measured in row_config.py). Predicted (modelled, never
measured): at 4096-8192 columns a program's reductions take about as long as one row's load latency, so
hiding it lifts the backward from roughly 70-80% to 85-90% of HBM bandwidth on an H100 at the same
occupancy.
Rows wider than the single-pass limit (row_config.py) are read twice: the forward in two passes (6n B,
plus w per row); the backward in two phases over column blocks (10n B): phase A accumulates each row's two
sums c1, c2 block by block in a small per-row scratch, phase B computes dx and keeps the block's dw/db
partial in registers across the program's rows, writing it once.

Why the backward reads such rows twice (over 8192 columns on NVIDIA, over 16384 on AMD), in place of
holding each row once: dx needs both row sums, so the row's x and dy (or xhat and g) must stay live across
the two reductions, next to w and the dw/db partials the persistent program keeps across its rows. At
16384 columns that is 32 values per thread per live tensor at 16 warps: 128+ registers and 184-784 B of
spills per thread on sm_80/90/100; 32 warps cap a thread at 64 registers and spill too (row_config.py,
measured with `wavefront inspect`). Holding x, dy and w in the input dtype and converting at each use
does not help: the compiler keeps one fp32 copy live across the reductions either way (sm_90 at 16384
columns, December 2026: RMSNorm 184 B of spills at 16 warps / 128 registers and 112 B at 32 warps / 64,
LayerNorm 760 B and 224 B). Keeping the row in shared memory instead is not expressible in Triton
(a loaded tile cannot be pinned in shared memory across reductions; the compiler places shared memory),
and the widest rows exceed it anyway: x and dy of a 65536-column bf16 row are 256 KiB, above an H100
SM's 228 KiB of shared memory and equal to its whole register file, so one read per row there needs the
row split over a thread-block cluster exchanging partial sums through distributed shared memory, which
Triton does not expose. Reordering the phases per row (A then B for each row, so the second read hits
L2) would need the dw/db partial of the whole row live across rows, i.e. a read-modify-write of the fp32
partial per row (+8n B), more than the 4n B the second read costs. So 10n B per row it is, and the
single-pass widths stay where registers allow.

FP8 epilogue (forward, QUANT_GROUP not None; kernels/_quantize_epilogue.py): the rounded y is also quantized
to FP8 with a scale per row or per 1 x 128 / 1 x 32 segment, bit-identical to kernels/quantize.py on y, +1 B
per element and 4 B per group written, in place of a quantize kernel that reads y again (2n B more for
16-bit y). Single pass: the row is in registers, every scaling fits. Looped (wide rows): the segments
quantize in pass 2 (BLOCK_N is a multiple of 128); a rowwise scale needs the row's amax, known only after
pass 2, so rowwise adds a pass 3 re-reading the stored y (2n B, what the separate kernel would read).
The epilogue has its own kernels, one per norm (``_rms_norm_fwd_fp8_kernel``, ``_layer_norm_fwd_fp8_kernel``),
which share one body, ``_norm_fwd``, with ``_norm_fwd_kernel`` (which carries no FP8 flag: QUANT_GROUP None
compiles to no epilogue). FP8_MAX follows from q's dtype and the scale floor is kernels/quantize.py's EPS, so
neither is a flag; the forward's casting is one ``CAST`` constexpr (:data:`CASTS`) and its accumulation dtype
that of rstd.

Offsets: the row index is promoted to int64 before it multiplies a stride, so tensors with 2^31 or more
elements address correctly.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from wavefront import runtime
from wavefront.kernels._heuristics import acc_dtype, stat_dtype
from wavefront.kernels._launch import launch
from wavefront.kernels._quantize_epilogue import (
    GROUPS,
    SCALE_EPS,
    alloc_fp8_out,
    fp8_max,
    fp8_row_ptrs,
    masked_amax,
    quantize_block,
    store_fp8,
)
from wavefront.kernels.quantize import _scale_from_amax
from wavefront.kernels.row_config import row_config


@triton.jit
def _rounded(v, OUT_DTYPE: tl.constexpr, ACC: tl.constexpr, ROUND: tl.constexpr):
    """v rounded to the input dtype (and back) when ROUND: where eager in that dtype rounds."""
    if ROUND:
        v = v.to(OUT_DTYPE).to(ACC)
    return v


@triton.jit
def _load_affine(w_ptr, b_ptr, cols, mask, offset, ACC: tl.constexpr, HAS_WEIGHT: tl.constexpr,
                 HAS_BIAS: tl.constexpr, OUT_DTYPE: tl.constexpr = None, ROUND_STATS: tl.constexpr = False):
    w = 0.0
    b = 0.0
    if HAS_WEIGHT:
        w = _rounded(tl.load(w_ptr + cols, mask=mask, other=0.0).to(ACC) + offset, OUT_DTYPE, ACC, ROUND_STATS)
    if HAS_BIAS:
        b = tl.load(b_ptr + cols, mask=mask, other=0.0).to(ACC)
    return w, b


@triton.jit
def _affine(xhat, w, b, OUT_DTYPE: tl.constexpr, ACC: tl.constexpr, HAS_WEIGHT: tl.constexpr,
            HAS_BIAS: tl.constexpr, CAST_BEFORE_WEIGHT: tl.constexpr):
    if CAST_BEFORE_WEIGHT:
        # Llama: round the normalized value to the input dtype, then scale (as eager bf16 * bf16 does).
        xhat = xhat.to(OUT_DTYPE).to(ACC)
    y = xhat
    if HAS_WEIGHT:
        y = y * w
    if HAS_BIAS:
        y = y + b
    return y


@triton.jit
def _rstd(var, eps, IS_RMS: tl.constexpr, OUT_DTYPE: tl.constexpr = None, ACC: tl.constexpr = None,
          ROUND_STATS: tl.constexpr = False):
    if ROUND_STATS:
        # Eager in the input dtype: mean(x^2), + eps and rsqrt each round to that dtype.
        rstd = _rounded(1.0 / tl.sqrt(_rounded(_rounded(var, OUT_DTYPE, ACC, True) + eps, OUT_DTYPE, ACC, True)),
                        OUT_DTYPE, ACC, True)
    else:
        rstd = 1.0 / tl.sqrt(var + eps)
    if not IS_RMS:
        # A variance that overflowed would give rstd = 0 and y = bias exactly, hiding the overflow; PyTorch's
        # layer_norm returns NaN there, and so do we. (RMSNorm's x * 0 = 0 is PyTorch's rms_norm result too.)
        rstd = tl.where(var == float("inf"), float("nan"), rstd)
    return rstd


@triton.jit
def _norm_fwd_row(x_ptr, res_ptr, y_ptr, res_out_ptr, mean_ptr, rstd_ptr, w_ptr, b_ptr, q_ptr, q_scale_ptr, row, w,
                  b, cols0, mask, n_cols, stride_x_row, stride_res_row, stride_y_row, stride_res_out_row, eps, offset,
                  IS_RMS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
                  CAST_BEFORE_WEIGHT: tl.constexpr, WEIGHT_FIRST: tl.constexpr, ACC: tl.constexpr,
                  BLOCK_N: tl.constexpr, QUANT_GROUP: tl.constexpr, FP8_MAX: tl.constexpr, Q_EPS: tl.constexpr,
                  POW2: tl.constexpr, ROUND_STATS: tl.constexpr):
    """One row held in registers: read once, statistics, normalized output (and its FP8 quantization with
    QUANT_GROUP). Without WEIGHT_FIRST, w and b are loaded here, after the reductions (w, b given are
    placeholders)."""
    OUT_DTYPE = y_ptr.dtype.element_ty
    x = tl.load(x_ptr + row * stride_x_row + cols0, mask=mask, other=0.0).to(ACC)
    if HAS_RESIDUAL:
        res = tl.load(res_ptr + row * stride_res_row + cols0, mask=mask, other=0.0)
        s = (x + res.to(ACC)).to(OUT_DTYPE)
        tl.store(res_out_ptr + row * stride_res_out_row + cols0, s, mask=mask)
        x = s.to(ACC)
    if IS_RMS:
        xc = x
    else:
        mean = tl.sum(x, axis=0) / n_cols
        # One refinement step: the rounding error of the first sum, recovered from centred values.
        mean += tl.sum(tl.where(mask, x - mean, 0.0), axis=0) / n_cols
        tl.store(mean_ptr + row, mean)
        xc = tl.where(mask, x - mean, 0.0)
    rstd = _rstd(tl.sum(_rounded(xc * xc, OUT_DTYPE, ACC, ROUND_STATS), axis=0) / n_cols, eps, IS_RMS, OUT_DTYPE, ACC,
                 ROUND_STATS)
    tl.store(rstd_ptr + row, rstd)
    if not WEIGHT_FIRST:
        w, b = _load_affine(w_ptr, b_ptr, cols0, mask, offset, ACC, HAS_WEIGHT, HAS_BIAS, OUT_DTYPE, ROUND_STATS)
    y = _affine(xc * rstd, w, b, OUT_DTYPE, ACC, HAS_WEIGHT, HAS_BIAS, CAST_BEFORE_WEIGHT)
    tl.store(y_ptr + row * stride_y_row + cols0, y.to(OUT_DTYPE), mask=mask)
    if QUANT_GROUP is not None:
        # The rounded y, as stored (the same expression: one conversion after CSE).
        q_row, s_row = fp8_row_ptrs(q_ptr, q_scale_ptr, row, n_cols, QUANT_GROUP)
        quantize_block(y.to(OUT_DTYPE).to(tl.float32), 0, cols0, mask, q_row, s_row, n_cols, QUANT_GROUP, BLOCK_N, FP8_MAX, Q_EPS,
                       POW2)


@triton.jit
def _norm_fwd_rows(x_ptr, res_ptr, w_ptr, b_ptr, y_ptr, res_out_ptr, mean_ptr, rstd_ptr, q_ptr, q_scale_ptr, n_rows,
                   n_cols, stride_x_row, stride_res_row, stride_y_row, stride_res_out_row, eps, offset,
                   IS_RMS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
                   CAST_BEFORE_WEIGHT: tl.constexpr, ROWS_PER_PROGRAM: tl.constexpr, WEIGHT_FIRST: tl.constexpr,
                   BLOCK_N: tl.constexpr, ACC: tl.constexpr, ROUND_STATS: tl.constexpr, QUANT_GROUP: tl.constexpr,
                   FP8_MAX: tl.constexpr, Q_EPS: tl.constexpr, POW2: tl.constexpr):
    """Single pass: the program's ROWS_PER_PROGRAM rows, each held in registers (QUANT_GROUP None: no FP8)."""
    OUT_DTYPE = y_ptr.dtype.element_ty
    cols0 = tl.arange(0, BLOCK_N)
    mask = cols0 < n_cols
    # WEIGHT_FIRST: the weight (and bias) load is issued before the row's: its latency hides behind the row's
    # load and reductions, and the program's ROWS_PER_PROGRAM rows share it (row_config.py says where).
    w = 0.0
    b = 0.0
    if WEIGHT_FIRST:
        w, b = _load_affine(w_ptr, b_ptr, cols0, mask, offset, ACC, HAS_WEIGHT, HAS_BIAS, OUT_DTYPE, ROUND_STATS)
    first = tl.program_id(0).to(tl.int64) * ROWS_PER_PROGRAM
    for i in range(ROWS_PER_PROGRAM):
        row = first + i
        if row < n_rows:
            _norm_fwd_row(x_ptr, res_ptr, y_ptr, res_out_ptr, mean_ptr, rstd_ptr, w_ptr, b_ptr, q_ptr, q_scale_ptr,
                          row, w, b, cols0, mask, n_cols, stride_x_row, stride_res_row, stride_y_row,
                          stride_res_out_row, eps, offset, IS_RMS, HAS_RESIDUAL, HAS_WEIGHT, HAS_BIAS,
                          CAST_BEFORE_WEIGHT, WEIGHT_FIRST, ACC, BLOCK_N, QUANT_GROUP, FP8_MAX, Q_EPS, POW2,
                          ROUND_STATS)


@triton.jit
def _norm_fwd_stats(x_ptr, y_ptr, res_ptr, res_out_ptr, mean_ptr, rstd_ptr, n_cols, stride_x_row, stride_y_row,
                    stride_res_row, stride_res_out_row, eps, IS_RMS: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
                    BLOCK_N: tl.constexpr, ACC: tl.constexpr, ROUND_STATS: tl.constexpr, OUT_DTYPE: tl.constexpr):
    """Looped rows (one per program), pass 1: the row's statistics (stored) from shifted sums, and the add
    variant's rounded sum (stored). LayerNorm shifts by K, the (refined) mean of the first block, so the sums
    of (x - K) and (x - K)^2 see centred values: no cancellation when the mean is large against the spread,
    and the final correction (mean - K)^2 is tiny. Returns (row, cols0, x_row, y_row, mean, rstd)."""
    cols0 = tl.arange(0, BLOCK_N)
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_x_row
    y_row = y_ptr + row * stride_y_row
    k = tl.zeros((), dtype=ACC)
    if not IS_RMS:
        first = cols0 < n_cols
        x0 = tl.load(x_row + cols0, mask=first, other=0.0).to(ACC)
        if HAS_RESIDUAL:
            r0 = tl.load(res_ptr + row * stride_res_row + cols0, mask=first, other=0.0).to(ACC)
            x0 = (x0 + r0).to(OUT_DTYPE).to(ACC)
        n0 = tl.minimum(n_cols, BLOCK_N)
        k = tl.sum(x0, axis=0) / n0
        k += tl.sum(tl.where(first, x0 - k, 0.0), axis=0) / n0
    sum_d = tl.zeros((), dtype=ACC)
    sum_d2 = tl.zeros((), dtype=ACC)
    for start in range(0, n_cols, BLOCK_N):
        cols = start + cols0
        mask = cols < n_cols
        x = tl.load(x_row + cols, mask=mask, other=0.0).to(ACC)
        if HAS_RESIDUAL:
            res = tl.load(res_ptr + row * stride_res_row + cols, mask=mask, other=0.0)
            s = (x + res.to(ACC)).to(OUT_DTYPE)
            tl.store(res_out_ptr + row * stride_res_out_row + cols, s, mask=mask)
            x = s.to(ACC)
        d = tl.where(mask, x - k, 0.0)
        sum_d += tl.sum(d, axis=0)
        sum_d2 += tl.sum(_rounded(d * d, OUT_DTYPE, ACC, ROUND_STATS), axis=0)
    run_mean = k + sum_d / n_cols
    if IS_RMS:
        run_m2 = sum_d2
    else:
        run_m2 = sum_d2 - sum_d * (sum_d / n_cols)
    rstd = _rstd(run_m2 / n_cols, eps, IS_RMS, OUT_DTYPE, ACC, ROUND_STATS)
    tl.store(rstd_ptr + row, rstd)
    if not IS_RMS:
        tl.store(mean_ptr + row, run_mean)
    return row, cols0, x_row, y_row, run_mean, rstd


@triton.jit
def _norm_fwd_block(x_row, y_row, res_out_ptr, w_ptr, b_ptr, row, cols, mask, stride_res_out_row, run_mean, rstd,
                    offset, IS_RMS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, HAS_WEIGHT: tl.constexpr,
                    HAS_BIAS: tl.constexpr, CAST_BEFORE_WEIGHT: tl.constexpr, ACC: tl.constexpr,
                    ROUND_STATS: tl.constexpr, OUT_DTYPE: tl.constexpr):
    """Looped rows, pass 2: one block normalized and stored; returns y before rounding. The add variant
    re-reads its own rounded sum."""
    if HAS_RESIDUAL:
        x = tl.load(res_out_ptr + row * stride_res_out_row + cols, mask=mask, other=0.0).to(ACC)
    else:
        x = tl.load(x_row + cols, mask=mask, other=0.0).to(ACC)
    xc = x if IS_RMS else x - run_mean
    w, b = _load_affine(w_ptr, b_ptr, cols, mask, offset, ACC, HAS_WEIGHT, HAS_BIAS, OUT_DTYPE, ROUND_STATS)
    y = _affine(xc * rstd, w, b, OUT_DTYPE, ACC, HAS_WEIGHT, HAS_BIAS, CAST_BEFORE_WEIGHT)
    tl.store(y_row + cols, y.to(OUT_DTYPE), mask=mask)
    return y


@triton.jit
def _norm_fwd(
    x_ptr, res_ptr, w_ptr, b_ptr, y_ptr, res_out_ptr, mean_ptr, rstd_ptr, q_ptr, q_scale_ptr,
    n_rows, n_cols, stride_x_row, stride_res_row, stride_y_row, stride_res_out_row,
    eps, offset,
    IS_RMS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
    CAST: tl.constexpr, SINGLE_PASS: tl.constexpr, ROWS_PER_PROGRAM: tl.constexpr, WEIGHT_FIRST: tl.constexpr,
    BLOCK_N: tl.constexpr, QUANT_GROUP: tl.constexpr, POW2: tl.constexpr,
):
    """The forward's body under its three kernels. CAST (see :data:`CASTS`): "fp32" multiplies the weight in
    fp32, "llama" rounds xhat first, "input" also rounds the statistics as eager in the input dtype;
    accumulation in rstd's dtype (fp64 for fp64 inputs). QUANT_GROUP None: no FP8 epilogue; else 0 (rowwise)
    or the segment width, the format's largest value from q's dtype."""
    CAST_BEFORE_WEIGHT: tl.constexpr = CAST != "fp32"
    ROUND_STATS: tl.constexpr = CAST == "input"
    ACC = rstd_ptr.dtype.element_ty
    OUT_DTYPE = y_ptr.dtype.element_ty
    FP8_MAX: tl.constexpr = fp8_max(q_ptr.dtype.element_ty) if QUANT_GROUP is not None else None
    Q_EPS: tl.constexpr = SCALE_EPS if QUANT_GROUP is not None else None
    if SINGLE_PASS:
        _norm_fwd_rows(x_ptr, res_ptr, w_ptr, b_ptr, y_ptr, res_out_ptr, mean_ptr, rstd_ptr, q_ptr, q_scale_ptr,
                       n_rows, n_cols, stride_x_row, stride_res_row, stride_y_row, stride_res_out_row, eps, offset,
                       IS_RMS, HAS_RESIDUAL, HAS_WEIGHT, HAS_BIAS, CAST_BEFORE_WEIGHT, ROWS_PER_PROGRAM, WEIGHT_FIRST,
                       BLOCK_N, ACC, ROUND_STATS, QUANT_GROUP, FP8_MAX, Q_EPS, POW2)
    else:
        row, cols0, x_row, y_row, run_mean, rstd = _norm_fwd_stats(
            x_ptr, y_ptr, res_ptr, res_out_ptr, mean_ptr, rstd_ptr, n_cols, stride_x_row, stride_y_row, stride_res_row,
            stride_res_out_row, eps, IS_RMS, HAS_RESIDUAL, BLOCK_N, ACC, ROUND_STATS, OUT_DTYPE)
        if QUANT_GROUP is not None:
            # FP8 blocks quantize in pass 2; a rowwise scale needs the row's amax first, so rowwise takes a pass 3
            # over the stored y.
            q_row, s_row = fp8_row_ptrs(q_ptr, q_scale_ptr, row, n_cols, QUANT_GROUP)
            q_amax = tl.zeros((), dtype=tl.float32)
        for start in range(0, n_cols, BLOCK_N):
            cols = start + cols0
            mask = cols < n_cols
            y = _norm_fwd_block(x_row, y_row, res_out_ptr, w_ptr, b_ptr, row, cols, mask, stride_res_out_row,
                                run_mean, rstd, offset, IS_RMS, HAS_RESIDUAL, HAS_WEIGHT, HAS_BIAS,
                                CAST_BEFORE_WEIGHT, ACC, ROUND_STATS, OUT_DTYPE)
            if QUANT_GROUP == 0:
                q_amax = tl.maximum(q_amax, masked_amax(y.to(OUT_DTYPE).to(tl.float32), mask))
            elif QUANT_GROUP is not None:
                quantize_block(y.to(OUT_DTYPE).to(tl.float32), start, cols, mask, q_row, s_row, n_cols, QUANT_GROUP,
                               BLOCK_N, FP8_MAX, Q_EPS, POW2)
        if QUANT_GROUP == 0:
            # Pass 3 (rowwise, wide rows only): the program re-reads the y it stored, in the same layout.
            scale = _scale_from_amax(q_amax, FP8_MAX, Q_EPS, POW2)
            tl.store(s_row, scale)
            for start in range(0, n_cols, BLOCK_N):
                cols = start + cols0
                mask = cols < n_cols
                y = tl.load(y_row + cols, mask=mask, other=0.0).to(tl.float32)
                store_fp8(y, scale, q_row + cols, mask, FP8_MAX)


@triton.jit
def _norm_fwd_kernel(
    x_ptr, res_ptr, w_ptr, b_ptr, y_ptr, res_out_ptr, mean_ptr, rstd_ptr,
    n_rows, n_cols, stride_x_row, stride_res_row, stride_y_row, stride_res_out_row,
    eps, offset,
    IS_RMS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr,
    CAST: tl.constexpr, SINGLE_PASS: tl.constexpr, ROWS_PER_PROGRAM: tl.constexpr, WEIGHT_FIRST: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """RMSNorm or LayerNorm, optionally after the residual add: no FP8 flag."""
    _norm_fwd(x_ptr, res_ptr, w_ptr, b_ptr, y_ptr, res_out_ptr, mean_ptr, rstd_ptr, None, None, n_rows, n_cols,
              stride_x_row, stride_res_row, stride_y_row, stride_res_out_row, eps, offset, IS_RMS, HAS_RESIDUAL,
              HAS_WEIGHT, HAS_BIAS, CAST, SINGLE_PASS, ROWS_PER_PROGRAM, WEIGHT_FIRST, BLOCK_N, None, None)


@triton.jit
def _rms_norm_fwd_fp8_kernel(
    x_ptr, res_ptr, w_ptr, y_ptr, res_out_ptr, rstd_ptr, q_ptr, q_scale_ptr,
    n_rows, n_cols, stride_x_row, stride_res_row, stride_y_row, stride_res_out_row,
    eps, offset,
    HAS_RESIDUAL: tl.constexpr, HAS_WEIGHT: tl.constexpr, CAST: tl.constexpr, SINGLE_PASS: tl.constexpr,
    ROWS_PER_PROGRAM: tl.constexpr, WEIGHT_FIRST: tl.constexpr, BLOCK_N: tl.constexpr, QUANT_GROUP: tl.constexpr,
    POW2: tl.constexpr,
):
    """RMSNorm (optionally after the residual add) with the FP8 epilogue: no mean, no bias."""
    _norm_fwd(x_ptr, res_ptr, w_ptr, None, y_ptr, res_out_ptr, None, rstd_ptr, q_ptr, q_scale_ptr, n_rows, n_cols,
              stride_x_row, stride_res_row, stride_y_row, stride_res_out_row, eps, offset, True, HAS_RESIDUAL,
              HAS_WEIGHT, False, CAST, SINGLE_PASS, ROWS_PER_PROGRAM, WEIGHT_FIRST, BLOCK_N, QUANT_GROUP, POW2)


@triton.jit
def _layer_norm_fwd_fp8_kernel(
    x_ptr, res_ptr, w_ptr, b_ptr, y_ptr, res_out_ptr, mean_ptr, rstd_ptr, q_ptr, q_scale_ptr,
    n_rows, n_cols, stride_x_row, stride_res_row, stride_y_row, stride_res_out_row,
    eps, offset,
    HAS_RESIDUAL: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, SINGLE_PASS: tl.constexpr,
    ROWS_PER_PROGRAM: tl.constexpr, WEIGHT_FIRST: tl.constexpr, BLOCK_N: tl.constexpr, QUANT_GROUP: tl.constexpr,
    POW2: tl.constexpr,
):
    """LayerNorm with the FP8 epilogue: the weight multiplies in fp32 (LayerNorm has no other cast)."""
    _norm_fwd(x_ptr, res_ptr, w_ptr, b_ptr, y_ptr, res_out_ptr, mean_ptr, rstd_ptr, q_ptr, q_scale_ptr, n_rows,
              n_cols, stride_x_row, stride_res_row, stride_y_row, stride_res_out_row, eps, offset, False,
              HAS_RESIDUAL, HAS_WEIGHT, HAS_BIAS, "fp32", SINGLE_PASS, ROWS_PER_PROGRAM, WEIGHT_FIRST, BLOCK_N,
              QUANT_GROUP, POW2)


@triton.jit
def _xhat_g(x_ptr, dy_ptr, mean_ptr, rstd_ptr, row, stride_x_row, stride_dy_row, cols, mask, w,
            IS_RMS: tl.constexpr, HAS_WEIGHT: tl.constexpr, ACC: tl.constexpr):
    """Row `row`'s normalized input and weighted upstream gradient on `cols`, and its dy."""
    x = tl.load(x_ptr + row * stride_x_row + cols, mask=mask, other=0.0).to(ACC)
    dy = tl.load(dy_ptr + row * stride_dy_row + cols, mask=mask, other=0.0).to(ACC)
    rstd = tl.load(rstd_ptr + row)
    if IS_RMS:
        xhat = x * rstd
    else:
        xhat = tl.where(mask, (x - tl.load(mean_ptr + row)) * rstd, 0.0)
    g = dy * w if HAS_WEIGHT else dy
    return xhat, g, dy, rstd


@triton.jit
def _row_loads(x_ptr, dy_ptr, mean_ptr, rstd_ptr, row, row_end, stride_x_row, stride_dy_row, cols, mask,
               IS_RMS: tl.constexpr, ACC: tl.constexpr):
    """Row `row`'s x and dy (input dtype) and its statistics; past `row_end` the vectors are not read (the
    statistics are re-read from the last row: 4-8 bytes, a cache hit)."""
    # The row test as a block-shaped mask (a scalar mask is not accepted by every backend's masked load).
    in_rows = mask & ((cols * 0 + row) < row_end)
    x = tl.load(x_ptr + row * stride_x_row + cols, mask=in_rows, other=0.0)
    dy = tl.load(dy_ptr + row * stride_dy_row + cols, mask=in_rows, other=0.0)
    stat_row = tl.minimum(row, row_end - 1)
    rstd = tl.load(rstd_ptr + stat_row).to(ACC)
    if IS_RMS:
        mean = tl.zeros((), ACC)
    else:
        mean = tl.load(mean_ptr + stat_row).to(ACC)
    return x, dy, rstd, mean


@triton.jit
def _dx(xhat, g, rstd, c1, c2, IS_RMS: tl.constexpr):
    """dx = rstd * (g - xhat * c1 [- c2]), in the order autograd's chain rule uses (see the header)."""
    dx = g * rstd - xhat * (c1 * rstd)
    if not IS_RMS:
        dx -= c2 * rstd
    return dx


@triton.jit
def _norm_bwd_kernel(
    x_ptr, w_ptr, dy_ptr, dres_ptr, dx_ptr, dw_part_ptr, db_part_ptr, mean_ptr, rstd_ptr, sums_ptr,
    n_rows, n_cols, rows_per_program,
    stride_x_row, stride_dy_row, stride_dres_row, stride_dx_row,
    offset,
    IS_RMS: tl.constexpr, HAS_WEIGHT: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_DRES: tl.constexpr,
    SINGLE_PASS: tl.constexpr, PREFETCH: tl.constexpr, BLOCK_N: tl.constexpr, ACC: tl.constexpr,
    STAGES: tl.constexpr = 1,
):
    pid = tl.program_id(0)
    # int64 loop bounds: the loop variable multiplies row strides.
    row_start = pid.to(tl.int64) * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, n_rows)
    OUT_DTYPE = dx_ptr.dtype.element_ty
    cols0 = tl.arange(0, BLOCK_N)
    part_row = pid.to(tl.int64) * n_cols
    if SINGLE_PASS:
        mask = cols0 < n_cols
        w, _ = _load_affine(w_ptr, w_ptr, cols0, mask, offset, ACC, HAS_WEIGHT, False)
        dw_acc = tl.zeros((BLOCK_N,), dtype=ACC)
        db_acc = tl.zeros((BLOCK_N,), dtype=ACC)
        if PREFETCH:
            # Software pipelining: the next row's x, dy and statistics are loaded (in the input dtype) before this
            # row's reductions, so their memory latency overlaps this row's arithmetic instead of following it.
            # (The grid has no empty program, so row_start < row_end.)
            x_next, dy_next, rstd_next, mean_next = _row_loads(x_ptr, dy_ptr, mean_ptr, rstd_ptr, row_start, row_end,
                                                               stride_x_row, stride_dy_row, cols0, mask, IS_RMS, ACC)
            for row in range(row_start, row_end):
                x_raw, dy_raw, rstd, mean = x_next, dy_next, rstd_next, mean_next
                x_next, dy_next, rstd_next, mean_next = _row_loads(x_ptr, dy_ptr, mean_ptr, rstd_ptr, row + 1, row_end,
                                                                   stride_x_row, stride_dy_row, cols0, mask, IS_RMS,
                                                                   ACC)
                dy = dy_raw.to(ACC)
                if IS_RMS:
                    xhat = x_raw.to(ACC) * rstd
                else:
                    xhat = tl.where(mask, (x_raw.to(ACC) - mean) * rstd, 0.0)
                g = dy * w if HAS_WEIGHT else dy
                c2 = 0.0
                if not IS_RMS:
                    c2 = tl.sum(g, axis=0) / n_cols
                dx = _dx(xhat, g, rstd, tl.sum(xhat * g, axis=0) / n_cols, c2, IS_RMS)
                if HAS_DRES:
                    dx += tl.load(dres_ptr + row * stride_dres_row + cols0, mask=mask, other=0.0).to(ACC)
                tl.store(dx_ptr + row * stride_dx_row + cols0, dx.to(OUT_DTYPE), mask=mask)
                dw_acc += dy * xhat
                db_acc += dy
        else:
            for row in tl.range(row_start, row_end, num_stages=STAGES):
                xhat, g, dy, rstd = _xhat_g(x_ptr, dy_ptr, mean_ptr, rstd_ptr, row, stride_x_row, stride_dy_row,
                                            cols0, mask, w, IS_RMS, HAS_WEIGHT, ACC)
                c2 = 0.0
                if not IS_RMS:
                    c2 = tl.sum(g, axis=0) / n_cols
                dx = _dx(xhat, g, rstd, tl.sum(xhat * g, axis=0) / n_cols, c2, IS_RMS)
                if HAS_DRES:
                    dx += tl.load(dres_ptr + row * stride_dres_row + cols0, mask=mask, other=0.0).to(ACC)
                tl.store(dx_ptr + row * stride_dx_row + cols0, dx.to(OUT_DTYPE), mask=mask)
                dw_acc += dy * xhat
                db_acc += dy
        if HAS_WEIGHT:
            tl.store(dw_part_ptr + part_row + cols0, dw_acc, mask=mask)
        if HAS_BIAS:
            tl.store(db_part_ptr + part_row + cols0, db_acc, mask=mask)
    else:
        # Phase A: each row's sums of xhat * g and of g, block by block, kept in sums_ptr[row, 0:2]. The
        # blocks add in column order, as a register accumulator would.
        for start in range(0, n_cols, BLOCK_N):
            cols = start + cols0
            mask = cols < n_cols
            w, _ = _load_affine(w_ptr, w_ptr, cols, mask, offset, ACC, HAS_WEIGHT, False)
            for row in range(row_start, row_end):
                xhat, g, dy, rstd = _xhat_g(x_ptr, dy_ptr, mean_ptr, rstd_ptr, row, stride_x_row, stride_dy_row,
                                            cols, mask, w, IS_RMS, HAS_WEIGHT, ACC)
                s_xg = tl.sum(xhat * g, axis=0)
                s_g = tl.sum(g, axis=0)
                if start > 0:
                    s_xg = tl.load(sums_ptr + 2 * row) + s_xg
                    s_g = tl.load(sums_ptr + 2 * row + 1) + s_g
                tl.store(sums_ptr + 2 * row, s_xg)
                tl.store(sums_ptr + 2 * row + 1, s_g)
        # Phase B: per column block, dx of every row and this program's dw/db partial, written once.
        for start in range(0, n_cols, BLOCK_N):
            cols = start + cols0
            mask = cols < n_cols
            w, _ = _load_affine(w_ptr, w_ptr, cols, mask, offset, ACC, HAS_WEIGHT, False)
            dw_acc = tl.zeros((BLOCK_N,), dtype=ACC)
            db_acc = tl.zeros((BLOCK_N,), dtype=ACC)
            for row in range(row_start, row_end):
                xhat, g, dy, rstd = _xhat_g(x_ptr, dy_ptr, mean_ptr, rstd_ptr, row, stride_x_row, stride_dy_row,
                                            cols, mask, w, IS_RMS, HAS_WEIGHT, ACC)
                c2 = 0.0
                if not IS_RMS:
                    c2 = tl.load(sums_ptr + 2 * row + 1) / n_cols
                dx = _dx(xhat, g, rstd, tl.load(sums_ptr + 2 * row) / n_cols, c2, IS_RMS)
                if HAS_DRES:
                    dx += tl.load(dres_ptr + row * stride_dres_row + cols, mask=mask, other=0.0).to(ACC)
                tl.store(dx_ptr + row * stride_dx_row + cols, dx.to(OUT_DTYPE), mask=mask)
                dw_acc += dy * xhat
                db_acc += dy
            if HAS_WEIGHT:
                tl.store(dw_part_ptr + part_row + cols, dw_acc, mask=mask)
            if HAS_BIAS:
                tl.store(db_part_ptr + part_row + cols, db_acc, mask=mask)


def _persistent_grid(n_rows: int, device) -> tuple[int, int]:
    """(n_programs, rows_per_program): about PERSISTENT_PROGRAMS_PER_SM programs per SM, none idle."""
    target = runtime.sm_count(device) * runtime.PERSISTENT_PROGRAMS_PER_SM
    rows_per_program = triton.cdiv(max(n_rows, 1), max(1, min(n_rows, target)))
    return triton.cdiv(max(n_rows, 1), rows_per_program), rows_per_program


#: The forward's CAST constexpr: "fp32" multiplies the weight in fp32 and rounds once (Gemma, LayerNorm), "llama"
#: rounds xhat to the input dtype before the weight, "input" also rounds the statistics (ROUND_STATS, the header).
CASTS = ("fp32", "llama", "input")


def _cast_mode(cast_before_weight: bool, round_stats: bool) -> str:
    if round_stats and not cast_before_weight:
        raise ValueError("norm_fwd: round_stats (cast='input') rounds xhat before the weight too; got "
                         "cast_before_weight=False")
    return "input" if round_stats else "llama" if cast_before_weight else "fp32"


def norm_fwd(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
             residual: torch.Tensor | None, eps: float, offset: float, is_rms: bool, cast_before_weight: bool,
             quant: tuple[torch.dtype, str, bool] | None = None, round_stats: bool = False):
    """x, residual: [n_rows, n_cols] with unit column stride. Returns (y, new_residual, mean, rstd, q, q_scale).

    new_residual is None without a residual; mean is None for RMSNorm. round_stats: cast="input" (the header). quant = (fp8 dtype, scaling, pow2
    scale) quantizes y in the same pass (kernels/_quantize_epilogue.py): q [n_rows, n_cols] and its fp32
    scales, as kernels.quantize.quantize(y, ...) returns them; both None without quant.
    """
    n_rows, n_cols = x.shape
    cfg = row_config(n_cols, x.dtype, runtime.arch(x.device), multi_row=True)
    y = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
    stat = stat_dtype(x.dtype)
    rstd = torch.empty(n_rows, dtype=stat, device=x.device)
    mean = None if is_rms else torch.empty(n_rows, dtype=stat, device=x.device)
    res_out = None if residual is None else torch.empty_like(y)
    q, q_scale = alloc_fp8_out(quant, n_rows, n_cols, x.device)
    if n_rows == 0:
        return y, res_out, mean, rstd, q, q_scale
    cast = _cast_mode(cast_before_weight, round_stats)
    rows = dict(x_ptr=x, res_ptr=residual, w_ptr=weight, y_ptr=y, res_out_ptr=res_out, rstd_ptr=rstd, n_rows=n_rows,
                n_cols=n_cols, stride_x_row=x.stride(0), stride_res_row=residual.stride(0) if residual is not None else 0,
                stride_y_row=y.stride(0), stride_res_out_row=res_out.stride(0) if res_out is not None else 0, eps=eps,
                offset=offset)
    schedule = dict(HAS_RESIDUAL=residual is not None, HAS_WEIGHT=weight is not None, SINGLE_PASS=cfg.single_pass,
                    ROWS_PER_PROGRAM=cfg.rows_per_program, WEIGHT_FIRST=cfg.weight_first, BLOCK_N=cfg.BLOCK_N)
    grid = (triton.cdiv(n_rows, cfg.rows_per_program),)
    if quant is None:
        launch(_norm_fwd_kernel, grid, **rows, b_ptr=bias, mean_ptr=mean,
               constexprs=dict(schedule, IS_RMS=is_rms, HAS_BIAS=bias is not None, CAST=cast), options=cfg.options())
        return y, res_out, mean, rstd, q, q_scale
    # The FP8 epilogue: one kernel per norm over the same helpers (the plain kernel carries no FP8 flags).
    _, scaling, pow2 = quant
    epilogue = dict(q_ptr=q, q_scale_ptr=q_scale)
    recipe = dict(QUANT_GROUP=GROUPS[scaling], POW2=bool(pow2))
    if is_rms:
        if bias is not None:
            raise ValueError("norm_fwd: RMSNorm's FP8 forward takes no bias; got a bias with is_rms=True")
        launch(_rms_norm_fwd_fp8_kernel, grid, **rows, **epilogue, constexprs=dict(schedule, CAST=cast, **recipe),
               options=cfg.options())
    else:
        if cast != "fp32":
            raise ValueError(f"norm_fwd: LayerNorm multiplies the weight in fp32; got cast {cast!r} with is_rms=False")
        launch(_layer_norm_fwd_fp8_kernel, grid, **rows, **epilogue, b_ptr=bias, mean_ptr=mean,
               constexprs=dict(schedule, HAS_BIAS=bias is not None, **recipe), options=cfg.options())
    return y, res_out, mean, rstd, q, q_scale


def norm_bwd(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor | None, has_bias: bool,
             mean: torch.Tensor | None, rstd: torch.Tensor, d_residual: torch.Tensor | None, offset: float):
    """dy, x, d_residual: [n_rows, n_cols]. Returns (dx, dweight or None, dbias or None)."""
    n_rows, n_cols = x.shape
    cfg = row_config(n_cols, x.dtype, runtime.arch(x.device), accumulate=True)
    dx = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
    n_programs, rows_per_program = _persistent_grid(n_rows, x.device)
    part_dtype = stat_dtype(x.dtype)
    # Every program writes its whole partial row, so the partials need no zeroing; with no rows there is
    # no launch and the gradients are zero.
    alloc = torch.empty if n_rows > 0 else torch.zeros
    dw_part = alloc((n_programs, n_cols), dtype=part_dtype, device=x.device) if weight is not None else None
    db_part = alloc((n_programs, n_cols), dtype=part_dtype, device=x.device) if has_bias else None
    sums = None if cfg.single_pass else torch.empty((n_rows, 2), dtype=part_dtype, device=x.device)
    if n_rows > 0:
        launch(
            _norm_bwd_kernel, (n_programs,),
            x_ptr=x, w_ptr=weight, dy_ptr=dy, dres_ptr=d_residual, dx_ptr=dx, dw_part_ptr=dw_part,
            db_part_ptr=db_part, mean_ptr=mean, rstd_ptr=rstd, sums_ptr=sums,
            n_rows=n_rows, n_cols=n_cols, rows_per_program=rows_per_program,
            stride_x_row=x.stride(0), stride_dy_row=dy.stride(0),
            stride_dres_row=d_residual.stride(0) if d_residual is not None else 0, stride_dx_row=dx.stride(0),
            offset=offset,
            constexprs=dict(IS_RMS=mean is None, HAS_WEIGHT=weight is not None, HAS_BIAS=has_bias,
                            HAS_DRES=d_residual is not None, SINGLE_PASS=cfg.single_pass, PREFETCH=cfg.prefetch, STAGES=cfg.row_stages,
                            BLOCK_N=cfg.BLOCK_N,
                            ACC=acc_dtype(x.dtype)),
            options=cfg.options(),
        )
    dw = dw_part.sum(0).to(weight.dtype) if weight is not None else None
    db = db_part.sum(0).to(x.dtype) if has_bias else None
    return dx, dw, db
