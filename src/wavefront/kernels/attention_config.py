"""Launch configurations of the attention kernels: data, and pure functions that pick from it.

One :class:`~wavefront.kernels._tables.FamilyTable` per kernel (``ATTENTION_FWD``, ``ATTENTION_DKDV``,
``ATTENTION_DQ``, ``ATTENTION_ATOMIC``), read by the family (``nvidia``, ``amd-cdna``, ``amd-rdna``, ``cpu`` for
the interpreter) with ``sm_90`` and ``sm_100`` as keys of their own (:func:`table_key`). A row is that key's
``largest padded head dim served -> candidates, preferred first``; the default row is the pointer path of
NVIDIA targets without TMA (sm_80), and every other key has a ``Differs`` row whose reason is the measurement
that made it differ. Each candidate is a tile shape, launch options, and the reason it is there, quoting what
the ahead-of-time compiled kernel showed for bf16 at that entry (``wavefront inspect --op attention``;
docs/kernels-attention-gemm.md has the full table). No entry carries a GPU timing: none was measured on this
project's machines yet, so among spill-free shapes the choice follows the published practice named in the
reason and would be refined by timing the short candidate lists on a GPU.

fp32 inputs (accepted for testing) double every operand tile, so the picker halves BLOCK_M and BLOCK_N,
keeping shared memory at the verified 16-bit footprint. AMD-only options are emitted by
:meth:`AttentionConfig.options` only on AMD targets.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

import torch

from wavefront.kernels._tables import Differs, FamilyTable
from wavefront.kernels.matmul_config import matrix_launch_options
from wavefront.runtime import Arch

AttentionKernel = Literal["fwd", "bwd_dkdv", "bwd_dq", "bwd_atomic"]


@dataclass(frozen=True)
class AttentionConfig:
    """One entry: BLOCK_M is the query tile and BLOCK_N the key tile in all three kernels.

    Kernels: ``fwd``; ``bwd_dkdv`` and ``bwd_dq`` (the deterministic backward); ``bwd_atomic`` (the dK/dV
    kernel forming dQ by atomics, ``deterministic=False``; a family without entries uses its ``bwd_dkdv``).

    warp_specialize: split the key loop into producer and consumer warps (``tl.range(...,
    warp_specialize=True)``); used with the TMA path only (sm_90, sm_100), where the forward then runs
    every key block in one loop (see kernels/attention_fwd.py).
    pipeline_qk: forward only, TMA path without warp specialization: issue the next key block's QK^T before
    this block's softmax (FA3's intra-warpgroup overlap written in the source; see kernels/attention_fwd.py).
    d_split: backward only: split the dK/dV (or dQ) accumulator's head-dim columns over this many programs,
    each recomputing the scores (head_dim 256: a full-width accumulator does not fit the registers with
    tiles wide enough for wgmma/tcgen05).
    transposed: backward only: read the operands contracted over the sequence (Q and dO for dK/dV, K for dQ)
    from [B, H, head_dim, S] copies made by the launcher (AMD: no 16-bit LDS reads of transposed tiles).
    tma_stages: backward dK/dV kernel on its TMA path (sm_90, sm_100) only: the depth of the ring of Q/dO
    tiles its loop keeps in flight (the loop's ``num_stages``; the kernel's own ``num_stages`` still
    governs the pointer path, whose machine code it leaves as it was); 0: ``num_stages``.
    d_chunk: contract the score products (QK^T, and dO V^T backward) over head-dim chunks of this many columns,
    reading both operands chunk by chunk inside the key loop instead of holding the program's resident tiles at
    full width (0: whole head dim). Set only by the amd-rdna table: RDNA3's WMMA keeps operands replicated over
    the two half-waves, and the full-width resident tiles alone fill the 256 VGPRs of a lane."""

    BLOCK_M: int
    BLOCK_N: int
    num_warps: int
    num_stages: int
    reason: str
    waves_per_eu: int = 0
    matrix_instr_nonkdim: int = 0
    kpack: int = 1
    warp_specialize: bool = False
    pipeline_qk: bool = False
    d_split: int = 1
    transposed: bool = False
    d_chunk: int = 0
    tma_stages: int = 0

    def options(self, arch: Arch) -> dict:
        """Launch options for `arch`: AMD extras only on AMD targets."""
        return matrix_launch_options(self, arch)


_T = AttentionConfig


def has_tma(arch: Arch) -> bool:
    """sm_90 and later: TMA, wgmma/tcgen05 and warp specialization."""
    return arch.family == "nvidia" and int(arch.name.removeprefix("sm_")) >= 90


def table_key(arch: Arch) -> str:
    """The table an architecture reads: ``sm_90`` and ``sm_100`` have their own, else its family's."""
    return arch.name if has_tma(arch) else arch.family


def _wide(dtype: torch.dtype) -> bool:
    return torch.empty((), dtype=dtype).element_size() > 2


def _cdna(m, n, w, reason, wpe=2, nonkdim=16, **kw):
    # nonkdim selects the MFMA shape (16: 16x16x16, 32: 32x32x8); num_stages (default 1) picks AMD's stream
    # pipeliner's depth: 2 prefetches the next tile into registers, 3 also double-buffers it in LDS, 4 on a loop
    # of two chained dots (the forward) is the schedule that on gfx942 also gets s_setprio (ATTENTION_FWD).
    return AttentionConfig(m, n, w, kw.pop("num_stages", 1), reason, waves_per_eu=wpe, matrix_instr_nonkdim=nonkdim,
                           **kw)


# ---------------------------------------------------------------------------------------------------
# Attention: one FamilyTable per kernel; a row is a family's `largest padded head dim served -> candidates,
# preferred first`. BLOCK_M is the query tile and BLOCK_N the key tile in all three kernels. The default row
# is the pointer path every NVIDIA target without TMA runs (sm_80); every other family's row is a Differs
# naming the measurement that made it differ, and each candidate keeps its own compile-measured reason.
# "regs/spill/smem" quote the family's own target at bf16 (the docs table has every target).

HeadDimRow = dict[int, tuple[AttentionConfig, ...]]

#: The keys a table is read by (:func:`table_key`): the families, with sm_90 and sm_100 on their own.
ATTENTION_FAMILIES: tuple[str, ...] = ("nvidia", "sm_90", "sm_100", "amd-cdna", "amd-rdna", "cpu")

# The interpreter: small tiles so the small test shapes cross several blocks and exercise every loop split
# (full blocks, the causal diagonal, the ragged tail) with BLOCK_M != BLOCK_N.
_CPU_REASON = "the interpreter: several blocks per test sequence, BLOCK_M != BLOCK_N"

# RDNA3 (gfx1100) wave32 WMMA keeps both operands replicated across the two half-waves, so register pressure
# grows with head_dim much faster than on CDNA: the operands a kernel keeps whole across its loop (Q and dO in
# dQ, Q forward, K and V in dK/dV), four 16 x 128 bf16 tiles at dQ d128 = 4 x 32 VGPRs, doubled by the
# replication, fill the 256 VGPRs of a lane before the accumulator. A sweep of 35 tile/warp/d_split/transposed
# shapes (Triton 3.9, December 2026) found no spill-free one at dQ d128 (360-492 B per lane), forward d256
# (500-2024 B), dK/dV d256 (504-1396 B), dQ d256 (2660-3504 B). d_chunk removes those resident tiles: the score
# products contract the head dim in 64-column chunks read inside the loop (the kept tile's chunks re-read from
# cache every step: one extra BLOCK x D read per step, no extra matrix work), and every row compiles with 0
# spill. VGPR figures: gfx1100, bf16, the bench shapes (wavefront inspect --op attention --targets gfx1100).
_RDNA_REASON = ("gfx1100's WMMA replicates both operands over the half-waves: no spill-free full-width shape in a "
                "35-shape sweep at dQ d128 (360-492 B) or any d256 kernel (500-3504 B); small tiles and head-dim "
                "chunks (d_chunk) compile with 0 spill")

# CDNA (gfx90a, gfx942): 64 KiB LDS per CU. Every deterministic entry gives a wave 32 rows of its stationary
# tile (query rows in the forward and dQ, at 32x32x8 MFMA, matrix_instr_nonkdim 32; key rows in dK/dV, at
# 16x16x16 over 16-row query blocks), so each wave reads a K/V (or Q/dO) tile from LDS once per 32 of its rows
# instead of per 16: half the LDS bytes per MFMA FLOP of the 16-rows-per-wave entries these replaced (whose LDS
# read time equalled their MFMA time). num_stages 3 makes AMD's stream pipeliner allocate two LDS buffers per
# streamed operand (the TTGIR's local_alloc is 2 x tile) with the next tile's global loads issued a block ahead;
# num_stages 2 keeps one LDS buffer and prefetches into registers. waves_per_eu 1 gives a wave the 512 unified
# VGPRs/AGPRs where the stationary tiles and accumulators need more than 256 (one wave per SIMD; the latency is
# then covered by the prefetch, not by a second wave). transposed: the operand each product contracts over the
# sequence (V forward; Q, dO and K backward) comes from a [.., head_dim, S] copy, so no tile is transposed
# through LDS 16 bits at a time. Figures: gfx942, bf16, the bench shapes (wavefront inspect --op attention
# --targets gfx942 --all), Triton 3.9; "was" quotes the 16x16 entry each replaced.
_CDNA_REASON = ("wave64 MFMA and 64 KiB LDS: 32 stationary rows per wave halve the LDS reads per MFMA FLOP of the "
                "16-rows-per-wave tiles (whose LDS time equalled their MFMA time); [.., head_dim, S] operand copies: "
                "0 narrow LDS ops")

# Backward on sm_90 and sm_100 (one row: both compile the same tiles to wgmma or tcgen05).
_TMA_BWD_REASON = ("K/V-stationary with Q/dO by TMA (a ring of tma_stages tiles): wgmma/tcgen05 N >= 64 where the "
                   "pointer tiles ran N 16-32; the same tiles on sm_90 and sm_100")

ATTENTION_FWD: FamilyTable[HeadDimRow] = FamilyTable(
    {
        64: (_T(128, 128, 8, 3, "FA2 tile: two warpgroups, wgmma m64 per warpgroup; 204 regs, 0 spill, 112 KiB"),),
        128: (_T(128, 64, 8, 3, "128x64 at d128: S and O accumulators fit with 8 warps; 184 regs, 0 spill, "
                                "128 KiB (sm_80: 242 regs)"),),
        256: (_T(64, 64, 8, 2, "64-row tiles keep the 64x256 O accumulator in registers; 227 regs, 0 spill "
                               "(sm_80: 254)"),),
    },
    "pointer path, FA2 tiles on 8 warps: 0 spill at every head dim on sm_80 (figures on each candidate)",
    {
        # TMA operands, key blocks of 128, the key loop warp-specialized (a TMA producer warp and two consumer
        # warpgroups of 64 query rows, registers moved to the consumers by setmaxnreg).
        "sm_90": Differs("TMA + warp specialization: 128-key blocks at 168 regs (setmaxnreg), 0 spill, 197 KiB", row={
            64: (_T(128, 128, 4, 2, "as d128 (128-key blocks)", warp_specialize=True),),
            128: (_T(128, 128, 4, 2, "128x128, 4 warps + warp specialization: 168 regs (setmaxnreg), 0 spill, "
                                     "197 KiB smem; num_stages 3 needs 263 KiB (over 227)", warp_specialize=True),
                  _T(128, 128, 8, 2, "QK^T of block j+1 issued before the softmax of block j, no warp "
                                     "specialization (Triton's data partitioning aborts on this loop): ptxas puts "
                                     "the 66 exp2s between that wgmma's issue and its wait (still wait 0); 241 "
                                     "regs, 0 spill, 161 KiB; untimed, so second", pipeline_qk=True)),
            256: (_T(64, 64, 4, 2, "d256: 64x64, 168 regs, 0 spill, 230 KiB smem (fits 227 KiB opt-in); "
                                   "128x128 needs 394 KiB", warp_specialize=True),),
        }),
        "sm_100": Differs("tcgen05 accumulates in tensor memory: 128x128 on 8 warps at 96 regs, 0 spill (4 warps spill "
                          "336 B)", row={
            64: (_T(128, 128, 8, 2, "as d128 (128-key blocks)", warp_specialize=True),),
            128: (_T(128, 128, 8, 2, "128x128, 8 warps + warp specialization, tcgen05 into TMEM: 96 regs, 0 spill, "
                                     "166 KiB; 4 warps spill 336 B", warp_specialize=True),),
            256: (_T(64, 64, 8, 2, "d256: 64x64, 96 regs, 0 spill, 165 KiB; 4 warps spill 336 B",
                     warp_specialize=True),),
        }),
        # num_stages 4 is the depth at which AMD's pipeliner applies its schedule for two chained dots (QK^T feeding
        # PV): each dot's loads double-buffered between the two compute clusters, and on gfx942 the block ping-pong
        # pass then brackets the memory clusters with s_setprio 1 and the compute clusters with s_setprio 0, so
        # of the two waves sharing a SIMD the one issuing loads goes first while the other runs its MFMAs (8
        # s_setprio, 4 barriers per key block). gfx90a compiles the same schedule without the priorities.
        "amd-cdna": Differs(_CDNA_REASON, row={
            64: (_cdna(128, 32, 4, "as d128: 144 | 155 VGPRs, 0 spill, 3 waves per SIMD", nonkdim=32, num_stages=4,
                       kpack=2, transposed=True),),
            128: (_cdna(128, 32, 4, "32 query rows per wave, 32x32 MFMA, V^T copy, the chained-dot schedule (num_stages "
                                    "4): LDS double-buffered, s_setprio around the memory and compute clusters on gfx942; "
                                    "220 | 240 VGPRs (kpack 2; kpack 1 spills 8 B on gfx90a with the 1x32 FP8 output), 0 "
                                    "spill, 0 narrow LDS ops, 4 barriers per key block",
                        nonkdim=32, num_stages=4, kpack=2, transposed=True),
                  _cdna(128, 32, 4, "as the first with the plain stream pipeline (num_stages 3, LDS double-buffered, no "
                                    "s_setprio): 211 VGPRs, 0 spill, 2 barriers per key block (was 16x16 at 128x64 x 8 "
                                    "waves: 174 VGPRs, 4 barriers, one LDS buffer); untimed against it, so second",
                        nonkdim=32, num_stages=3, transposed=True),
                  _cdna(128, 64, 8, "the 16x16 entry these replaced (16 rows per wave, one LDS buffer): 174 VGPRs, 0 "
                                    "spill; kept until a GPU times them", transposed=True)),
            256: (_cdna(128, 32, 4, "d256: 32 rows per wave, 32x32 MFMA, the chained-dot schedule (num_stages 4, s_setprio "
                                    "on gfx942), 64 KiB LDS, waves_per_eu 1: 438 | 385 VGPRs+AGPRs, 0 spill, 0 narrow "
                                    "LDS ops, 4 barriers",
                        wpe=1, nonkdim=32, num_stages=4, transposed=True),
                  _cdna(128, 32, 4, "d256, num_stages 3 (LDS double-buffered, no s_setprio): 350 VGPRs+AGPRs, 0 spill, 2 "
                                    "barriers (was 64x32 at 16 rows per wave); untimed against the first, so second",
                        wpe=1, nonkdim=32, num_stages=3, transposed=True)),
        }),
        "amd-rdna": Differs(_RDNA_REASON, row={
            64: (_T(64, 32, 4, 1, "64x32, 4 waves: 222 VGPRs, 0 spill"),),
            128: (_T(64, 16, 8, 1, "d128: 64x16, 8 waves: 219 VGPRs, 0 spill; 64x32 spills"),),
            256: (_T(16, 16, 4, 1, "d256: 16x16, 4 waves, QK^T in 64-column chunks (Q re-read each key block): "
                                   "143 VGPRs, 0 spill (full width spilled 540 B at this tile, 500 B at the best "
                                   "of 8 shapes)", d_chunk=64),),
        }),
        "cpu": Differs(_CPU_REASON, row={256: (_T(32, 16, 4, 1, "interpreter: several blocks per test sequence"),)}),
    },
    families=ATTENTION_FAMILIES,
)

_TMA_DKDV: HeadDimRow = {
    64: (_T(64, 128, 8, 1, "as d128 (sm_90 189 regs, sm_100 156, 0 spill)", tma_stages=2),),
    128: (_T(64, 128, 8, 1, "128 keys resident over two warpgroups, 64 queries streamed: wgmma N 64/128 "
                            "(was 16 at 32x64). Q/dO by TMA, a ring of 2 tiles: sm_90 254 regs, 0 spill, "
                            "129 KiB, 6 barriers per query tile (pointer path 251 regs, 5); sm_100 194 regs, "
                            "161 KiB, 8 barriers (was 15); the pointer path at num_stages 2 spilled 112 B",
            tma_stages=2),),
    256: (_T(64, 128, 8, 1, "d256: each program owns 64 of the 256 dK/dV columns (d_split 4) and "
                            "recomputes S and dP: 2.5x this kernel's matrix work, but wgmma N 64 and 0 "
                            "spill (214 regs); d_split 2 spills 136 B, full width 1 KiB; pointer loads: a "
                            "2-deep Q/dO ring beside resident 256-wide K and V needs 289 KiB", d_split=4),),
}

ATTENTION_DKDV: FamilyTable[HeadDimRow] = FamilyTable(
    {
        64: (_T(32, 128, 8, 2, "128 keys resident, 32 query rows streamed (tutorial's dK/dV shape); "
                               "166 regs, 0 spill"),),
        128: (_T(32, 64, 8, 2, "d128: dK+dV accumulators 2x64x128 fp32 over 256 threads; 189 regs, 0 spill; "
                               "32x128 fits sm_90 only, 64x64 spills"),),
        256: (_T(32, 32, 8, 2, "d256: 32x32 is the largest spill-free tile (169 regs); too few rows for "
                               "wgmma, so sm_90 runs mma.sync here"),),
    },
    "pointer path, K/V stationary, 32 query rows streamed: 0 spill at every head dim on sm_80 (figures on each "
    "candidate)",
    {
        "sm_90": Differs(_TMA_BWD_REASON, row=_TMA_DKDV),
        "sm_100": Differs(_TMA_BWD_REASON, row=_TMA_DKDV),
        # dK/dV streams Q, dO and their transposed copies: four tiles per query block. At 32 query rows the
        # double-buffered form (num_stages 3) spills at d128 (gfx942 600 B, gfx90a 560 B; kpack 2: 436-484 B;
        # 32x64 on 2 waves: 604-664 B; num_stages 4: 1.2 KB) because the pipeliner also holds the next block's
        # operands in registers. 16 query rows per block with 16x16x16 MFMA halves the streamed tiles and keeps
        # 32 key rows per wave (each wave reads a Q/dO tile once per 32 of its keys, as at 32x32): CK's d128
        # backward tile (16 query rows x 128 keys, 4 warps along the keys, 16x16 warp tiles). 16 rows at 32x32x8
        # (nonkdim 32) also compile (512 VGPRs, 0 spill) but issue 48 MFMAs per 16-row block where 32 do the
        # work (the 32-wide instruction half empty). Measured on the bench shapes, gfx942 | gfx90a, Triton 3.9.
        "amd-cdna": Differs(_CDNA_REASON, row={
            64: (_cdna(16, 128, 4, "as d128: 236 VGPRs (2 waves per SIMD), 0 spill, 0 narrow LDS ops, LDS double-"
                                   "buffered (16 KiB), 2 barriers per query block (32 query rows at 32x32x8, double-"
                                   "buffered: 400 VGPRs, 0 spill, 1 wave)",
                       wpe=1, kpack=2, num_stages=3, transposed=True),),
            128: (_cdna(16, 128, 4, "d128: 16 query rows x 128 keys, 32 keys per wave stationary (K, V, dK, dV), 16x16x16 "
                                    "MFMA, kpack 2, LDS double-buffered (num_stages 3: two 16 KiB sets of Q, dO, Q^T, "
                                    "dO^T tiles), waves_per_eu 1: 354-490 VGPRs+AGPRs, 0 spill (kpack 1: 2 VGPRs to AGPRs "
                                    "on gfx942), 0 narrow LDS ops, 2 barriers per query block, 64 MFMAs per block (was "
                                    "32x128 at 32x32x8, one LDS buffer, no prefetch: 329 VGPRs, 8 barriers)",
                        wpe=1, kpack=2, num_stages=3, transposed=True),
                  _cdna(32, 128, 4, "d128, 32 query rows at 32x32x8 with the next Q/dO block prefetched into registers "
                                    "and one LDS buffer (num_stages 2): 468 | 502 VGPRs, 0 spill, 2 barriers; the same "
                                    "MFMA work per key; untimed against the first, so second",
                        wpe=1, nonkdim=32, num_stages=2, transposed=True)),
            256: (_cdna(32, 128, 4, "d256: as d128's second entry with d_split 4 (each program 64 of the 256 dK/dV "
                                    "columns, S and dP recomputed): 429 VGPRs+AGPRs, 0 spill, 2 barriers, one LDS buffer. "
                                    "Not double-buffered: no such form compiles clean on both CDNA targets (16x128 at "
                                    "16x16x16, d_split 4: gfx942 0 spill, gfx90a 1 VGPR to AGPR; with kpack 2 the "
                                    "reverse, 9 on gfx942; d_split 2: up to 20 B; 32 query rows: 244-256 B); d_split 2 "
                                    "at one buffer spills 376 B, full width 2 KiB",
                           wpe=1, nonkdim=32, num_stages=2, transposed=True, d_split=4),),
        }),
        "amd-rdna": Differs(_RDNA_REASON, row={
            64: (_T(16, 32, 4, 1, "16x32, 4 waves: 189 VGPRs, 0 spill; 32x32 spills"),),
            128: (_T(16, 32, 4, 1, "d128: S^T and dP^T in 64-column chunks (K, V re-read each query step), full-width "
                                   "dK/dV: 209-212 VGPRs, 0 spill, S and dP computed once (was d_split 2, S and dP "
                                   "recomputed per half of the columns: 242-253 VGPRs, 0 spill); untimed against it",
                     d_chunk=64),),
            256: (_T(16, 16, 4, 1, "d256: 16x16, 4 waves, S^T and dP^T in 64-column chunks: 225 VGPRs, 0 spill "
                                   "(full width spilled 1272 B; d_split 4 with Q^T/dO^T copies 504 B)", d_chunk=64),),
        }),
        "cpu": Differs(_CPU_REASON, row={256: (_T(16, 32, 4, 1, "interpreter: several blocks per test sequence"),)}),
    },
    families=ATTENTION_FAMILIES,
)

_TMA_DQ: HeadDimRow = {
    64: (_T(128, 64, 8, 2, "as d128"),),
    128: (_T(128, 64, 8, 2, "128 queries resident, 64 keys streamed: wgmma N 64/128 (was 32); sm_90 201 regs, "
                            "0 spill"),),
    256: (_T(128, 64, 8, 1, "d256: two programs per query tile, 128 dQ columns each (d_split 2), S and dP "
                            "recomputed: 231 regs, 0 spill; full width spills 152 B", d_split=2),),
}

ATTENTION_DQ: FamilyTable[HeadDimRow] = FamilyTable(
    {
        64: (_T(128, 32, 8, 2, "128 query rows resident, 32 keys streamed (tutorial's dQ shape); 116 regs"),),
        128: (_T(128, 32, 8, 2, "d128: 157 regs, 0 spill on sm_90; 64x64 with 4 warps spills on sm_80"),),
        256: (_T(64, 32, 8, 2, "d256: 240 regs, 0 spill; 64x16 spills on sm_90"),),
    },
    "pointer path, Q/dO stationary, 32 keys streamed: 0 spill at every head dim on sm_80 and sm_90 (figures on each "
    "candidate)",
    {
        "sm_90": Differs(_TMA_BWD_REASON, row=_TMA_DQ),
        "sm_100": Differs(_TMA_BWD_REASON, row=_TMA_DQ),
        "amd-cdna": Differs(_CDNA_REASON, row={
            64: (_cdna(128, 32, 4, "as d128", wpe=1, nonkdim=32, num_stages=3, transposed=True),),
            128: (_cdna(128, 32, 4, "d128: 32 query rows per wave, 32x32 MFMA, LDS double-buffered (num_stages 3), K^T "
                                    "copy, waves_per_eu 1: 274 VGPRs+AGPRs, 0 spill, 0 narrow LDS ops, 2 barriers per "
                                    "key block (was 128x32 x 8 waves, 16x16: 130 VGPRs, 6 barriers); at waves_per_eu 2 "
                                    "it spills 100 B",
                            wpe=1, nonkdim=32, num_stages=3, transposed=True),),
            256: (_cdna(128, 32, 4, "d256: as d128 with d_split 2 and one LDS buffer: 412 VGPRs+AGPRs, 0 spill; full "
                                    "width spills 120 B (num_stages 2) to 268 B (3)",
                            wpe=1, nonkdim=32, num_stages=2, transposed=True, d_split=2),),
        }),
        "amd-rdna": Differs(_RDNA_REASON, row={
            64: (_T(64, 16, 4, 1, "64x16, 4 waves: 230 VGPRs, 0 spill"),),
            128: (_T(32, 16, 8, 1, "d128: 32x16, 8 waves, S and dP in 64-column chunks (Q, dO re-read each key "
                                   "step): 140-142 VGPRs, 0 spill (full width spilled 404-436 B; with a K^T copy "
                                   "about the same VGPRs and 48 narrow LDS ops instead of 112)", d_chunk=64),),
            256: (_T(16, 16, 4, 1, "d256: 16x16, 4 waves, S and dP in 64-column chunks: 195 VGPRs, 0 spill (full "
                                   "width spilled 1988 B)", d_chunk=64),
                  _T(32, 16, 8, 1, "d256: 32 query rows (half the K/V reads per row): 200 VGPRs, 0 spill, 48 narrow "
                                   "LDS ops; untimed, so second", d_chunk=64)),
        }),
        "cpu": Differs(_CPU_REASON, row={256: (_T(32, 16, 4, 1, "interpreter: several blocks per test sequence"),)}),
    },
    families=ATTENTION_FAMILIES,
)

# deterministic=False: the dK/dV kernel also forms each query tile's dQ share. None: the family runs that
# kernel with its dK/dV row.
ATTENTION_ATOMIC: FamilyTable[HeadDimRow | None] = FamilyTable(
    None,
    "the family's dK/dV tiles also hold the dQ share without spilling (sm_80 208/252 regs at d128/d256, 0 spill; "
    "gfx1100 as its dK/dV row)",
    {
        # The dQ share is 32 more fp32 registers per thread at 64 queries, d128, 8 warps: the dK/dV tile 64x128
        # then spills 24 B (255 regs), 16 warps 424 B (128-register cap).
        "sm_90": Differs("with the dQ share the dK/dV tile 64x128 spills 24 B (255 regs), 16 warps 424 B", row={
            64: (_T(64, 128, 8, 1, "d64: the dK/dV tile fits with the dQ share: 213 regs, 0 spill, wgmma N >= 32 "
                                   "(32x128: 159 regs, N 16)", tma_stages=2),),
            128: (_T(32, 128, 8, 1, "32 queries x 128 keys: 242 regs, 0 spill, all five products wgmma (N 32-128; "
                                    "the dQ share as dQ^T = K^T dS^T, M = head dim); TMA ring of 2: 233 regs, "
                                    "9 barriers per query tile (pointer path 8)", tma_stages=2),),
            256: (_T(64, 128, 8, 1, "d256, d_split 4 as dK/dV: 247 regs, 0 spill, wgmma N >= 32", d_split=4),),
        }),
        "sm_100": Differs("with the dQ share the dK/dV tiles spill 0 B at d128 but 152 B at d256", row={
            64: (_T(64, 64, 8, 1, "as d128: 104 regs, 0 spill", tma_stages=2),),
            128: (_T(64, 64, 8, 1, "64x64: 166 regs, 0 spill, tcgen05 N 64 (64x128 also 0 spill at 255 regs); "
                                   "TMA ring of 2: 163 regs, 18 barriers per query tile (pointer path 25)",
                     tma_stages=2),),
            256: (_T(64, 64, 8, 1, "d256, d_split 2: 254 regs, 0 spill (64x128 d_split 4 spills 152 B)",
                     d_split=2),),
        }),
        # The 32x32 dK/dV tiles spill with the dQ share's tile (gfx942: 52 B at d128 GQA, 684 B at d256; 32x64 x 2
        # waves: 60-708 B), so this keeps the 16x16 tiles every CDNA dK/dV ran before (0 spill; 8-72 narrow LDS
        # ops from the dQ share's transposed tile). Measured on atomic variants of the bench cases added for the
        # purpose (not in the gate).
        "amd-cdna": Differs("with the dQ share the 32x32 dK/dV tiles spill (gfx942: 52 B at d128 GQA, 684 B at d256)",
                            row={
            64: (_cdna(32, 64, 4, "as d128", transposed=True),),
            128: (_cdna(32, 64, 4, "atomic dQ, d128: 32x64 x 4 waves, 16x16 MFMA: 244 VGPRs, 0 spill, 12 barriers per "
                                   "query block; the d128 dK/dV entry above spills 52 B with the dQ share",
                        transposed=True),),
            256: (_cdna(16, 64, 4, "atomic dQ, d256: 16x64 x 4 waves, waves_per_eu 1: 426 VGPRs+AGPRs, 0 spill; the "
                                   "d256 dK/dV entry above spills 684 B with the dQ share",
                        wpe=1, transposed=True),),
        }),
    },
    families=ATTENTION_FAMILIES,
)

#: kernel -> its table (family -> head dim -> candidates).
ATTENTION_TABLES: dict[AttentionKernel, FamilyTable] = {
    "fwd": ATTENTION_FWD, "bwd_dkdv": ATTENTION_DKDV, "bwd_dq": ATTENTION_DQ, "bwd_atomic": ATTENTION_ATOMIC,
}


def padded_head_dim(head_dim: int) -> int:
    """The power-of-two tile width the head dim is held in (96 -> 128); at least 16 for the MMA."""
    return max(16, 1 << (head_dim - 1).bit_length())


def attention_candidates(kind: AttentionKernel, head_dim: int, dtype: torch.dtype, arch: Arch) -> list[AttentionConfig]:
    """The family's entries for this head dim, in order of preference (fp32: tiles halved)."""
    block_d = padded_head_dim(head_dim)
    key = table_key(arch)
    # A family without its own atomic-dQ row runs that kernel with its dK/dV tiles.
    table = ATTENTION_TABLES[kind][key] or ATTENTION_DKDV[key]
    fitting = [d for d in sorted(table) if d >= block_d]
    if not fitting:
        raise ValueError(f"attention: head_dim {head_dim} is larger than the largest supported ({max(table)})")
    entries = list(table[fitting[0]])
    if _wide(dtype) and arch.family != "cpu":
        entries = [replace(c, BLOCK_M=max(16, c.BLOCK_M // 2), BLOCK_N=max(16, c.BLOCK_N // 2),
                           reason=c.reason + "; fp32: tiles halved") for c in entries]
    return entries


def attention_config(kind: AttentionKernel, head_dim: int, dtype: torch.dtype, arch: Arch) -> AttentionConfig:
    """The default (first) entry: a pure function of (kernel, head dim, dtype, architecture)."""
    return attention_candidates(kind, head_dim, dtype, arch)[0]
