"""Scaled FP8 GEMM: C = dequant(A) dequant(B)^T (+ bias + residual), fp32 accumulation, one kernel for every
recipe. The bias and the residual are added to the fp32 accumulator before the one rounding to C's dtype.

Operands arrive quantized (kernels/quantize.py) along the reduction dim, contiguous, K innermost:
A [M, K] and B [N, K] in an fp8 format, with fp32 scales s (x ~ q / s). Two ways to apply the scales:

    epilogue (tensorwise, rowwise):  C[m, n] = (sum_k qa[m, k] qb[n, k]) / (sa[m] sb[n])
                                     tensorwise passes the one scale with stride 0, so sa[m] = sa
    in the K loop (block scales):    C[m, n] = sum_kb (sum_{k in kb} qa[m, k] qb[n, k]) / (sa[m, kb] sb[n // R, kb])
                                     BLOCK_K = the scale group (128 for DeepSeek-V3's 1x128 / 128x128,
                                     32 for MXFP8); R = B_GROUP_ROWS rows of B share a scale (128 for the
                                     128x128 weight blocks, 1 for 1xG tiles); BLOCK_N divides R

The per-block partial product is scaled and added to the fp32 accumulator once per K block, which is also
the "promotion" DeepSeek-V3 describes: Hopper's FP8 wgmma accumulates in about 14 bits of mantissa, so a
long K loop accumulated inside the MMA loses precision. The epilogue form asks Triton for the same
promotion with ``max_num_imprecise_acc=BLOCK_K`` (on sm_90 Triton otherwise lets the MMA accumulate the
whole K loop: its default is 2^30); other targets accumulate in fp32 and ignore it.

Native MX on sm_100 (``_mx_gemm_kernel``): B200's tcgen05 MMA takes E8M0 block scales itself
(``tcgen05.mma ... kind::mxf8f6f4.block_scale``, SASS ``UTCQMMA`` with scale operands in tensor memory), so
the MXFP8 products (1x32 groups, power-of-two scales on both operands) go to ``tl.dot_scaled`` there: the
scales are applied inside the MMA, BLOCK_K spans several groups, and the CUDA cores do no per-block
multiply-add. The kernel reads the same fp32 scales (s = 2^k, x ~ q / s) and converts each to the E8M0 byte
of its dequantization factor 2^-k, which is 127 - k = 254 - (the biased exponent field of s): exact, no
extra pass. Other targets (sm_90 has no MX MMA; gfx942 none either) keep the per-block kernel.

On sm_90 / sm_100, the TMA kernels run every recipe on the bf16 GEMM's persistent, warp-specialized
structure (kernels/linear_tma.py, whose descriptor and tile-load helpers they call), one kernel per scale form
above over one body (``_fp8_gemm_tma``, SCALES "epilogue", "block", "mx"): ``_fp8_gemm_tma_kernel``
(tensorwise, rowwise), ``_fp8_block_gemm_tma_kernel`` and ``_mx_gemm_tma_kernel``: A and B tiles by TMA into
the producer's ring, the scales by pointer in the consumers through the same helpers as the cp.async kernels,
so the sums and their order are the same. Opt-in (``WAVEFRONT_FP8_TMA=1`` or ``tma=True``) until a GPU run
proves it; it needs both operands addressable by a descriptor (unit stride along K, 16-byte aligned base and
rows), else the cp.async kernels run (also the path on sm_80 and AMD, which have no TMA). docs/fp8.md has
their machine code.

Backward products use these kernels unchanged with other operands (ops/linear_fp8.py quantizes them along
their reduction dims): dX = dY W: A = dY [M, N], B = W^T [K, N]; dW = dY^T X: A = dY^T [N, M], B = X^T [K, M].

FLOPs 2 M N K. Bytes (minimum): M K + N K (fp8) + the scales + M N x out itemsize (+ N bias). At
M = 8192, N = K = 4096 about 3300 FLOP/B: compute bound, tiles sized for the matrix units (wgmma with fp8
operands needs both K-major, which this layout is; MFMA fp8 on gfx942 takes the FNUZ formats).
Rows of A and B past M and N are masked on load (0, which adds nothing) and at the store. Row offsets are
int64 before they multiply a stride.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from wavefront import runtime
from wavefront.kernels._launch import ensure_descriptor_allocator, launch
from wavefront.kernels._program_order import grouped_tile
from wavefront.kernels._tables import Differs, FamilyTable
from wavefront.kernels.linear_tma import _load_k_cols, _load_rows_k, _operand_desc
from wavefront.kernels.matmul_config import TMA_FAMILIES, matrix_launch_options, tma_capable
from wavefront.runtime import Arch


@dataclass(frozen=True)
class Fp8GemmConfig:
    BLOCK_M: int
    BLOCK_N: int
    BLOCK_K: int
    GROUP_M: int
    num_warps: int
    num_stages: int
    reason: str
    # AMD launch options at the compiler's defaults (no FP8 entry sets them): emitted for AMD targets only.
    waves_per_eu: int = 0
    matrix_instr_nonkdim: int = 0
    kpack: int = 1

    def options(self, arch: Arch) -> dict:
        return matrix_launch_options(self, arch)


# One table over the families: the epilogue-scaled tile; block-scaled GEMMs keep BLOCK_M/BLOCK_N and set
# BLOCK_K to the scale group (and BLOCK_N <= 128 so a weight block covers the whole tile).
_FP8_NVIDIA = Fp8GemmConfig(128, 128, 128, 8, 8, 3, "two warpgroups of m64n128k32 fp8 wgmma; 3 stages of "
                                                    "(128 + 128) x 128 B = 96 KiB smem, under sm_90's 227 KiB")
FP8_GEMM_TABLES: FamilyTable[Fp8GemmConfig] = FamilyTable(_FP8_NVIDIA, _FP8_NVIDIA.reason, {
    "amd-cdna": Differs("gfx942 MFMA fp8 32x32x16; 2 LDS stages of 32 KiB fit 64 KiB", num_stages=2),
    "amd-rdna": Differs("no fp8 matrix unit on RDNA3: small tiles, converted dot", BLOCK_M=64, BLOCK_N=64,
                        num_warps=4, num_stages=2),
    "cpu": Differs("interpreter: its cost is per program and per op, not per element", BLOCK_M=64, BLOCK_N=64,
                   GROUP_M=1, num_warps=4, num_stages=1),
})


#: Targets whose matrix units apply MX (E8M0, 1x32) block scales natively, by ``Arch.name``: there the MXFP8
#: products run ``_mx_gemm_kernel`` (tl.dot_scaled). Everything else runs the per-block kernel.
MX_NATIVE_CONFIGS: dict[str, Fp8GemmConfig] = {
    "sm_100": Fp8GemmConfig(128, 128, 128, 8, 8, 3, "tcgen05.mma kind::mxf8f6f4.block_scale (UTCQMMA): scales "
                                                    "applied by the MMA, 4 E8M0 groups per 128-wide K step; 3 "
                                                    "stages of (128 + 128) x 128 B = 96 KiB smem; 8 warps: the "
                                                    "128x128 fp32 accumulator leaves tensor memory at 64 registers "
                                                    "a thread (4 warps: 128, and the residual epilogue spilled "
                                                    "368 B)"),
}


def mx_native(arch: Arch, group_k: int, b_group_rows: int, a_dtype: torch.dtype, b_dtype: torch.dtype) -> bool:
    """True when a block-scaled product runs on the matrix unit's own MX scaling: the target has it, both
    operands are 1x32 groups (MXFP8's; their scales are powers of two by the recipe) and OCP formats."""
    ocp = (torch.float8_e4m3fn, torch.float8_e5m2)
    return (arch.name in MX_NATIVE_CONFIGS and group_k == 32 and b_group_rows == 1 and a_dtype in ocp
            and b_dtype in ocp)


def fp8_gemm_config(M: int, N: int, K: int, group_k: int, b_group_rows: int, arch: Arch,
                    native_mx: bool = False) -> Fp8GemmConfig:
    """Pure function of (shape, scale group along K: 0 for epilogue scaling, rows of B sharing a scale,
    architecture, whether the MX scales go to the matrix unit: see :func:`mx_native`)."""
    if native_mx:
        cfg = MX_NATIVE_CONFIGS[arch.name]
        if K % 16:
            # Rows not 16-byte aligned (K is the operands' row stride): no 128-bit async copies, the tiles are
            # staged through registers; at BLOCK_K = 128 ptxas spilled 16-2072 B (K = 1000), at 64 none.
            cfg = dataclasses.replace(cfg, BLOCK_K=min(cfg.BLOCK_K, 64),
                                      reason=cfg.reason + "; K % 16 != 0: BLOCK_K 64 (no spills with unaligned rows)")
        return cfg
    base = FP8_GEMM_TABLES[arch.family]
    block_k = group_k or base.BLOCK_K
    block_n = min(base.BLOCK_N, 128)  # a 128x128 weight block must cover the tile's columns
    reason = base.reason
    if group_k and b_group_rows == 1 and arch.family != "cpu":
        # Per-column scales (the dW product's 1xG x^T tiles): a second BLOCK_N-wide fp32 vector and the
        # scaled partial product live across the loop; at 128 columns ptxas spilled 80 B (sm_90) and the
        # AMD compiler 36 B (gfx942) at M, N, K = 8192, 4096, 14336. 64 columns: none.
        block_n, reason = 64, "per-column block scales: 64 columns keep the loop in registers"
    return Fp8GemmConfig(base.BLOCK_M, block_n, block_k, base.GROUP_M, base.num_warps, base.num_stages, reason)


#: The persistent, warp-specialized TMA kernels (``_fp8_gemm_tma_kernel`` and its block and MX forms) on sm_90 /
#: sm_100, over matmul_config.TMA_FAMILIES (NVIDIA's generations and the interpreter). Opt-in (see
#: :func:`tma_requested`).
_FP8_TMA_HOPPER = Fp8GemmConfig(128, 128, 128, 8, 4, 4, "num_warps 4: Triton 3.9's Hopper warp specializer makes "
                                                        "one TMA producer and two consumer warpgroups of m64n128k32 "
                                                        "fp8 wgmma; 4 stages of (128 + 128) x 128 B = 128 KiB smem")
FP8_TMA_CONFIGS: FamilyTable[Fp8GemmConfig] = FamilyTable(_FP8_TMA_HOPPER, _FP8_TMA_HOPPER.reason, {
    "blackwell": Differs("tcgen05 with the accumulator in tensor memory; 8 warps so its load in the epilogue spreads "
                         "over 256 threads (4 warps: 255 registers, 264 B of spills rowwise, 184 B MX); 4 stages of "
                         "32 KiB", num_warps=8),
    "cpu": Differs("interpreter: several tiles per test matrix, and several tiles per program of the persistent "
                   "grid", BLOCK_M=32, BLOCK_N=32, GROUP_M=2, num_stages=1),
}, families=TMA_FAMILIES)

#: ``WAVEFRONT_FP8_TMA=1`` sends the FP8 GEMMs on sm_90 / sm_100 to the TMA kernels (every recipe, the auto
#: provider included). Off by default until a GPU run proves it (``scripts/gpu_check.sh``).
TMA_ENV_FLAG = "WAVEFRONT_FP8_TMA"


def tma_requested() -> bool:
    """Whether the environment asks for the FP8 TMA kernel (``WAVEFRONT_FP8_TMA=1``)."""
    return os.environ.get(TMA_ENV_FLAG, "0").strip().lower() in ("1", "true", "yes", "on")


def tma_operands(qa: torch.Tensor, qb: torch.Tensor) -> bool:
    """Whether both FP8 operands qualify for a tensor descriptor: unit stride along K, 16-byte aligned base
    and rows (K % 16 == 0 for contiguous operands)."""
    return _tma_rows(qa) and _tma_rows(qb)


def _tma_rows(t: torch.Tensor) -> bool:
    """A 2-D tensor whose rows a tensor descriptor can address: unit last stride, 16-byte aligned base and rows."""
    return (t.dim() == 2 and t.stride(1) == 1 and t.data_ptr() % 16 == 0
            and (t.stride(0) * t.element_size()) % 16 == 0)


def fp8_tma_config(arch: Arch, group_k: int, native_mx: bool) -> Fp8GemmConfig | None:
    """The TMA kernel's tile, or None where it does not run (no TMA: sm_80, AMD). BLOCK_K is the scale
    group for block scales applied by the CUDA cores (128, or 32 for MXFP8 on sm_90), the table's with
    sm_100's native MX (4 E8M0 groups per step)."""
    if not tma_capable(arch):
        return None
    family = arch.family if arch.family == "cpu" else ("blackwell" if arch.name.startswith("sm_1") else "hopper")
    cfg = FP8_TMA_CONFIGS[family]
    if group_k and not native_mx and group_k != cfg.BLOCK_K:
        cfg = dataclasses.replace(cfg, BLOCK_K=group_k, reason=cfg.reason + f"; BLOCK_K = the scale group, {group_k}")
    return cfg


@dataclass(frozen=True)
class Fp8Provider:
    provider: str  # "wavefront" | "vendor"
    reason: str


def fp8_gemm_provider(scaling: str, arch: Arch, out_dtype: torch.dtype, M: int, N: int, K: int) -> Fp8Provider:
    """Who runs one scaled product: torch._scaled_mm (cuBLASLt / hipBLASLt) where it computes the same
    thing, else our kernel. The rule: the vendor library has the better-tuned FP8 GEMM and takes the
    same scales (tensorwise scalars, rowwise vectors on sm_89+ with a bf16 output), and the epilogue
    form fuses nothing the vendor's bias epilogue does not; block scales inside the K loop (DeepSeek-V3,
    MXFP8 without sm_100's native scaled MMA) are ours. Not yet measured on a GPU: the rule is from what
    each library supports, to be confirmed by ``wavefront bench`` on a device."""
    aligned = M % 16 == 0 and N % 16 == 0 and K % 16 == 0
    if tma_requested() and arch.family == "nvidia" and tma_capable(arch):
        return Fp8Provider("wavefront", f"{TMA_ENV_FLAG}=1: the persistent warp-specialized TMA kernel")
    if arch.family == "nvidia" and int(arch.name.removeprefix("sm_")) >= 89 and aligned:
        if scaling == "tensorwise":
            return Fp8Provider("vendor", "cuBLASLt FP8 with per-tensor scales")
        if scaling == "rowwise" and out_dtype == torch.bfloat16:
            return Fp8Provider("vendor", "torch._scaled_mm rowwise (CUTLASS, sm_89+), bf16 output")
    if arch.name in ("gfx942", "gfx950") and aligned and scaling == "tensorwise":
        return Fp8Provider("vendor", "hipBLASLt FP8 with per-tensor scales")
    return Fp8Provider("wavefront", "block or rowwise scales the vendor path does not take here")


@triton.jit
def _tile(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """Both FP8 GEMMs' output tile: this program's rows of A and C, its columns of C (rows of B), in grouped
    order, int64 before they multiply a stride, and their bounds masks."""
    pid_m, pid_n = grouped_tile(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    rows = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    return rows, cols, rows < M, cols < N


@triton.jit
def _epilogue(acc, rows, cols, row_ok, col_ok, bias_ptr, r_ptr, c_ptr, stride_rm, stride_cm,
              HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr):
    """Both FP8 GEMMs' fp32 epilogue: + bias, + residual, rounded to the output's dtype and stored."""
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    if HAS_RESIDUAL:
        acc += tl.load(r_ptr + rows[:, None] * stride_rm + cols[None, :], mask=row_ok[:, None] & col_ok[None, :],
                       other=0.0).to(tl.float32)
    tl.store(c_ptr + rows[:, None] * stride_cm + cols[None, :], acc.to(c_ptr.dtype.element_ty),
             mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def _block_scaled_step(acc, a, b, sa_ptr, sb_ptr, rows, cols, row_ok, col_ok, kb, stride_sam, stride_sak, stride_sbn,
                       stride_sbk, B_GROUP_ROWS: tl.constexpr):
    """acc + (a b) / (sa[rows, kb] sb[cols // B_GROUP_ROWS, kb]): one K block of a block-scaled product (a
    [BLOCK_M, BLOCK_K], b [BLOCK_K, BLOCK_N]); the partial product is promoted to the fp32 accumulator here."""
    part = tl.dot(a, b)
    sa = tl.load(sa_ptr + rows * stride_sam + kb * stride_sak, mask=row_ok, other=1.0)
    sb = tl.load(sb_ptr + (cols // B_GROUP_ROWS) * stride_sbn + kb * stride_sbk, mask=col_ok, other=1.0)
    return acc + part * (tl.div_rn(tl.full((a.shape[0],), 1.0, tl.float32), sa)[:, None]
                         * tl.div_rn(tl.full((b.shape[1],), 1.0, tl.float32), sb)[None, :])


@triton.jit
def _epilogue_scaled(acc, sa_ptr, sb_ptr, rows, cols, row_ok, col_ok, stride_sam, stride_sbn):
    """acc / (sa[rows] sb[cols]): the tensorwise (stride 0) and rowwise scales applied once, in the epilogue."""
    sa = tl.load(sa_ptr + rows * stride_sam, mask=row_ok, other=1.0)
    sb = tl.load(sb_ptr + cols * stride_sbn, mask=col_ok, other=1.0)
    return acc / (sa[:, None] * sb[None, :])


@triton.jit
def _fp8_gemm_kernel(a_ptr, b_ptr, sa_ptr, sb_ptr, bias_ptr, r_ptr, c_ptr, M, N, K, stride_am, stride_bn, stride_rm,
                     stride_cm, stride_sam, stride_sak, stride_sbn, stride_sbk, BLOCKWISE: tl.constexpr,
                     B_GROUP_ROWS: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    rows, cols, row_ok, col_ok = _tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rows[:, None] * stride_am + offs_k[None, :]
    b_ptrs = b_ptr + cols[:, None] * stride_bn + offs_k[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for kb in range(0, tl.cdiv(K, BLOCK_K)):
        k_ok = offs_k[None, :] < K - kb * BLOCK_K
        a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok, other=0.0)
        b = tl.load(b_ptrs, mask=col_ok[:, None] & k_ok, other=0.0)
        if BLOCKWISE:
            acc = _block_scaled_step(acc, a, tl.trans(b), sa_ptr, sb_ptr, rows, cols, row_ok, col_ok, kb, stride_sam,
                                     stride_sak, stride_sbn, stride_sbk, B_GROUP_ROWS)
        else:
            acc = tl.dot(a, tl.trans(b), acc, max_num_imprecise_acc=BLOCK_K)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    if not BLOCKWISE:
        acc = _epilogue_scaled(acc, sa_ptr, sb_ptr, rows, cols, row_ok, col_ok, stride_sam, stride_sbn)
    _epilogue(acc, rows, cols, row_ok, col_ok, bias_ptr, r_ptr, c_ptr, stride_rm, stride_cm, HAS_BIAS, HAS_RESIDUAL)


@triton.jit
def _e8m0_of_inverse(s):
    """E8M0 byte of 1/s for a power-of-two fp32 scale s = 2^k (127 - k); 1.0 (masked groups) gives 127."""
    return (254 - ((s.to(tl.int32, bitcast=True) >> 23) & 0xFF)).to(tl.uint8)


@triton.jit
def _mx_step(acc, a, b, sa_ptrs, sb_ptrs, sa_ok, sb_ok, A_FORMAT: tl.constexpr, B_FORMAT: tl.constexpr):
    """acc + a b with MX block scales applied by the matrix unit (tl.dot_scaled): a [BLOCK_M, BLOCK_K], b
    [BLOCK_K, BLOCK_N]; sa_ptrs / sb_ptrs [rows, BLOCK_K / 32] fp32 power-of-two scales, read as E8M0 bytes."""
    sa = _e8m0_of_inverse(tl.load(sa_ptrs, mask=sa_ok, other=1.0))
    sb = _e8m0_of_inverse(tl.load(sb_ptrs, mask=sb_ok, other=1.0))
    return tl.dot_scaled(a, sa, A_FORMAT, b, sb, B_FORMAT, acc)


@triton.jit
def _mx_gemm_kernel(a_ptr, b_ptr, sa_ptr, sb_ptr, bias_ptr, r_ptr, c_ptr, M, N, K, stride_am, stride_bn, stride_rm,
                    stride_cm, stride_sam, stride_sak, stride_sbn, stride_sbk, A_FORMAT: tl.constexpr,
                    B_FORMAT: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    # MXFP8 on the matrix unit's own block scaling: sa [M, cdiv(K, 32)], sb [N, cdiv(K, 32)] fp32 powers of
    # two, converted to E8M0 bytes per K step; tl.dot_scaled's rhs is [K, N] with its scales [N, K / 32].
    rows, cols, row_ok, col_ok = _tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_k = tl.arange(0, BLOCK_K)
    offs_g = tl.arange(0, BLOCK_K // 32)
    groups = tl.cdiv(K, 32)
    a_ptrs = a_ptr + rows[:, None] * stride_am + offs_k[None, :]
    b_ptrs = b_ptr + cols[:, None] * stride_bn + offs_k[None, :]
    sa_ptrs = sa_ptr + rows[:, None] * stride_sam + offs_g[None, :] * stride_sak
    sb_ptrs = sb_ptr + cols[:, None] * stride_sbn + offs_g[None, :] * stride_sbk
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for kb in range(0, tl.cdiv(K, BLOCK_K)):
        k_ok = offs_k[None, :] < K - kb * BLOCK_K
        g_ok = offs_g[None, :] < groups - kb * (BLOCK_K // 32)
        a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok, other=0.0)
        b = tl.load(b_ptrs, mask=col_ok[:, None] & k_ok, other=0.0)
        acc = _mx_step(acc, a, tl.trans(b), sa_ptrs, sb_ptrs, row_ok[:, None] & g_ok, col_ok[:, None] & g_ok,
                       A_FORMAT, B_FORMAT)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
        sa_ptrs += (BLOCK_K // 32) * stride_sak
        sb_ptrs += (BLOCK_K // 32) * stride_sbk
    _epilogue(acc, rows, cols, row_ok, col_ok, bias_ptr, r_ptr, c_ptr, stride_rm, stride_cm, HAS_BIAS, HAS_RESIDUAL)


@triton.jit
def _fp8_gemm_tma(a_ptr, b_ptr, sa_ptr, sb_ptr, bias_ptr, r_ptr, c_ptr, M, N, K, stride_am, stride_bn, stride_rm,
                  stride_cm, stride_sam, stride_sak, stride_sbn, stride_sbk, SCALES: tl.constexpr,
                  B_GROUP_ROWS: tl.constexpr, A_FORMAT: tl.constexpr, B_FORMAT: tl.constexpr, HAS_BIAS: tl.constexpr,
                  HAS_RESIDUAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  GROUP_M: tl.constexpr, NUM_PROGRAMS: tl.constexpr, WARP_SPECIALIZE: tl.constexpr):
    # Every recipe on the bf16 GEMM's persistent, warp-specialized TMA structure (kernels/linear_tma.py): A
    # and B tiles by tensor descriptor into the producer's ring, the scales by pointer in the consumers.
    # SCALES: "epilogue" (tensorwise, rowwise), "block" (1x128 / 128x128, per K block), "mx" (tl.dot_scaled);
    # one kernel per recipe family calls this body with its SCALES.
    a_desc = _operand_desc(a_ptr, M, K, stride_am, BLOCK_M, BLOCK_K, False)
    b_desc = _operand_desc(b_ptr, N, K, stride_bn, BLOCK_N, BLOCK_K, False)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    offs_g = tl.arange(0, BLOCK_K // 32)
    for tile in tl.range(tl.program_id(0), num_pid_m * num_pid_n, NUM_PROGRAMS, flatten=False,
                         warp_specialize=WARP_SPECIALIZE):
        pid_m, pid_n = grouped_tile(tile, num_pid_m, num_pid_n, GROUP_M)
        rows = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = pid_n.to(tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
        row_ok = rows < M
        col_ok = cols < N
        acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        for kb in range(0, k_tiles):
            a = _load_rows_k(a_desc, pid_m * BLOCK_M, kb * BLOCK_K, False)
            b = _load_k_cols(b_desc, pid_n * BLOCK_N, kb * BLOCK_K, False)
            if SCALES == "block":
                acc = _block_scaled_step(acc, a, b, sa_ptr, sb_ptr, rows, cols, row_ok, col_ok, kb, stride_sam,
                                         stride_sak, stride_sbn, stride_sbk, B_GROUP_ROWS)
            elif SCALES == "mx":
                g = kb * (BLOCK_K // 32) + offs_g
                g_ok = g[None, :] < tl.cdiv(K, 32)
                acc = _mx_step(acc, a, b, sa_ptr + rows[:, None] * stride_sam + g[None, :] * stride_sak,
                               sb_ptr + cols[:, None] * stride_sbn + g[None, :] * stride_sbk, row_ok[:, None] & g_ok,
                               col_ok[:, None] & g_ok, A_FORMAT, B_FORMAT)
            else:
                acc = tl.dot(a, b, acc, max_num_imprecise_acc=BLOCK_K)
        if SCALES == "epilogue":
            acc = _epilogue_scaled(acc, sa_ptr, sb_ptr, rows, cols, row_ok, col_ok, stride_sam, stride_sbn)
        _epilogue(acc, rows, cols, row_ok, col_ok, bias_ptr, r_ptr, c_ptr, stride_rm, stride_cm, HAS_BIAS,
                  HAS_RESIDUAL)


@triton.jit
def _fp8_gemm_tma_kernel(a_ptr, b_ptr, sa_ptr, sb_ptr, bias_ptr, r_ptr, c_ptr, M, N, K, stride_am, stride_bn, stride_rm,
                         stride_cm, stride_sam, stride_sak, stride_sbn, stride_sbk, HAS_BIAS: tl.constexpr,
                         HAS_RESIDUAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, NUM_PROGRAMS: tl.constexpr,
                         WARP_SPECIALIZE: tl.constexpr):
    """Tensorwise and rowwise scales: the plain fp8 product, the scales applied once in the epilogue."""
    _fp8_gemm_tma(a_ptr, b_ptr, sa_ptr, sb_ptr, bias_ptr, r_ptr, c_ptr, M, N, K, stride_am, stride_bn, stride_rm,
                  stride_cm, stride_sam, stride_sak, stride_sbn, stride_sbk, "epilogue", 1, "", "", HAS_BIAS,
                  HAS_RESIDUAL, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, NUM_PROGRAMS, WARP_SPECIALIZE)


@triton.jit
def _fp8_block_gemm_tma_kernel(a_ptr, b_ptr, sa_ptr, sb_ptr, bias_ptr, r_ptr, c_ptr, M, N, K, stride_am, stride_bn,
                               stride_rm, stride_cm, stride_sam, stride_sak, stride_sbn, stride_sbk,
                               B_GROUP_ROWS: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
                               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                               GROUP_M: tl.constexpr, NUM_PROGRAMS: tl.constexpr, WARP_SPECIALIZE: tl.constexpr):
    """Block scales (1 x 128 activations, 128 x 128 or 1 x 128 weights): applied per K block."""
    _fp8_gemm_tma(a_ptr, b_ptr, sa_ptr, sb_ptr, bias_ptr, r_ptr, c_ptr, M, N, K, stride_am, stride_bn, stride_rm,
                  stride_cm, stride_sam, stride_sak, stride_sbn, stride_sbk, "block", B_GROUP_ROWS, "", "", HAS_BIAS,
                  HAS_RESIDUAL, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, NUM_PROGRAMS, WARP_SPECIALIZE)


@triton.jit
def _mx_gemm_tma_kernel(a_ptr, b_ptr, sa_ptr, sb_ptr, bias_ptr, r_ptr, c_ptr, M, N, K, stride_am, stride_bn, stride_rm,
                        stride_cm, stride_sam, stride_sak, stride_sbn, stride_sbk, A_FORMAT: tl.constexpr,
                        B_FORMAT: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                        NUM_PROGRAMS: tl.constexpr, WARP_SPECIALIZE: tl.constexpr):
    """MXFP8 on the matrix unit's own block scaling (tl.dot_scaled), as _mx_gemm_kernel."""
    _fp8_gemm_tma(a_ptr, b_ptr, sa_ptr, sb_ptr, bias_ptr, r_ptr, c_ptr, M, N, K, stride_am, stride_bn, stride_rm,
                  stride_cm, stride_sam, stride_sak, stride_sbn, stride_sbk, "mx", 1, A_FORMAT, B_FORMAT, HAS_BIAS,
                  HAS_RESIDUAL, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, NUM_PROGRAMS, WARP_SPECIALIZE)


#: The TMA kernels' names, one per scale form (inspect's opt-in variant lists them).
TMA_KERNELS: tuple[str, ...] = ("_fp8_gemm_tma_kernel", "_fp8_block_gemm_tma_kernel", "_mx_gemm_tma_kernel")

_MX_FORMATS = {torch.float8_e4m3fn: "e4m3", torch.float8_e5m2: "e5m2"}


def fp8_gemm(qa: torch.Tensor, qb: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor, bias: torch.Tensor | None,
             out_dtype: torch.dtype, group_k: int, b_group_rows: int, arch: Arch | None = None,
             residual: torch.Tensor | None = None, tma: bool | None = None) -> torch.Tensor:
    """C [M, N] = dequant(qa) dequant(qb)^T + bias + residual (residual [M, N], unit column stride).

    qa [M, K], qb [N, K]: fp8, unit stride along K. group_k 0: sa, sb are per-row vectors ([M, 1], [N, 1])
    or 0-dim tensorwise scales, applied in the epilogue; group_k > 0: sa [M, cdiv(K, group_k)], sb
    [cdiv(N, b_group_rows), cdiv(K, group_k)] applied per K block.

    tma: None: the TMA kernel when ``WAVEFRONT_FP8_TMA=1``, the target has TMA (sm_90+, or the interpreter)
    and both operands qualify for descriptors (:func:`tma_operands`), else the cp.async kernels; True: the
    TMA kernel or an error; False: the cp.async kernels.
    """
    M, K = qa.shape
    N = qb.shape[0]
    c = torch.empty((M, N), dtype=out_dtype, device=qa.device)
    arch = arch or runtime.arch(qa.device)
    native = mx_native(arch, group_k, b_group_rows, qa.dtype, qb.dtype)
    tma_cfg = None
    if tma if tma is not None else tma_requested():
        tma_cfg = fp8_tma_config(arch, group_k, native) if tma_operands(qa, qb) else None
        if tma_cfg is None and tma:
            raise ValueError(f"fp8_gemm: tma=True, but {arch.name} has no TMA or an operand does not qualify for a "
                             f"tensor descriptor (unit stride along K, 16-byte aligned base and rows; K={K})")
    cfg = tma_cfg or fp8_gemm_config(M, N, K, group_k, b_group_rows, arch, native)
    if group_k:
        stride_sam, stride_sak = sa.stride()
        stride_sbn, stride_sbk = sb.stride()
    else:
        stride_sam = 0 if sa.dim() == 0 else sa.stride(0)
        stride_sbn = 0 if sb.dim() == 0 else sb.stride(0)
        stride_sak = stride_sbk = 0
    grid = (triton.cdiv(M, cfg.BLOCK_M) * triton.cdiv(N, cfg.BLOCK_N),)
    common = dict(a_ptr=qa, b_ptr=qb, sa_ptr=sa, sb_ptr=sb, bias_ptr=bias, r_ptr=residual, c_ptr=c, M=M, N=N, K=K,
                  stride_am=qa.stride(0), stride_bn=qb.stride(0),
                  stride_rm=0 if residual is None else residual.stride(0), stride_cm=c.stride(0),
                  stride_sam=stride_sam, stride_sak=stride_sak, stride_sbn=stride_sbn, stride_sbk=stride_sbk)
    tiles = dict(HAS_BIAS=bias is not None, HAS_RESIDUAL=residual is not None, BLOCK_M=cfg.BLOCK_M,
                 BLOCK_N=cfg.BLOCK_N, BLOCK_K=cfg.BLOCK_K, GROUP_M=cfg.GROUP_M)
    if tma_cfg is not None:
        ensure_descriptor_allocator(qa.device)
        programs = min(grid[0], runtime.sm_count(qa.device))
        persistent = dict(NUM_PROGRAMS=programs, WARP_SPECIALIZE=True)
        recipe: dict[str, object]
        if native:
            kernel, recipe = _mx_gemm_tma_kernel, dict(A_FORMAT=_MX_FORMATS[qa.dtype], B_FORMAT=_MX_FORMATS[qb.dtype])
        elif group_k:
            kernel, recipe = _fp8_block_gemm_tma_kernel, dict(B_GROUP_ROWS=max(b_group_rows, 1))
        else:
            kernel, recipe = _fp8_gemm_tma_kernel, {}
        launch(kernel, (programs,), **common, constexprs=dict(recipe, **tiles, **persistent),
               options=cfg.options(arch))
        return c
    if native:
        launch(_mx_gemm_kernel, grid, **common,
               constexprs=dict(A_FORMAT=_MX_FORMATS[qa.dtype], B_FORMAT=_MX_FORMATS[qb.dtype], **tiles),
               options=cfg.options(arch))
        return c
    launch(_fp8_gemm_kernel, grid, **common,
           constexprs=dict(BLOCKWISE=bool(group_k), B_GROUP_ROWS=max(b_group_rows, 1), **tiles),
           options=cfg.options(arch))
    return c
