"""Launch configurations of the matrix-unit kernels (attention and the GEMM behind linear): data, and pure
functions that pick from it.

One table per architecture family (``nvidia``, ``amd-cdna``, ``amd-rdna``, and ``cpu`` for the
interpreter). Each entry is a tile shape, launch options, and the reason it is there. The reasons quote
what the ahead-of-time compiled kernel showed for bf16 at that entry (registers per thread, spills, shared
memory/LDS, matrix instruction; ``tests/ops/test_matrix_instructions.py`` re-checks them, and
docs/kernels-attention-gemm.md has the full table). No entry carries a GPU timing: none was measured on
this project's machines yet, so among spill-free shapes the choice follows the published practice named
in the reason (FlashAttention-2/Triton tutorial tiles on NVIDIA, AMD's Triton attention and GEMM tuning
guides on CDNA) and would be refined by timing the short candidate lists on a GPU.

16-bit inputs use the entries as listed. fp32 inputs (accepted for testing) double every operand tile,
so the picker halves the tiles that the dtype doubles (attention: BLOCK_M and BLOCK_N; GEMM: BLOCK_K),
keeping shared memory at the verified 16-bit footprint.

AMD-only launch options (``waves_per_eu``, ``matrix_instr_nonkdim``, ``kpack``) are emitted by
:meth:`TileConfig.options` only for AMD families: the NVIDIA compiler and the interpreter reject them.

MI300X (gfx942) has 8 XCDs, each with a private 4 MB L2, and the dispatcher hands workgroup ``p`` to XCD
``p % 8``. :data:`XCDS` feeds the program-order remap in ``kernels/_program_order.py`` so that programs
sharing a K/V head (attention) or an A row panel (GEMM) run on the same XCD.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from wavefront.runtime import Arch

#: Accelerator complex dies per device: the XCD remap is the identity elsewhere.
XCDS: dict[str, int] = {"gfx942": 8}


@dataclass(frozen=True)
class TileConfig:
    """One tuned entry. BLOCK_K is the GEMM reduction tile (0 for attention, which reduces over the
    whole head dim in one dot); GROUP_M the GEMM's grouped-ordering height (programs sharing a B panel)."""

    BLOCK_M: int
    BLOCK_N: int
    num_warps: int
    num_stages: int
    reason: str
    BLOCK_K: int = 0
    GROUP_M: int = 1
    waves_per_eu: int = 0
    matrix_instr_nonkdim: int = 0
    kpack: int = 1

    def options(self, arch: Arch) -> dict:
        """Launch options for `arch`: AMD extras only on AMD targets."""
        opts = {"num_warps": min(self.num_warps, arch.max_num_warps), "num_stages": self.num_stages}
        if arch.family in ("amd-cdna", "amd-rdna"):
            opts["waves_per_eu"] = self.waves_per_eu
        if arch.family == "amd-cdna":
            opts["matrix_instr_nonkdim"] = self.matrix_instr_nonkdim
            opts["kpack"] = self.kpack
        return opts


_T = TileConfig


# ---------------------------------------------------------------------------------------------------
# GEMM (linear forward, and the dx and dweight products of its backward). Per family two lists,
# "light" (no epilogue or a bias) and "heavy" (an activation and its derivative in the epilogue, a residual
# tile read in the epilogue, or the backward's scaled-A prologue and transposed operands), each of
# (min M, entry): the first entry whose min M the problem reaches, so decode-sized problems get short tiles
# instead of masked ones. Register counts below are from the compiled kernels at bf16 with Triton's own
# specialization (AMD: buffer instructions for tensors under 2 GiB).

GEMM_TABLES: dict[str, dict[str, tuple[tuple[int, TileConfig], ...]]] = {
    "nvidia": {
        "light": (
            (256, _T(128, 256, 8, 3, "128x256x64, two warpgroups, wgmma n256 (the Triton matmul tutorial's Hopper "
                                     "shape): 174 regs, 0 spill, 144 KiB on sm_90; sm_80 255 regs", BLOCK_K=64,
                     GROUP_M=8)),
            (64, _T(64, 128, 4, 4, "64x128x64 for a few hundred rows: more programs than 128x256", BLOCK_K=64,
                    GROUP_M=8)),
            (1, _T(16, 128, 4, 4, "decode-sized M: 16-row tiles waste no MMA rows beyond the minimum", BLOCK_K=128,
                   GROUP_M=1)),
        ),
        "heavy": (
            (256, _T(128, 128, 8, 4, "128x128x32: 128x256 spills 528 B with a gelu epilogue on sm_90, 120 B with a "
                                     "residual on sm_100, and ptxas spills 4 KB in the backward on sm_80; this "
                                     "shape is 0 spill on sm_80/90/100 (sm_80 gelu: 254 regs)", BLOCK_K=32,
                     GROUP_M=8)),
            (64, _T(64, 128, 4, 4, "64x128x32 for a few hundred rows", BLOCK_K=32, GROUP_M=8)),
            (1, _T(16, 128, 4, 4, "decode-sized M", BLOCK_K=64, GROUP_M=1)),
        ),
    },
    "amd-cdna": {
        "light": (
            (256, _T(256, 256, 8, 2, "256x256x32, 8 waves, mfma16, kpack 2, num_stages 2 (AMD's MI300X GEMM tuning "
                                     "starting point): 206 VGPRs, 0 spill, 32 KiB LDS", BLOCK_K=32, GROUP_M=4,
                     matrix_instr_nonkdim=16, kpack=2)),
            (64, _T(64, 128, 4, 2, "64x128x64 for a few hundred rows: more workgroups over 304 CUs", BLOCK_K=64,
                    GROUP_M=4, waves_per_eu=2, matrix_instr_nonkdim=16, kpack=2)),
            (1, _T(16, 128, 4, 2, "decode-sized M: 16-row tiles (the MFMA 16x16 minimum)", BLOCK_K=128, GROUP_M=1,
                   waves_per_eu=2, matrix_instr_nonkdim=16, kpack=2)),
        ),
        "heavy": (
            (256, _T(128, 128, 8, 2, "128x128x32, waves_per_eu 2: 256x256 spills with gelu and BLOCK_K 64 spills "
                                     "68 B in the backward on gfx90a; this is 150-160 VGPRs, 0 spill, 16-24 KiB "
                                     "LDS", BLOCK_K=32, GROUP_M=4, waves_per_eu=2, matrix_instr_nonkdim=16,
                     kpack=2)),
            (64, _T(64, 128, 4, 2, "64x128x32 for a few hundred rows", BLOCK_K=32, GROUP_M=4, waves_per_eu=2,
                    matrix_instr_nonkdim=16, kpack=2)),
            (1, _T(16, 128, 4, 2, "decode-sized M", BLOCK_K=64, GROUP_M=1, waves_per_eu=2, matrix_instr_nonkdim=16,
                   kpack=2)),
        ),
    },
    "amd-rdna": {
        "light": (
            (128, _T(128, 128, 8, 2, "128x128x32, 8 wave32s, WMMA 16x16x16: 151 VGPRs, 16 KiB LDS", BLOCK_K=32,
                     GROUP_M=8)),
            (1, _T(64, 64, 4, 2, "small M: 64x64x32, 133 VGPRs", BLOCK_K=32, GROUP_M=1)),
        ),
        "heavy": (
            (128, _T(128, 128, 8, 2, "128x128x32: gelu epilogue 236 VGPRs, residual 169, backward 175-207, 0 spill",
                     BLOCK_K=32, GROUP_M=8)),
            (1, _T(64, 64, 4, 2, "small M: 64x64x32, backward 175 VGPRs", BLOCK_K=32, GROUP_M=1)),
        ),
    },
    "cpu": {
        # The interpreter: small tiles so small test matrices cross several blocks in M, N and K.
        "light": ((1, _T(32, 32, 4, 1, "interpreter: several tiles per test matrix", BLOCK_K=16, GROUP_M=2)),),
        "heavy": ((1, _T(32, 32, 4, 1, "interpreter: several tiles per test matrix", BLOCK_K=16, GROUP_M=2)),),
    },
}


def _wide(dtype: torch.dtype) -> bool:
    return torch.empty((), dtype=dtype).element_size() > 2


def gemm_candidates(M: int, N: int, K: int, dtype: torch.dtype, arch: Arch, *, heavy: bool = False
                    ) -> list[TileConfig]:
    """Entries serving this M, most preferred first. heavy: the epilogue evaluates an activation and its
    derivative, or the kernel is a backward product (see GEMM_TABLES). fp32: BLOCK_K halved."""
    if min(M, N, K) < 1:
        raise ValueError(f"gemm: sizes must be >= 1, got M={M}, N={N}, K={K}")
    entries = [c for min_m, c in GEMM_TABLES[arch.family]["heavy" if heavy else "light"] if min_m <= M]
    if _wide(dtype) and arch.family != "cpu":
        entries = [replace(c, BLOCK_K=max(16, c.BLOCK_K // 2), reason=c.reason + "; fp32: BLOCK_K halved")
                   for c in entries]
    return entries


def gemm_config(M: int, N: int, K: int, dtype: torch.dtype, arch: Arch, *, heavy: bool = False) -> TileConfig:
    """The default entry: a pure function of (M, N, K, dtype, architecture, epilogue weight)."""
    return gemm_candidates(M, N, K, dtype, arch, heavy=heavy)[0]


def num_xcds(arch: Arch) -> int:
    return XCDS.get(arch.name, 1)
