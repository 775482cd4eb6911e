"""Launch configurations of the matrix-unit kernels (attention and the GEMM behind linear): data, and pure
functions that pick from it.

One table per architecture family. Each entry is a tile shape plus launch options and the reason it is
there; a picker walks the family's short candidate list in order of preference and returns the first
entry that fits the problem and the architecture's shared memory / LDS (the pruning), so a tuner that
times the survivors (``*_candidates``) times at most a handful, never a long sweep.

Shared-memory model (what the Triton pipeliner allocates, checked against the ahead-of-time compiled
kernels by ``tests/ops/test_matrix_instructions.py``):

- GEMM: ``(num_stages - 1 or 1) * (BLOCK_M + BLOCK_N) * BLOCK_K * itemsize`` plus the epilogue's
  layout-conversion scratch, bounded by ``BLOCK_M * BLOCK_N * 4``;
- attention forward: the Q tile plus the K and V tiles per stage;
- attention backward: the resident K/V (dk/dv pass) or Q/dO (dq pass) tiles plus the streamed pair per
  stage.

AMD-only launch options (``waves_per_eu``, ``matrix_instr_nonkdim``, ``kpack``) are emitted by
:meth:`TileConfig.options` only for AMD families: the NVIDIA compiler and the interpreter reject them.

MI300X (gfx942) has 8 XCDs, each with a private 4 MB L2, and the dispatcher hands workgroup ``p`` to XCD
``p % 8``. :data:`XCDS` feeds the program-order remap in ``kernels/_program_order.py`` so that programs
sharing a K/V head (attention) or an A row panel (GEMM) run on the same XCD.

No entry here comes with a GPU timing: none was measured on this project's machines yet. The reasons
state the resource arithmetic and the published practice each entry follows.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

import torch

from wavefront.runtime import Arch

AttentionKernel = Literal["fwd", "bwd_dkdv", "bwd_dq"]

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


def _buffers(num_stages: int) -> int:
    return max(1, num_stages - 1)


def attention_smem_bytes(kind: AttentionKernel, cfg: TileConfig, block_d: int, itemsize: int) -> int:
    """Shared memory / LDS an attention kernel needs at `cfg` (see the module docstring)."""
    bufs = _buffers(cfg.num_stages)
    if kind == "fwd":
        return (cfg.BLOCK_M + 2 * bufs * cfg.BLOCK_N) * block_d * itemsize
    # dkdv: K, V resident (BLOCK_N rows); Q and dO streamed (BLOCK_M rows). dq: the reverse.
    resident, streamed = (cfg.BLOCK_N, cfg.BLOCK_M) if kind == "bwd_dkdv" else (cfg.BLOCK_M, cfg.BLOCK_N)
    return (2 * resident + 2 * bufs * streamed) * block_d * itemsize


def gemm_smem_bytes(cfg: TileConfig, itemsize: int) -> int:
    operands = _buffers(cfg.num_stages) * (cfg.BLOCK_M + cfg.BLOCK_N) * cfg.BLOCK_K * itemsize
    return max(operands, cfg.BLOCK_M * cfg.BLOCK_N * 4 // 2)


# ---------------------------------------------------------------------------------------------------
# Attention. Keyed by family, then kernel, then the largest (power-of-two padded) head dim an entry
# serves. Candidates are listed in order of preference.

_T = TileConfig

ATTENTION_TABLES: dict[str, dict[AttentionKernel, dict[int, tuple[TileConfig, ...]]]] = {
    "nvidia": {
        "fwd": {
            64: (_T(128, 128, 8, 3, "128x128 tile, two warpgroups: each wgmma m64 slice gets 64 rows; "
                                    "3 stages of K/V = 96 KiB of 227 KiB smem"),
                 _T(128, 64, 4, 3, "one warpgroup, 128x64: fewer registers for the fp32 S tile")),
            128: (_T(128, 64, 8, 3, "128x64 with d128: S (128x64) and O (128x128) fp32 accumulators over "
                                    "256 threads stay under 255 registers; K/V 2 buffers = 64 KiB"),
                  _T(128, 32, 4, 3, "fallback with a smaller K/V tile when registers are short")),
            256: (_T(64, 32, 4, 2, "d256: the O accumulator alone is 64x256 fp32; 64-row tiles keep it in "
                                   "registers"),),
        },
        "bwd_dkdv": {
            64: (_T(64, 128, 8, 2, "K/V block of 128 rows resident, Q/dO streamed 64 rows at a time"),),
            128: (_T(64, 64, 8, 2, "d128: dK and dV fp32 accumulators (64x128 each) over 256 threads"),),
            256: (_T(32, 32, 4, 1, "d256: four 32x256 tiles resident; one buffer keeps smem under 227 KiB"),),
        },
        "bwd_dq": {
            64: (_T(128, 64, 8, 2, "128 query rows resident (Q, dO, dQ), K/V streamed 64 rows"),),
            128: (_T(64, 64, 4, 2, "d128: Q, dO and the dQ accumulator resident, K/V streamed"),),
            256: (_T(32, 32, 4, 1, "d256: small tiles, one buffer"),),
        },
    },
    "amd-cdna": {
        # 64 KiB LDS per CU; Triton's AMD stream pipeliner wants num_stages 1-2. waves_per_eu=2 asks the
        # compiler to budget 256 VGPRs per lane so two waves per SIMD overlap memory with MFMA (the
        # setting AMD's own Triton attention kernels start from); nonkdim 16 selects the 16x16 MFMA.
        "fwd": {
            64: (_T(128, 64, 4, 1, "128x64, 4 waves: Q + K/V = 48 KiB of 64 KiB LDS", waves_per_eu=2,
                    matrix_instr_nonkdim=16, kpack=1),),
            128: (_T(128, 64, 4, 1, "128x64 at d128: Q 32 KiB + K/V 32 KiB fits 64 KiB with one buffer",
                     waves_per_eu=2, matrix_instr_nonkdim=16, kpack=1),
                  _T(64, 64, 4, 1, "half the Q tile when LDS is short", waves_per_eu=2,
                     matrix_instr_nonkdim=16, kpack=1)),
            256: (_T(64, 32, 4, 1, "d256: 64-row Q tile (32 KiB) + 32-row K/V", waves_per_eu=1,
                     matrix_instr_nonkdim=16, kpack=1),),
        },
        "bwd_dkdv": {
            64: (_T(64, 64, 4, 1, "K/V 64 rows resident, Q/dO 64 rows streamed: 32 KiB LDS", waves_per_eu=1,
                    matrix_instr_nonkdim=16, kpack=1),),
            128: (_T(32, 64, 4, 1, "d128: 64-row K/V resident + 32-row Q/dO streamed = 48 KiB",
                     waves_per_eu=1, matrix_instr_nonkdim=16, kpack=1),),
            256: (_T(16, 32, 4, 1, "d256: 32-row K/V resident + 16-row Q/dO streamed = 48 KiB",
                     waves_per_eu=1, matrix_instr_nonkdim=16, kpack=1),),
        },
        "bwd_dq": {
            64: (_T(64, 64, 4, 1, "Q/dO 64 rows resident, K/V 64 rows streamed", waves_per_eu=1,
                    matrix_instr_nonkdim=16, kpack=1),),
            128: (_T(64, 32, 4, 1, "d128: 64-row Q/dO resident + 32-row K/V streamed = 48 KiB",
                     waves_per_eu=1, matrix_instr_nonkdim=16, kpack=1),),
            256: (_T(32, 16, 4, 1, "d256: 32-row Q/dO resident + 16-row K/V streamed = 48 KiB",
                     waves_per_eu=1, matrix_instr_nonkdim=16, kpack=1),),
        },
    },
    "amd-rdna": {
        # wave32 WMMA 16x16x16; 64 KiB LDS per WGP in CU mode budget; no matrix_instr_nonkdim/kpack.
        "fwd": {
            64: (_T(64, 64, 4, 1, "64x64, 4 waves: one 16-row WMMA strip per wave"),),
            128: (_T(64, 32, 4, 1, "d128: 64x32 keeps the O accumulator in the 256-VGPR budget"),),
            256: (_T(32, 32, 4, 1, "d256: 32x32 tiles"),),
        },
        "bwd_dkdv": {
            64: (_T(32, 64, 4, 1, "K/V 64 rows resident, Q/dO 32 rows streamed"),),
            128: (_T(32, 32, 4, 1, "d128: 32-row tiles"),),
            256: (_T(16, 32, 4, 1, "d256: 16-row Q/dO stream"),),
        },
        "bwd_dq": {
            64: (_T(64, 32, 4, 1, "Q/dO 64 rows resident, K/V 32 rows streamed"),),
            128: (_T(32, 32, 4, 1, "d128: 32-row tiles"),),
            256: (_T(32, 16, 4, 1, "d256: 16-row K/V stream"),),
        },
    },
    "cpu": {
        # The interpreter: small tiles so the small test shapes cross several blocks and exercise every
        # loop split (full blocks, the causal diagonal, the ragged tail) with BLOCK_M != BLOCK_N.
        "fwd": {256: (_T(32, 16, 4, 1, "interpreter: several blocks per test sequence"),)},
        "bwd_dkdv": {256: (_T(16, 32, 4, 1, "interpreter: several blocks per test sequence"),)},
        "bwd_dq": {256: (_T(32, 16, 4, 1, "interpreter: several blocks per test sequence"),)},
    },
}


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def padded_head_dim(head_dim: int) -> int:
    """The power-of-two tile width the head dim is held in (96 -> 128); at least 16 for the MMA."""
    return max(16, 1 << (head_dim - 1).bit_length())


def attention_candidates(kind: AttentionKernel, head_dim: int, dtype: torch.dtype, arch: Arch) -> list[TileConfig]:
    """The family's entries for this head dim that fit `arch`'s shared memory, in order of preference."""
    block_d = padded_head_dim(head_dim)
    table = ATTENTION_TABLES[arch.family][kind]
    fitting = [d for d in sorted(table) if d >= block_d]
    if not fitting:
        raise ValueError(f"attention: head_dim {head_dim} is larger than the largest supported ({max(table)})")
    entries = table[fitting[0]]
    itemsize = _itemsize(dtype)
    out = [c for c in entries if attention_smem_bytes(kind, c, block_d, itemsize) <= arch.shared_mem_per_block]
    # fp32 inputs (tests) double every tile: shrink the preferred entry until it fits.
    cfg = entries[-1]
    while not out and cfg.BLOCK_M > 16:
        cfg = replace(cfg, BLOCK_M=cfg.BLOCK_M // 2, BLOCK_N=max(16, cfg.BLOCK_N // 2), num_stages=1,
                      reason=cfg.reason + "; halved to fit shared memory")
        if attention_smem_bytes(kind, cfg, block_d, itemsize) <= arch.shared_mem_per_block:
            out.append(cfg)
    if not out:
        raise ValueError(f"attention: no {kind} tile fits {arch.name}'s shared memory at head_dim {head_dim}")
    return out


def attention_config(kind: AttentionKernel, head_dim: int, dtype: torch.dtype, arch: Arch) -> TileConfig:
    """The default (first fitting) entry: a pure function of (kernel, head dim, dtype, architecture)."""
    return attention_candidates(kind, head_dim, dtype, arch)[0]


# ---------------------------------------------------------------------------------------------------
# GEMM (linear forward, and the dx and dweight products of its backward). Keyed by family; each entry
# serves problems whose M (output rows) is at least `min_m`, so decode-sized and thin problems get
# smaller tiles instead of mostly-masked ones.

GEMM_TABLES: dict[str, tuple[tuple[int, TileConfig], ...]] = {
    "nvidia": (
        (256, _T(128, 256, 8, 3, "128x256x64, two warpgroups: wgmma n256 keeps the tensor cores fed; "
                                 "2 buffers x 48 KiB = 96 KiB smem (sm_80: 164 KiB)", BLOCK_K=64, GROUP_M=8)),
        (64, _T(64, 128, 4, 4, "64x128x64 for a few hundred rows: more programs than 128x256", BLOCK_K=64,
                GROUP_M=8)),
        (1, _T(16, 128, 4, 4, "decode-sized M: 16-row tiles waste no MMA rows beyond the minimum", BLOCK_K=128,
               GROUP_M=1)),
    ),
    "amd-cdna": (
        # MI300X: 256x256x64 with 8 waves, nonkdim 16, kpack 2 and num_stages 2 is the shape AMD's
        # GEMM tuning guide starts from; LDS is (256 + 256) x 64 x 2 B = 64 KiB for one buffer, so the
        # K tile is 32 here to leave room for the epilogue scratch.
        (256, _T(256, 256, 8, 2, "256x256x32, 8 waves, mfma16, kpack 2: 32 KiB LDS per buffer", BLOCK_K=32,
                 GROUP_M=4, waves_per_eu=0, matrix_instr_nonkdim=16, kpack=2)),
        (64, _T(64, 128, 4, 2, "64x128x64 for a few hundred rows: more workgroups over 304 CUs", BLOCK_K=64,
                GROUP_M=4, waves_per_eu=2, matrix_instr_nonkdim=16, kpack=2)),
        (1, _T(16, 128, 4, 2, "decode-sized M: 16-row tiles (the MFMA 16x16 minimum)", BLOCK_K=128, GROUP_M=1,
               waves_per_eu=2, matrix_instr_nonkdim=16, kpack=2)),
    ),
    "amd-rdna": (
        (128, _T(128, 128, 8, 2, "128x128x32, 8 wave32s: 16 KiB LDS per buffer, WMMA 16x16x16", BLOCK_K=32,
                 GROUP_M=8, waves_per_eu=0)),
        (1, _T(32, 64, 4, 2, "small M: 32x64x64", BLOCK_K=64, GROUP_M=1, waves_per_eu=0)),
    ),
    "cpu": (
        # The interpreter: small tiles so small test matrices cross several blocks in M, N and K.
        (1, _T(32, 32, 4, 1, "interpreter: several tiles per test matrix", BLOCK_K=16, GROUP_M=2)),
    ),
}


def gemm_candidates(M: int, N: int, K: int, dtype: torch.dtype, arch: Arch) -> list[TileConfig]:
    """Entries serving this M that fit shared memory, most preferred first."""
    if min(M, N, K) < 0:
        raise ValueError(f"gemm: sizes must be >= 0, got M={M}, N={N}, K={K}")
    itemsize = _itemsize(dtype)
    entries = [c for min_m, c in GEMM_TABLES[arch.family] if min_m <= M]
    out = []
    for cfg in entries:
        # fp32 operands (tests) double the tiles: halve BLOCK_K until the buffers fit.
        while gemm_smem_bytes(cfg, itemsize) > arch.shared_mem_per_block and cfg.BLOCK_K > 16:
            cfg = replace(cfg, BLOCK_K=cfg.BLOCK_K // 2, reason=cfg.reason + "; BLOCK_K halved to fit")
        if gemm_smem_bytes(cfg, itemsize) <= arch.shared_mem_per_block:
            out.append(cfg)
    if not out:
        raise ValueError(f"gemm: no tile fits {arch.name}'s shared memory for M={M}, N={N}, K={K}")
    return out


def gemm_config(M: int, N: int, K: int, dtype: torch.dtype, arch: Arch) -> TileConfig:
    """The default entry: a pure function of (M, N, K, dtype, architecture)."""
    return gemm_candidates(M, N, K, dtype, arch)[0]


def num_xcds(arch: Arch) -> int:
    return XCDS.get(arch.name, 1)
