"""FP8 quantization as the epilogue of a producer kernel (the norms, the gated activations).

A producer that already holds its output values in registers quantizes them there, to the scale groups of
``wavefront.ops.quantize`` (kernels/quantize.py states the rounding and the saturation), so the FP8 operand
of the next linear costs no second read of the output:

    y_i   = round_to_out_dtype(value_i)       the producer's own output, as it stores it
    amax_G, s_G, q_i                          exactly kernels/quantize.py's, from the fp32 widening of y_i

Quantizing the *rounded* output, not the fp32 value before its rounding, is what makes q and the scales
bit-identical to ``ops.quantize(y)`` (same amax over the same values, same correctly rounded division,
same single fp32 product, same clamp and cast): a linear given the pre-quantized operand computes what it
would compute quantizing y itself.

Groups (``QUANT_GROUP``): ``ROWWISE`` (0) one scale per row, needs the whole row in the program's block;
``G`` (32 or 128) one scale per 1 x G row segment. A block of BLOCK_N columns starting at a multiple of
BLOCK_N holds whole segments when G divides BLOCK_N; when BLOCK_N < G the row (n_cols <= BLOCK_N) is one
segment. Lanes past the row's end (mask off) count as 0 in the amax, as the quantize kernel's masked loads
do.

Traffic: q adds 1 B per element written and the scales 4 B per group; the separate quantize kernel would
read y again (2 B per element for 16-bit y) and write the same q and scales.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from wavefront.kernels.quantize import EPS, _abs_ignoring_nan, _scale_from_amax, _to_fp8, scale_shape

ROWWISE = 0
#: QUANT_GROUP of each supported scaling (ops.quantize's names).
GROUPS = {"rowwise": ROWWISE, "block1x128": 128, "block1x32": 32}

#: The scale's floor (kernels/quantize.py's EPS) as a constexpr a kernel reads instead of taking it as a flag.
SCALE_EPS = tl.constexpr(EPS)

#: Largest finite value of each FP8 format, by Triton element type (torch.finfo's, so the two agree).
_FP8_MAX = {tl.float8e4nv: float(torch.finfo(torch.float8_e4m3fn).max),
            tl.float8e5: float(torch.finfo(torch.float8_e5m2).max),
            tl.float8e4b8: float(torch.finfo(torch.float8_e4m3fnuz).max),
            tl.float8e5b16: float(torch.finfo(torch.float8_e5m2fnuz).max)}

__all__ = ["GROUPS", "ROWWISE", "SCALE_EPS", "alloc_fp8_out", "fp8_constexprs", "fp8_max", "fp8_row_ptrs",
           "masked_amax", "quantize_block", "store_fp8"]


@triton.constexpr_function
def fp8_max(dtype):
    """FP8_MAX of q's element type, at compile time: a kernel derives it from its q pointer (as
    fp8_constexprs derives it from the torch dtype on the host), so it is no flag of the kernel."""
    return _FP8_MAX[dtype]


def fp8_constexprs(quant: tuple[torch.dtype, str, bool] | None) -> dict:
    """The epilogue's constexprs: QUANT_GROUP None (off: the producer compiles as without the epilogue),
    FP8_MAX, Q_EPS and POW2."""
    if quant is None:
        return dict(QUANT_GROUP=None, FP8_MAX=0.0, Q_EPS=EPS, POW2=False)
    fp8_dtype, scaling, pow2 = quant
    return dict(QUANT_GROUP=GROUPS[scaling], FP8_MAX=float(torch.finfo(fp8_dtype).max), Q_EPS=EPS, POW2=bool(pow2))


def alloc_fp8_out(quant: tuple[torch.dtype, str, bool] | None, n_rows: int, n_cols: int, device):
    """(q [n_rows, n_cols] fp8 contiguous, fp32 scales of kernels.quantize.scale_shape), or (None, None)."""
    if quant is None:
        return None, None
    fp8_dtype, scaling, _ = quant
    return (torch.empty((n_rows, n_cols), dtype=fp8_dtype, device=device),
            torch.empty(scale_shape(scaling, n_rows, n_cols), dtype=torch.float32, device=device))


@triton.jit
def masked_amax(y, mask):
    """max |y| over the lanes in `mask`, NaN ignored (as the quantize kernel's amax)."""
    return tl.max(_abs_ignoring_nan(tl.where(mask, y, 0.0)), axis=0)


@triton.jit
def store_fp8(y, scale, q_ptrs, mask, FP8_MAX: tl.constexpr):
    tl.store(q_ptrs, _to_fp8(y, scale, q_ptrs.dtype.element_ty, FP8_MAX), mask=mask)


@triton.jit
def fp8_row_ptrs(q_ptr, s_ptr, row, n_cols, GROUP: tl.constexpr):
    """Row `row`'s q (contiguous rows of n_cols) and scales (1 per row, or cdiv(n_cols, GROUP) per row)."""
    if GROUP == 0:
        s_row = s_ptr + row
    else:
        s_row = s_ptr + row * tl.cdiv(n_cols, GROUP)
    return q_ptr + row * n_cols, s_row


@triton.jit
def quantize_block(y, start, cols, mask, q_row_ptr, s_row_ptr, n_cols, GROUP: tl.constexpr, BLOCK_N: tl.constexpr,
                   FP8_MAX: tl.constexpr, Q_EPS: tl.constexpr, POW2: tl.constexpr):
    """Quantize one block of a row: y [BLOCK_N] fp32 (the rounded output widened) at columns cols = start +
    arange(BLOCK_N), start a multiple of BLOCK_N; q_row_ptr, s_row_ptr from fp8_row_ptrs. GROUP ROWWISE:
    this block is the whole row. GROUP >= BLOCK_N: the row is one segment (start == 0)."""
    if (GROUP == 0) or (GROUP >= BLOCK_N):
        scale = _scale_from_amax(masked_amax(y, mask), FP8_MAX, Q_EPS, POW2)
        tl.store(s_row_ptr, scale)
        store_fp8(y, scale, q_row_ptr + cols, mask, FP8_MAX)
    else:
        N_SEG: tl.constexpr = BLOCK_N // GROUP
        a = tl.reshape(_abs_ignoring_nan(tl.where(mask, y, 0.0)), (N_SEG, GROUP))
        scale = _scale_from_amax(tl.max(a, axis=1), FP8_MAX, Q_EPS, POW2)
        seg = start // GROUP + tl.arange(0, N_SEG)
        tl.store(s_row_ptr + seg, scale, mask=seg < tl.cdiv(n_cols, GROUP))
        scale_el = tl.reshape(tl.broadcast_to(scale[:, None], (N_SEG, GROUP)), (BLOCK_N,))
        store_fp8(y, scale_el, q_row_ptr + cols, mask, FP8_MAX)
