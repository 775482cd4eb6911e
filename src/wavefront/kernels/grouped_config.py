"""Launch configurations of the grouped-linear kernels (kernels/grouped_linear.py): data, and one pure
function that picks from it.

Products: "fwd" (x_g W_e^T), "fwd_swiglu" (the same with the gate and up halves sharing each x tile, so
BLOCK_N counts output columns and the accumulators hold 2 BLOCK_N columns), "dx" (dz_g W_e)
and "dw" (dz_g^T x_g, reducing over the group's tokens: BLOCK_M tiles N, BLOCK_N tiles K, BLOCK_K the
tokens). One table per family; the tile shapes start from the dense GEMM's verified entries
(kernels/matmul_config.py) and each reason quotes what the ahead-of-time compile showed for bf16 at that
entry with 128 experts (``tests/ops/test_grouped_linear.py`` re-checks matrix instructions, TMA and spills). No entry carries
a GPU timing: none was measured on this project's machines yet.

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
from wavefront.kernels.matmul_config import PRETRANSPOSE_FAMILIES, TileConfig, tma_capable
from wavefront.runtime import Arch

Product = Literal["fwd", "fwd_swiglu", "dx", "dw"]
PRODUCTS: tuple[str, ...] = ("fwd", "fwd_swiglu", "dx", "dw")

_T = TileConfig


def _every(cfg: TileConfig) -> dict[str, TileConfig]:
    return {p: cfg for p in PRODUCTS}


#: TMA kernels (sm_90 / sm_100): persistent, warp-specialized like kernels/linear_tma.py.
TMA_TABLES: dict[str, dict[str, TileConfig]] = {
    "hopper": {
        "fwd": _T(128, 256, 4, 3, "128x256x64, 3 stages, one producer and two consumer warpgroups (the dense "
                                  "GEMM's light TMA entry): sm_90 168 regs, 0 spill, 177 KiB, wgmma n256",
                  BLOCK_K=64, GROUP_M=8, warp_specialize=True),
        "fwd_swiglu": _T(128, 64, 4, 4, "128x64x64 per half, 4 stages: gate and up as one 128x128 accumulator "
                                        "(wgmma n128); 128x128 per half spills 64 B on sm_90 (the silu epilogue "
                                        "and the two masked z stores beside 128x256 of accumulators); this is 168 "
                                        "regs, 0 spill, 144 KiB", BLOCK_K=64, GROUP_M=8, warp_specialize=True),
        "dx": _T(128, 256, 4, 3, "128x256x64 as fwd: W^T is a transposed shared-memory view (no copy); 168 regs, "
                                 "0 spill", BLOCK_K=64, GROUP_M=8, warp_specialize=True),
        "dw": _T(128, 128, 4, 4, "128x128x64, 4 stages: dz^T is a transposed view of token-major dz; per-group "
                                 "descriptors; 168 regs, 0 spill, 144 KiB", BLOCK_K=64, GROUP_M=8,
                 warp_specialize=True),
    },
    "blackwell": {
        "fwd": _T(128, 128, 8, 4, "128x128x64, 4 stages, tcgen05, 8 warps: 128x256 spills 168 B on sm_100 loading "
                                  "the accumulator from tensor memory for the masked pointer store; this is 96 "
                                  "regs, 0 spill", BLOCK_K=64, GROUP_M=8, warp_specialize=True),
        "fwd_swiglu": _T(128, 64, 8, 4, "128x64x64 per half, 4 stages, 8 warps: gate and up as one 128x128 "
                                        "tensor-memory accumulator (two trip Triton 3.9's Blackwell partitioner: "
                                        "NVWSInsertTmemAref 'at most 2 partitions'); 96 regs, 0 spill, 132 KiB",
                         BLOCK_K=64, GROUP_M=8, warp_specialize=True),
        "dx": _T(128, 128, 8, 4, "128x128x64 as fwd; 96 regs, 0 spill", BLOCK_K=64, GROUP_M=8, warp_specialize=True),
        "dw": _T(128, 128, 8, 4, "128x128x64, 4 stages, 8 warps; 96 regs, 0 spill, 136 KiB", BLOCK_K=64, GROUP_M=8,
                 warp_specialize=True),
    },
}


#: Pointer kernels, one program per virtual tile.
POINTER_TABLES: dict[str, dict[str, TileConfig]] = {
    "nvidia": {
        **_every(_T(128, 128, 8, 3, "sm_80 (and unaligned operands): 128x128x32, 8 warps, mma.sync (the dense "
                                    "GEMM's heavy pointer entry): sm_80 172-176 regs, 0 spill, 32 KiB", BLOCK_K=32,
                    GROUP_M=8)),
        "fwd_swiglu": _T(128, 64, 8, 3, "two 128x64 accumulators: 128x128 in all, as the other products; sm_80 134 "
                                        "regs, 0 spill", BLOCK_K=32, GROUP_M=8),
    },
    "amd-cdna": {
        **_every(_T(128, 128, 8, 2, "128x128x32, 8 waves, mfma16, kpack 2, waves_per_eu 2 (the dense GEMM's heavy "
                                    "CDNA entry): gfx942 78-82 VGPRs, 0 spill, 8-16 KiB LDS, every LDS read a "
                                    "ds_read_b128 (dx and dW from the reduction-contiguous copies)", BLOCK_K=32,
                    GROUP_M=4, waves_per_eu=2, matrix_instr_nonkdim=16, kpack=2)),
        "fwd_swiglu": _T(128, 64, 8, 2, "two 128x64 accumulators: 128x128 in all; gfx942 80 VGPRs, 0 spill",
                         BLOCK_K=32, GROUP_M=4, waves_per_eu=2, matrix_instr_nonkdim=16, kpack=2),
    },
    "amd-rdna": {
        **_every(_T(128, 128, 8, 2, "128x128x32, 8 wave32s, WMMA 16x16x16: gfx1100 122-128 VGPRs, 0 spill",
                    BLOCK_K=32, GROUP_M=8)),
        "fwd_swiglu": _T(128, 64, 8, 2, "two 128x64 accumulators: gfx1100 190 VGPRs, 0 spill", BLOCK_K=32,
                         GROUP_M=8),
    },
    # The interpreter: small tiles so small test problems cross several tiles in every dim and groups
    # straddle tiles.
    "cpu": _every(_T(16, 32, 4, 1, "interpreter: several tiles per test group", BLOCK_K=16, GROUP_M=2)),
}

#: The interpreter runs the TMA kernels too (tests exercise them on CPU); the persistent grid then has
#: runtime.INTERPRETER_SM_COUNT programs, so each walks several tiles.
CPU_TMA = _every(_T(16, 32, 4, 1, "interpreter: several tiles per test group", BLOCK_K=16, GROUP_M=2,
                    warp_specialize=True))

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


def grouped_plan(product: Product, M: int, N: int, K: int, dtype: torch.dtype, arch: Arch, device,
                 tma_ok: bool) -> GroupedPlan:
    """The plan for `product` on `arch`; tma_ok: every operand qualifies for a tensor descriptor (the launcher
    checks strides and alignment). M, N, K: the product's sizes (only validated: no entry depends on them)."""
    if product not in PRODUCTS:
        raise ValueError(f"grouped_linear: product must be one of {PRODUCTS}, got {product!r}")
    if min(M, N, K) < 1:
        raise ValueError(f"grouped_linear: sizes must be >= 1, got M={M}, N={N}, K={K}")
    use_tma = tma_ok and tma_capable(arch)
    if use_tma:
        if arch.family == "cpu":
            cfg = CPU_TMA[product]
        else:
            cfg = TMA_TABLES["hopper" if _nvidia_cc(arch) < 100 else "blackwell"][product]
        programs = runtime.sm_count(device)
    else:
        cfg = POINTER_TABLES[arch.family][product]
        programs = 0
    if dtype.itemsize > 2 and arch.family != "cpu":
        cfg = replace(cfg, BLOCK_K=max(16, cfg.BLOCK_K // 2), reason=cfg.reason + "; fp32: BLOCK_K halved")
    # CDNA: without the copies gfx942 reads the MFMA operands by ds_read_u16 (compiled, bf16: dx 48, dW 96 per
    # kernel, as the dense GEMM's measurement in matmul_config.PRETRANSPOSE_FAMILIES); with them, none.
    return GroupedPlan(cfg, use_tma, programs, arch.family in PRETRANSPOSE_FAMILIES and product in ("dx", "dw"), arch)


def swiglu_bwd_config() -> TileConfig:
    return SWIGLU_BWD
