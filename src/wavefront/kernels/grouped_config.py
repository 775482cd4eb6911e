"""Launch configurations of the grouped-linear kernels (kernels/grouped_linear.py): data, and one pure
function that picks from it.

Products: "fwd" (x_g W_e^T), "fwd_swiglu" (the same with the gate and up halves sharing each x tile, so
BLOCK_N counts output columns and the accumulators hold 2 BLOCK_N columns), "dx" (dz_g W_e)
and "dw" (dz_g^T x_g, reducing over the group's tokens: BLOCK_M tiles N, BLOCK_N tiles K, BLOCK_K the
tokens). One table per product and kernel kind, a FamilyTable (kernels/_tables.py) whose rows differ from the
default only where a family measured otherwise; the tile shapes start from the dense GEMM's verified entries
(kernels/matmul_config.py) and each reason quotes what the ahead-of-time compile showed for bf16 at that
entry with 128 experts (``tests/ops/test_grouped_linear.py`` re-checks matrix instructions, TMA and spills).
No entry carries a GPU timing: none was measured on this project's machines yet.

Group sizes are data on the device, so unlike the dense GEMM no entry is chosen by M: a routed group averages
T top_k / E rows (Mixtral 8192 x 2 / 8 = 2048, Qwen3-30B-A3B 8192 x 8 / 128 = 512), and every group pays at
most one partial row tile, so 128-row tiles waste at most 127 / 512 = 25% at Qwen3's average group (half that
on average).

fp32 inputs (accepted for testing) halve BLOCK_K, keeping shared memory at the 16-bit footprint.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

import torch

from wavefront import runtime
from wavefront.kernels._tables import Differs, FamilyTable
from wavefront.kernels.matmul_config import PRETRANSPOSE_FAMILIES, TileConfig, tma_capable, tma_table
from wavefront.runtime import Arch

Product = Literal["fwd", "fwd_swiglu", "dx", "dw"]
PRODUCTS: tuple[str, ...] = ("fwd", "fwd_swiglu", "dx", "dw")

_T = TileConfig

#: TMA kernels (sm_90 / sm_100, and the interpreter): persistent, warp-specialized like kernels/linear_tma.py.
#: One table per product over matmul_config.TMA_FAMILIES: sm_90's entry the default, sm_100's where its compile
#: measured otherwise. dx takes the forward's table: W^T is a transposed shared-memory view (no copy), and the
#: forward's entries compile to the same registers and no spill for it (sm_90 168 regs, sm_100 96).

#: The interpreter runs the TMA kernels too (tests exercise them on CPU); the persistent grid then has
#: runtime.INTERPRETER_SM_COUNT programs, so each walks several tiles.
_CPU_TMA = Differs("interpreter: several tiles per test group",
                   row=_T(16, 32, 4, 1, "", BLOCK_K=16, GROUP_M=2, warp_specialize=True))

_TMA_FWD = tma_table(
    _T(128, 256, 4, 3, "128x256x64, 3 stages, one producer and two consumer warpgroups (the dense GEMM's light TMA "
                       "entry): sm_90 168 regs, 0 spill, 177 KiB, wgmma n256", BLOCK_K=64, GROUP_M=8,
       warp_specialize=True),
    Differs("128x128x64, 4 stages, tcgen05, 8 warps: 128x256 spills 168 B on sm_100 loading the accumulator from "
            "tensor memory for the masked pointer store; this is 96 regs, 0 spill", BLOCK_N=128, num_warps=8,
            num_stages=4),
    _CPU_TMA)

TMA_TABLES: dict[str, FamilyTable[TileConfig]] = {
    "fwd": _TMA_FWD,
    "fwd_swiglu": tma_table(
        _T(128, 64, 4, 4, "128x64x64 per half, 4 stages: gate and up as one 128x128 accumulator (wgmma n128); "
                          "128x128 per half spills 64 B on sm_90 (the silu epilogue and the two masked z stores "
                          "beside 128x256 of accumulators); this is 168 regs, 0 spill, 144 KiB", BLOCK_K=64,
           GROUP_M=8, warp_specialize=True),
        Differs("128x64x64 per half, 4 stages, 8 warps: gate and up as one 128x128 tensor-memory accumulator (two "
                "trip Triton 3.9's Blackwell partitioner: NVWSInsertTmemAref 'at most 2 partitions'); 96 regs, 0 "
                "spill, 132 KiB", num_warps=8),
        _CPU_TMA),
    "dx": _TMA_FWD,
    "dw": tma_table(
        _T(128, 128, 4, 4, "128x128x64, 4 stages: dz^T is a transposed view of token-major dz; per-group "
                           "descriptors; 168 regs, 0 spill, 144 KiB", BLOCK_K=64, GROUP_M=8, warp_specialize=True),
        Differs("128x128x64, 4 stages, 8 warps; 96 regs, 0 spill, 136 KiB", num_warps=8), _CPU_TMA),
}


#: Pointer kernels, one program per virtual tile: one entry per family for fwd, dx and dW (the dense GEMM's heavy
#: pointer entry), and for the SwiGLU forward the same with two 128x64 accumulators (128x128 in all).
_POINTER_NVIDIA = _T(128, 128, 8, 3, "sm_80 (and unaligned operands): 128x128x32, 8 warps, mma.sync (the dense GEMM's "
                                    "heavy pointer entry): sm_80 172-176 regs, 0 spill, 32 KiB", BLOCK_K=32, GROUP_M=8)
_POINTER = FamilyTable(
    _POINTER_NVIDIA, _POINTER_NVIDIA.reason,
    {
        "amd-cdna": Differs("128x128x32, 8 waves, mfma16, kpack 2, waves_per_eu 2 (the dense GEMM's heavy CDNA "
                            "entry): gfx942 78-82 VGPRs, 0 spill, 8-16 KiB LDS, every LDS read a ds_read_b128 (dx "
                            "and dW from the reduction-contiguous copies)", num_stages=2, GROUP_M=4, waves_per_eu=2,
                            matrix_instr_nonkdim=16, kpack=2),
        "amd-rdna": Differs("128x128x32, 8 wave32s, WMMA 16x16x16: gfx1100 122-128 VGPRs, 0 spill", num_stages=2),
        # The interpreter: small tiles so small test problems cross several tiles in every dim and groups
        # straddle tiles.
        "cpu": Differs("interpreter: several tiles per test group", BLOCK_M=16, BLOCK_N=32, num_warps=4,
                       num_stages=1, BLOCK_K=16, GROUP_M=2),
    },
)


def _half_n(family: str, reason: str) -> Differs:
    """The SwiGLU forward's entry: the family's tile with two 128x64 accumulators (128x128 in all)."""
    return Differs(reason, row=replace(_POINTER[family], BLOCK_N=64))


_SWIGLU_NVIDIA = replace(_POINTER_NVIDIA, BLOCK_N=64, reason="two 128x64 accumulators: 128x128 in all, as the "
                                                             "other products; sm_80 134 regs, 0 spill")
POINTER_TABLES: dict[str, FamilyTable[TileConfig]] = {
    "fwd": _POINTER,
    "fwd_swiglu": FamilyTable(
        _SWIGLU_NVIDIA, _SWIGLU_NVIDIA.reason,
        {"amd-cdna": _half_n("amd-cdna", "two 128x64 accumulators: 128x128 in all; gfx942 80 VGPRs, 0 spill"),
         "amd-rdna": _half_n("amd-rdna", "two 128x64 accumulators: gfx1100 190 VGPRs, 0 spill"),
         "cpu": Differs("interpreter: several tiles per test group", row=_POINTER["cpu"])},
    ),
    "dx": _POINTER,
    "dw": _POINTER,
}

#: The SwiGLU backward's elementwise pass: [T, N/2] in 32 x 128 tiles.
SWIGLU_BWD = _T(32, 128, 4, 1, "elementwise: 32 values of dy per thread, two dz halves written")


@dataclass(frozen=True)
class GroupedPlan:
    """How one product runs: its tile entry, TMA or pointers, persistent programs (0: one per tile), and whether
    operands with a strided reduction dim are first copied reduction-contiguous (pointer kernels on AMD CDNA)."""

    config: TileConfig
    use_tma: bool
    programs: int
    pretranspose: bool
    arch: Arch


def _nvidia_cc(arch: Arch) -> int:
    return int(arch.name.removeprefix("sm_").rstrip("af"))


def table_entry(product: Product, arch: Arch, use_tma: bool) -> TileConfig:
    """The table's tile for `product` on `arch`: the TMA table of its generation (sm_90 hopper, sm_100
    blackwell, the interpreter's own) or the pointer table of its family (before grouped_plan's fp32 rule)."""
    if use_tma:
        generation = "cpu" if arch.family == "cpu" else "hopper" if _nvidia_cc(arch) < 100 else "blackwell"
        return TMA_TABLES[product][generation]
    return POINTER_TABLES[product][arch.family]


def grouped_plan(product: Product, M: int, N: int, K: int, dtype: torch.dtype, arch: Arch, device,
                 tma_ok: bool) -> GroupedPlan:
    """The plan for `product` on `arch`; tma_ok: every operand qualifies for a tensor descriptor (the launcher
    checks strides and alignment). M, N, K: the product's sizes (only validated: no entry depends on them)."""
    if product not in PRODUCTS:
        raise ValueError(f"grouped_linear: product must be one of {PRODUCTS}, got {product!r}")
    if min(M, N, K) < 1:
        raise ValueError(f"grouped_linear: sizes must be >= 1, got M={M}, N={N}, K={K}")
    use_tma = tma_ok and tma_capable(arch)
    cfg = table_entry(product, arch, use_tma)
    programs = runtime.sm_count(device) if use_tma else 0
    if dtype.itemsize > 2 and arch.family != "cpu":
        cfg = replace(cfg, BLOCK_K=max(16, cfg.BLOCK_K // 2), reason=cfg.reason + "; fp32: BLOCK_K halved")
    # CDNA: without the copies gfx942 reads the MFMA operands by ds_read_u16 (compiled, bf16: dx 48, dW 96 per
    # kernel, as the dense GEMM's measurement in matmul_config.PRETRANSPOSE_FAMILIES); with them, none.
    return GroupedPlan(cfg, use_tma, programs, arch.family in PRETRANSPOSE_FAMILIES and product in ("dx", "dw"), arch)


def swiglu_bwd_config() -> TileConfig:
    return SWIGLU_BWD
