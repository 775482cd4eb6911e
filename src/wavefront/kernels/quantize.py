"""FP8 quantization with scales: one read of x, one write of q (one byte per element) and the scales.

For a group G of x's elements (the whole tensor, one row, a 1 x 128 row segment or a 128 x 128 tile):

    amax_G  = max_{i in G} |x_i|                    exact in any order (a max does not round)
    s_G     = FP8_MAX / max(amax_G, EPS)            fp32, correctly rounded (div_rn); EPS = 1e-12 keeps an
                                                    all-zero group finite (its q is all zeros)
    s_G     = 2^floor(log2 s_G)    if POW2          by clearing the mantissa bits: exact, no log2 on device
    q_i     = fp8_rne(clamp(fp32(x_i * s_G), -FP8_MAX, FP8_MAX))

Dequantization is ``q / s``. Saturation: by construction |x_i * s_G| <= FP8_MAX up to the fp32 rounding of
the product, which the clamp catches, so the cast never sees an out-of-range value and never makes an inf
(e5m2 has one) or a NaN (e4m3fn and the FNUZ formats use their top code for it). Hardware casts agree on
every in-range value (round to nearest even: PTX ``cvt.rn.satfinite.e4m3x2.f32`` / ``e5m2x2``, AMD
``v_cvt_pk_fp8_f32`` / ``v_cvt_pk_bf8_f32``), so the clamp also makes the result independent of each
target's out-of-range policy. Non-finite inputs: the amax ignores NaN and a NaN element becomes a NaN code
(all four formats have one); an inf makes its group's amax inf and scale 0, so the inf's own code is NaN
(inf * 0) and the group's other codes 0, as in torchao.

No backward: the quantize ops feed FP8 GEMMs whose autograd is defined at the linear (ops/linear_fp8.py).

Modes of :func:`_quantize_tile_kernel` (one program per BLOCK_M x BLOCK_N tile of x):

    TILE_SCALE  one scale per tile            block128x128 (BLOCK_M = BLOCK_N = 128)
    ROW_SCALE   one scale per row of a tile   block1xG (BLOCK_N = G: 128 DeepSeek-V3, 32 MXFP8); rowwise
                                              when the row fits one block
    AMAX_ONLY   atomic max of |x| into one fp32 word: tensorwise phase 1
    GLOBAL      scale from that word           tensorwise phase 2

Tensorwise needs the whole tensor's amax before any element is quantized: two launches (x read twice, the
second read mostly from L2 on small tensors), the amax kept on the device (no host sync). The atomic max
is order-independent, so the result is deterministic. Rows wider than one block (rowwise) use
:func:`_quantize_wide_rows_kernel`, two passes over the row.

Traffic per element: read 2 B (bf16) or 4 B (fp32), write 1 B, plus 4 B per group of scales. Memory bound
(well under one FLOP per byte).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from wavefront import runtime
from wavefront.kernels._heuristics import next_pow2
from wavefront.kernels._launch import launch
from wavefront.kernels._tables import Differs, FamilyTable, SingleStage
from wavefront.runtime import Arch

TILE_SCALE, ROW_SCALE, AMAX_ONLY, GLOBAL = 0, 1, 2, 3
EPS = 1e-12


@dataclass(frozen=True)
class QuantizeTable:
    # Elements per program: 8192 fp32 values = 32 KiB of registers per program with 8 warps (NVIDIA) or 4
    # wavefronts (AMD): 32 values per lane, loads 16 B wide, no spill.
    tile_elems: int
    # Widest row quantized from one block (rowwise); wider rows loop twice over BLOCK_N chunks.
    max_row_block: int
    max_warps: int


QUANTIZE_TABLES: FamilyTable[QuantizeTable] = FamilyTable(
    QuantizeTable(tile_elems=8192, max_row_block=8192, max_warps=8),
    "8 warps of 32 lanes (NVIDIA, RDNA wave32): 32 fp32 values per lane, loads 16 B wide, no spill",
    {
        "amd-cdna": Differs("wave64: 4 wavefronts give the 8192 values the same 32 per lane", max_warps=4),
        "cpu": Differs("the interpreter: the wave64 shape (no measurement chose it)", max_warps=4),
    },
)


@dataclass(frozen=True)
class QuantizeConfig(SingleStage):
    BLOCK_M: int
    BLOCK_N: int
    mode: int
    wide: bool  # rows looped in BLOCK_N chunks (rowwise, n_cols > max_row_block)
    num_warps: int


def quantize_config(scaling: str, n_rows: int, n_cols: int, arch: Arch) -> QuantizeConfig:
    """Pure function of (scaling, shape, architecture)."""
    table = QUANTIZE_TABLES[arch.family]
    wide = False
    if scaling == "block128x128":
        bm, bn, mode = 128, 128, TILE_SCALE
    elif scaling.startswith("block1x"):  # block1x128 (DeepSeek-V3), block1x32 (MXFP8)
        bn = int(scaling.removeprefix("block1x"))
        bm, mode = table.tile_elems // bn, ROW_SCALE
    elif scaling == "rowwise":
        bn = min(next_pow2(n_cols), table.max_row_block)
        wide = n_cols > bn
        bm, mode = max(1, table.tile_elems // bn), ROW_SCALE
    else:  # tensorwise: the tile shape only sets the amax partials' granularity
        bn = min(next_pow2(n_cols), 1024)
        bm, mode = max(1, table.tile_elems // bn), GLOBAL
    bm = min(bm, next_pow2(n_rows)) if scaling != "block128x128" else bm
    lanes = max(1, bm * bn // (16 * arch.warp_size))
    warps = runtime.clamp_num_warps(min(next_pow2(lanes), table.max_warps), arch)
    return QuantizeConfig(BLOCK_M=bm, BLOCK_N=bn, mode=mode, wide=wide, num_warps=warps)


@triton.jit
def _scale_from_amax(amax, FP8_MAX: tl.constexpr, EPS: tl.constexpr, POW2: tl.constexpr):
    scale = tl.div_rn(tl.zeros_like(amax) + FP8_MAX, tl.maximum(amax, EPS))
    if POW2:
        # Clearing the mantissa rounds a positive normal float down to a power of two, exactly.
        scale = (scale.to(tl.uint32, bitcast=True) & 0xFF800000).to(tl.float32, bitcast=True)
    return scale


@triton.jit
def _abs_ignoring_nan(x):
    # NaN -> 0: GPUs' max instructions drop a NaN operand while numpy (the interpreter) propagates it; the
    # amax ignores NaN on both.
    return tl.where(x == x, tl.abs(x), 0.0)


@triton.jit
def _to_fp8(x, scale, q_ty, FP8_MAX: tl.constexpr):
    # propagate_nan: a NaN stays NaN (min/max instructions would turn it into a bound).
    return tl.clamp(x * scale, -FP8_MAX, FP8_MAX, propagate_nan=tl.PropagateNan.ALL).to(q_ty)


@triton.jit
def _quantize_tile_kernel(x_ptr, q_ptr, scale_ptr, amax_ptr, M, N, stride_xm, stride_xn, stride_qm,
                          stride_sm, stride_sn, MODE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                          FP8_MAX: tl.constexpr, EPS: tl.constexpr, POW2: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rows = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    # Masked lanes read 0: they cannot raise an amax.
    x = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :] * stride_xn, mask=mask, other=0.0).to(tl.float32)
    if MODE == 2:
        tl.atomic_max(amax_ptr, tl.max(tl.max(_abs_ignoring_nan(x), axis=1), axis=0))
    else:
        if MODE == 0:
            scale = _scale_from_amax(tl.max(tl.max(_abs_ignoring_nan(x), axis=1), axis=0), FP8_MAX, EPS, POW2)
            if (pid_m < tl.cdiv(M, BLOCK_M)) & (pid_n < tl.cdiv(N, BLOCK_N)):
                tl.store(scale_ptr + pid_m * stride_sm + pid_n * stride_sn, scale)
            q = _to_fp8(x, scale, q_ptr.dtype.element_ty, FP8_MAX)
        elif MODE == 1:
            scale = _scale_from_amax(tl.max(_abs_ignoring_nan(x), axis=1), FP8_MAX, EPS, POW2)
            tl.store(scale_ptr + rows * stride_sm + pid_n * stride_sn, scale, mask=rows < M)
            q = _to_fp8(x, scale[:, None], q_ptr.dtype.element_ty, FP8_MAX)
        else:
            scale = _scale_from_amax(tl.load(amax_ptr), FP8_MAX, EPS, POW2)
            if (pid_m == 0) & (pid_n == 0):
                tl.store(scale_ptr, scale)
            q = _to_fp8(x, scale, q_ptr.dtype.element_ty, FP8_MAX)
        tl.store(q_ptr + rows[:, None] * stride_qm + cols[None, :], q, mask=mask)


@triton.jit
def _quantize_wide_rows_kernel(x_ptr, q_ptr, scale_ptr, M, N, stride_xm, stride_xn, stride_qm, stride_sm,
                               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, FP8_MAX: tl.constexpr,
                               EPS: tl.constexpr, POW2: tl.constexpr):
    """Rowwise scales for rows wider than one block: an amax pass, then a quantize pass over the row."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < M
    amax = tl.zeros((BLOCK_M,), tl.float32)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = row_ok[:, None] & (cols[None, :] < N)
        x = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :] * stride_xn, mask=mask, other=0.0)
        amax = tl.maximum(amax, tl.max(_abs_ignoring_nan(x.to(tl.float32)), axis=1))
    scale = _scale_from_amax(amax, FP8_MAX, EPS, POW2)
    tl.store(scale_ptr + rows * stride_sm, scale, mask=row_ok)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = row_ok[:, None] & (cols[None, :] < N)
        x = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :] * stride_xn, mask=mask, other=0.0)
        q = _to_fp8(x.to(tl.float32), scale[:, None], q_ptr.dtype.element_ty, FP8_MAX)
        tl.store(q_ptr + rows[:, None] * stride_qm + cols[None, :], q, mask=mask)


def scale_shape(scaling: str, n_rows: int, n_cols: int) -> tuple[int, ...]:
    """The scales of a [n_rows, n_cols] input: () tensorwise, [n_rows, 1] rowwise, [n_rows, cdiv(n_cols, G)]
    block1xG, [cdiv(n_rows, 128), cdiv(n_cols, 128)] block128x128."""
    if scaling == "tensorwise":
        return ()
    if scaling == "rowwise":
        return (n_rows, 1)
    if scaling.startswith("block1x"):
        return (n_rows, triton.cdiv(n_cols, int(scaling.removeprefix("block1x"))))
    return (triton.cdiv(n_rows, 128), triton.cdiv(n_cols, 128))


def quantize(x: torch.Tensor, fp8_dtype: torch.dtype, scaling: str, pow2_scale: bool,
             arch: Arch | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [n_rows, n_cols] (any strides) -> (q [n_rows, n_cols] contiguous fp8, fp32 scales of scale_shape)."""
    n_rows, n_cols = x.shape
    q = torch.empty((n_rows, n_cols), dtype=fp8_dtype, device=x.device)
    scale = torch.empty(scale_shape(scaling, n_rows, n_cols), dtype=torch.float32, device=x.device)
    cfg = quantize_config(scaling, n_rows, n_cols, arch or runtime.arch(x.device))
    fp8_max = float(torch.finfo(fp8_dtype).max)
    consts = dict(FP8_MAX=fp8_max, EPS=EPS, POW2=bool(pow2_scale), BLOCK_M=cfg.BLOCK_M, BLOCK_N=cfg.BLOCK_N)
    s2 = scale.view(-1, 1) if scale.dim() == 0 else scale
    if cfg.wide:
        launch(_quantize_wide_rows_kernel, (triton.cdiv(n_rows, cfg.BLOCK_M),), x_ptr=x, q_ptr=q, scale_ptr=scale,
               M=n_rows, N=n_cols, stride_xm=x.stride(0), stride_xn=x.stride(1), stride_qm=q.stride(0),
               stride_sm=s2.stride(0), constexprs=consts, options=cfg.options())
        return q, scale
    grid = (triton.cdiv(n_rows, cfg.BLOCK_M), triton.cdiv(n_cols, cfg.BLOCK_N))
    amax = torch.zeros((1,), dtype=torch.float32, device=x.device) if cfg.mode == GLOBAL else scale
    args = dict(x_ptr=x, q_ptr=q, scale_ptr=scale, amax_ptr=amax, M=n_rows, N=n_cols, stride_xm=x.stride(0),
                stride_xn=x.stride(1), stride_qm=q.stride(0), stride_sm=s2.stride(0), stride_sn=s2.stride(1))
    if cfg.mode == GLOBAL:
        launch(_quantize_tile_kernel, grid, **args, constexprs=dict(consts, MODE=AMAX_ONLY), options=cfg.options())
    launch(_quantize_tile_kernel, grid, **args, constexprs=dict(consts, MODE=cfg.mode), options=cfg.options())
    return q, scale
