"""Launch configuration for row-wise kernels (norms, softmax): data, and one pure function.

A row-wise kernel either holds a whole row in registers (``single_pass``: each element read once, the
memory-traffic minimum) or, for rows wider than the table's limit, loops over the row in blocks of
``BLOCK_N`` columns and reads it a second time (from L2 when the row fits there).

``num_warps`` follows from the wish that each thread moves whole 16-byte vectors:
``BLOCK_N = num_warps * warp_size * vecs_per_thread * (16 / itemsize)``, so loads and stores can be
128-bit on every target (checked in the machine code by ``wavefront inspect``; the static gate keeps it).
The lane width comes from the :class:`~wavefront.runtime.Arch`, never from a constant.

Kernels that also accumulate a column vector across the rows they own (the norms' backward keeps the
weight gradient partial, the weight and the row's xhat and g live: about four fp32 values per element)
ask with ``accumulate=True`` for one vector per thread (more threads, fewer registers each) and a lower
single-pass limit where registers run out.

Barriers. A reduction whose lanes span several warps costs a block-wide barrier (each warp writes its
partial to shared memory, all read them back); one that stays inside a warp is shuffles only. The rule,
per shape, for kernels that need the row's statistics (softmax: max and sum): every row pass has at most
one cross-warp exchange. The statistics are combined with an associative rule (the online softmax's
(max, sum) merge) first inside each thread over its 16-byte vector (``vec`` elements: a [BLOCK_N / vec,
vec] tile whose second axis never leaves the thread), then across lanes with one ``tl.reduce`` over the
pair; wide rows carry the per-thread running pair across their column blocks and reduce once after the
loop. So a row costs one barrier when ``num_warps > 1`` (every width above ``warp_size * vec *
vecs_per_thread`` columns: 512 bf16 on NVIDIA and RDNA, 1024 on CDNA) and none when one warp holds it
(the reduction is then warp-shuffles only). Rows are never split across warps for fewer barriers: a warp
per row at 4096-16384 columns would hold 128-512 fp32 values per lane (spills), and a row loop inside one
warp would read a wide row twice.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from wavefront.kernels._heuristics import elems_per_vector, next_pow2, warps_for
from wavefront.runtime import Arch


@dataclass(frozen=True)
class RowTable:
    """Per-family thresholds. Each carries its reason."""

    # Widest row held in registers. 16384 columns at 16 warps x 32 lanes (or 16 waves x 64 lanes) is 32
    # (16) fp32 values per thread per live row tensor: backward keeps x, dy, w and the dw accumulator live,
    # which stays under the 128-register cap that a 512-thread block imposes (65536 / 512) without spills.
    max_single_pass_cols: int
    # Block width when looping over a wider row.
    loop_block_cols: int
    # 16-byte vectors per thread per row tensor: 2 gives two independent 128-bit loads in flight per
    # thread without raising register pressure much.
    vecs_per_thread: int
    # Cap on num_warps (never above the architecture's max_num_warps).
    max_warps: int
    # Widest row an accumulating kernel (norm backward) holds in registers, its block width past that
    # (the block's accumulators stay in registers across rows), and its vectors per thread.
    accumulate_max_single_pass_cols: int
    accumulate_loop_block_cols: int
    accumulate_vecs_per_thread: int
    # Rows per program for single-pass kernels that hold a per-column vector across rows (the norms'
    # forward keeps w and b): several rows up to this width, one above it. Off (0) on every target: measured
    # with `wavefront inspect` (bf16, Triton 3.9) 4 rows per program at 4096 columns cost occupancy on sm_90
    # (RMSNorm 0.75 -> 0.625, LayerNorm 0.75 -> 0.5: 47 and 64 registers) and on gfx942 for LayerNorm (8 -> 6
    # waves), for w read once per 4 rows (traffic 1.49x -> 1.12x of the minimum, the excess from L2).
    multi_row_max_cols: int = 0
    rows_per_program: int = 4
    # Block width of kernels that keep per-lane running state across the blocks of a wide row (the
    # cross-entropy's online max and sum): two fp32 values per element of the block stay live, so a
    # narrower block than loop_block_cols keeps registers (and occupancy) where the block-reduction loop had
    # them. See ROW_TABLES.
    online_loop_block_cols: int = 4096
    # Norm forward: load w (and b) before the row's reductions instead of after (their latency overlaps the
    # reductions, at the price of w live across them). Norm backward (accumulating kernels): load row r + 1
    # while row r is reduced. Both measured with `wavefront inspect` (bf16, Triton 3.9, the bench widths):
    # weight-first lowered occupancy on sm_80/90/100 (RMSNorm 8192 columns 1.0 -> 0.75, LayerNorm 0.75 ->
    # 0.5) and gfx1100 (LayerNorm 16384: 1.0 -> 0.75), none on gfx90a/gfx942; prefetching lowered it on every
    # family (RMSNorm 4096: sm_90 0.5 -> 0.25, gfx942 8 -> 6 waves; gfx1100 at 8192 1.0 -> 0.75). So each is
    # on only where it cost nothing, until a GPU measurement says the trade pays.
    weight_first: bool = False
    prefetch_next_row: bool = False
    # Norm backward, single pass: software-pipeline stages of the persistent row loop
    # (``tl.range(..., num_stages=...)``). 3 on NVIDIA: Triton copies rows r + 1 and r + 2 into shared memory
    # with cp.async (LDGSTS) while row r is reduced (the wait before row r leaves row r + 1's copies in
    # flight: `DEPBAR.LE SB0, 0x3`), so registers barely move: sm_90 bf16, `wavefront inspect`, RMSNorm 4096
    # columns 60 -> 62 registers, 8192 columns 96 -> 119, occupancy unchanged (0.5, 0.25), shared memory
    # +16 KB and +48 KB per program. 2 stages give one buffer, whose refill is issued only after the row is
    # consumed: no overlap. 1 (no pipelining) on AMD: the pipeliner holds the next rows in VGPRs there
    # (gfx942 RMSNorm 4096: 62 -> 81 VGPRs, 8 -> 4 waves; 16384 spills 40 B). Unlike ``prefetch_next_row``
    # (the next row in registers), this costs no occupancy where it is on.
    bwd_row_stages: int = 1
    # Cross-entropy rows at least split_min_cols wide are split over several programs when the rows are too
    # few to give every SM/CU split_programs_per_sm programs (a 1-8 row eval or decode batch at a 128k-262k
    # vocabulary would otherwise run 1-8 programs on a 132-304 SM/CU GPU); each program covers at least
    # split_chunk_cols columns (4 blocks of the online loop), so the partial statistics (16 B per program)
    # and the combine stay ~0.01% of the row's bytes. No GPU timing chose these yet: the numbers keep the
    # split off wherever the grid is already full.
    split_min_cols: int = 65536
    split_chunk_cols: int = 16384
    split_programs_per_sm: int = 2


# Accumulating kernels, measured with `wavefront inspect` (bf16, Triton 3.9): one 16-byte vector per thread
# cuts the norm backward from 96-113 to 60-87 registers per thread at 4096 columns on sm_90 (occupancy 25% ->
# 50% for RMSNorm) and from 94 to 62 VGPRs on gfx942 (5 -> 8 waves/SIMD). On NVIDIA a 16384-column row does
# not fit: 16 warps need 128+ registers and spill 184-784 B/thread (sm_80/90/100), 32 warps are capped at 64
# registers and spill too; so rows over 8192 columns take the two-phase path there. AMD's 512-VGPR (CDNA) and
# 1536-VGPR (RDNA3 wave32) files hold 16384 columns without spills (92-122 VGPRs on gfx942).
ROW_TABLES: dict[str, RowTable] = {
    "nvidia": RowTable(max_single_pass_cols=16384, loop_block_cols=8192, vecs_per_thread=2, max_warps=16,
                       accumulate_max_single_pass_cols=8192, accumulate_loop_block_cols=4096,
                       accumulate_vecs_per_thread=1, bwd_row_stages=3),
    # 64-lane wavefronts: a block holds at most 16 waves (1024 threads), so the same widths give each lane
    # half the elements of the NVIDIA case.
    "amd-cdna": RowTable(max_single_pass_cols=16384, loop_block_cols=8192, vecs_per_thread=2, max_warps=16,
                         accumulate_max_single_pass_cols=16384, accumulate_loop_block_cols=4096,
                         accumulate_vecs_per_thread=1, weight_first=True),
    # RDNA wave32: 32 lanes like NVIDIA, 1024 threads per block.
    "amd-rdna": RowTable(max_single_pass_cols=16384, loop_block_cols=8192, vecs_per_thread=2, max_warps=16,
                         accumulate_max_single_pass_cols=16384, accumulate_loop_block_cols=4096,
                         accumulate_vecs_per_thread=1),
    # The interpreter: same shape as NVIDIA so CPU tests exercise the configurations GPUs run; rows split
    # from 16385 columns (chunks of two 4096-column blocks) so the small test shapes exercise the split.
    "cpu": RowTable(max_single_pass_cols=16384, loop_block_cols=8192, vecs_per_thread=2, max_warps=16,
                    accumulate_max_single_pass_cols=8192, accumulate_loop_block_cols=4096,
                    accumulate_vecs_per_thread=1, split_min_cols=16385, split_chunk_cols=8192, bwd_row_stages=3),
}


@dataclass(frozen=True)
class RowConfig:
    BLOCK_N: int
    num_warps: int
    single_pass: bool
    rows_per_program: int = 1
    weight_first: bool = False
    prefetch: bool = False
    # Software-pipeline stages of an accumulating kernel's row loop (RowTable.bwd_row_stages); 1 elsewhere.
    row_stages: int = 1
    # Elements per 16-byte vector (capped at BLOCK_N): the width of the per-thread group whose statistics
    # are combined before any lane exchange (see "Barriers" above).
    vec: int = 1

    def options(self) -> dict:
        return {"num_warps": self.num_warps, "num_stages": 1}


def row_config(n_cols: int, dtype: torch.dtype, arch: Arch, *, accumulate: bool = False,
               multi_row: bool = False, online: bool = False) -> RowConfig:
    """Pure function of (row width, element dtype, architecture, whether the kernel accumulates across rows,
    whether it can run several rows per program)."""
    if n_cols < 1:
        raise ValueError(f"n_cols must be >= 1, got {n_cols}")
    table = ROW_TABLES[arch.family]
    limit = table.accumulate_max_single_pass_cols if accumulate else table.max_single_pass_cols
    vecs = table.accumulate_vecs_per_thread if accumulate else table.vecs_per_thread
    single_pass = n_cols <= limit
    loop_block = table.accumulate_loop_block_cols if accumulate else table.loop_block_cols
    if online and not single_pass:
        # Same threads as the plain loop, half the elements each: one 16-byte vector per lane per block.
        loop_block, vecs = table.online_loop_block_cols, 1
    block_n = next_pow2(n_cols) if single_pass else loop_block
    num_warps = warps_for(block_n, dtype, arch, vecs_per_lane=vecs, max_warps=table.max_warps)
    rows = table.rows_per_program if multi_row and single_pass and n_cols <= table.multi_row_max_cols else 1
    return RowConfig(BLOCK_N=block_n, num_warps=num_warps, single_pass=single_pass, rows_per_program=rows,
                     weight_first=table.weight_first and not accumulate,
                     prefetch=table.prefetch_next_row and accumulate and single_pass,
                     row_stages=table.bwd_row_stages if accumulate and single_pass else 1,
                     vec=min(elems_per_vector(dtype), block_n))


def row_splits(n_rows: int, n_cols: int, block_n: int, arch: Arch, n_sms: int) -> tuple[int, int]:
    """(programs per row, columns per program, a multiple of block_n) for a row-wise kernel that can split a
    long row (cross-entropy): one program per row unless the rows are long and too few to fill the GPU."""
    table = ROW_TABLES[arch.family]
    want = -(-n_sms * table.split_programs_per_sm // max(n_rows, 1))
    splits = min(want, -(-n_cols // table.split_chunk_cols)) if n_cols >= table.split_min_cols else 1
    if splits <= 1:
        return 1, n_cols
    chunk = -(-n_cols // splits)
    chunk = -(-chunk // block_n) * block_n
    return -(-n_cols // chunk), chunk
