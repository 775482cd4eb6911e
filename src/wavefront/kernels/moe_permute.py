"""Mixture-of-experts permutation: token rows to expert-contiguous groups and back, with no host sync and
no float atomics (every output element is written by exactly one program: deterministic).

The T*k assignments a = t*k + j (token t, slot j, expert indices[t, j]) get one row each of x_sorted, in
the group of their expert; groups start at ``starts[e]`` (end offsets padded to a multiple of pad_to,
computed by the op from the counts) and keep assignment order inside (stable):

    row_map[a] = starts[e] + #{a' < a : indices_flat[a'] = e}          _moe_row_map_kernel, one program per
                                                                       expert, a running count over blocks
    dst[row_map[a]] = src[a // k] (* w[a])                             _moe_scatter_rows_kernel
    out[t] = sum_j (w[t, j] *) src[row_map[t*k + j]]                   _moe_gather_rows_kernel

    permute:      x_sorted = scatter(x);                 backward dx = gather(dx_sorted) (no weights)
    unpermute:    out = gather(y_sorted, w);             backward dy_sorted = scatter(dout, w) and
                  dw[a] = <dout[a // k], y_sorted[row_map[a]]>, fused into the same scatter pass.

Traffic, H-wide rows of b bytes per element: the row map reads T*k int64 indices once per expert (E * 8Tk B;
integer work, small next to the rows) and writes 8Tk B; each scatter or gather moves T*k rows once each
way: permute 2TkHb, unpermute (k + 1)THb, its backward 2TkHb + TkHb (the dot products re-read y_sorted).
Pure data movement: bandwidth bound. Accumulation (gather, dot products) is fp32, rounded once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from wavefront import runtime
from wavefront.kernels._heuristics import acc_dtype, next_pow2, warps_for
from wavefront.kernels._launch import launch
from wavefront.kernels._tables import FamilyTable, SingleStage
from wavefront.runtime import Arch


@dataclass(frozen=True)
class PermuteTable:
    # Assignments per step of the row-map scan: 1024 int64 indices (8 KiB) per load, a prefix sum per block.
    block_assign: int
    # Tile cap in elements (rows x columns): 4096 16-bit values = 8 KiB per load, two 16-byte vectors per
    # lane at 8 warps. Rows of 4096 or more get one program per row (chunks of 4096); narrower rows are
    # packed several to a program so that a program still moves a whole tile.
    max_tile: int
    max_rows: int
    vecs_per_thread: int
    max_warps: int


PERMUTE_TABLES: FamilyTable[PermuteTable] = FamilyTable(
    PermuteTable(block_assign=1024, max_tile=4096, max_rows=64, vecs_per_thread=2, max_warps=8),
    "one row on every family: pure data movement sized by bytes per load (the fields' comments); no family "
    "measured a reason to differ",
)


@dataclass(frozen=True)
class PermuteConfig(SingleStage):
    BLOCK_A: int
    BLOCK_R: int
    BLOCK_H: int
    num_warps: int


def moe_permute_config(hidden: int, dtype: torch.dtype, arch: Arch) -> PermuteConfig:
    """Pure function of (row width, dtype, architecture): BLOCK_R rows x BLOCK_H columns per program."""
    if hidden < 1:
        raise ValueError(f"hidden must be >= 1, got {hidden}")
    table = PERMUTE_TABLES[arch.family]
    block_h = min(next_pow2(hidden), table.max_tile)
    block_r = max(1, min(table.max_rows, table.max_tile // block_h))
    warps = warps_for(block_r * block_h, dtype, arch, vecs_per_lane=table.vecs_per_thread, max_warps=table.max_warps)
    return PermuteConfig(BLOCK_A=table.block_assign, BLOCK_R=block_r, BLOCK_H=block_h, num_warps=warps)


@triton.jit
def _moe_row_map_kernel(indices_ptr, starts_ptr, counts_ptr, row_map_ptr, n_assign, n_rows,
                        BLOCK_A: tl.constexpr):
    e = tl.program_id(0)
    start = tl.load(starts_ptr + e).to(tl.int64)
    # Expert e's group holds rows [start, start + counts[e]) and no row at or past n_rows, whatever counts
    # says: an assignment past its group's capacity keeps row_map -1 (dropped), so no row is written twice
    # or outside x_sorted. starts come from the counts clamped at 0 (non-decreasing).
    cap = tl.minimum(tl.maximum(tl.load(counts_ptr + e).to(tl.int64), 0), tl.maximum(n_rows - start, 0))
    carry = start * 0
    for off in range(0, n_assign, BLOCK_A):
        a = off + tl.arange(0, BLOCK_A)
        ok = a < n_assign
        hit = (tl.load(indices_ptr + a, mask=ok, other=-1) == e) & ok
        rank = carry + tl.cumsum(hit.to(tl.int32), axis=0) - 1  # the first hit has rank 0
        tl.store(row_map_ptr + a, start + rank, mask=hit & (rank < cap))
        carry += tl.sum(hit.to(tl.int64), axis=0)


@triton.jit
def _moe_scatter_rows_kernel(src_ptr, dst_ptr, row_map_ptr, w_ptr, y_ptr, dw_ptr, n_assign, n_dst_rows, hidden,
                             top_k, stride_src_row, stride_dst_row, stride_y_row,
                             HAS_W: tl.constexpr, COMPUTE_DW: tl.constexpr, BLOCK_R: tl.constexpr,
                             BLOCK_H: tl.constexpr, ACC: tl.constexpr):
    a = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    a_ok = a < n_assign
    t = a // top_k
    r = tl.load(row_map_ptr + a, mask=a_ok, other=-1).to(tl.int64)
    # A row map entry outside [0, n_dst_rows) (-1: a dropped assignment) writes and reads no row of dst / y
    # (the src row is in bounds either way) and gets dw 0.
    r_ok = a_ok & (r >= 0) & (r < n_dst_rows)
    if HAS_W:
        w = tl.load(w_ptr + a, mask=a_ok, other=0.0).to(ACC)
    dw = tl.zeros((BLOCK_R, BLOCK_H), dtype=ACC)
    for h0 in range(0, hidden, BLOCK_H):
        h = h0 + tl.arange(0, BLOCK_H)
        ok = a_ok[:, None] & (h < hidden)[None, :]
        v = tl.load(src_ptr + t[:, None] * stride_src_row + h[None, :], mask=ok, other=0.0).to(ACC)
        out = v
        if HAS_W:
            out = v * w[:, None]
        row_ok = r_ok[:, None] & (h < hidden)[None, :]
        tl.store(dst_ptr + r[:, None] * stride_dst_row + h[None, :], out.to(dst_ptr.dtype.element_ty), mask=row_ok)
        if COMPUTE_DW:
            dw += v * tl.load(y_ptr + r[:, None] * stride_y_row + h[None, :], mask=row_ok, other=0.0).to(ACC)
    if COMPUTE_DW:
        # A select, not the masked sum: v * 0 is NaN for a NaN row of src.
        tl.store(dw_ptr + a, tl.where(r_ok, tl.sum(dw, axis=1), 0.0).to(dw_ptr.dtype.element_ty), mask=a_ok)


@triton.jit
def _moe_gather_rows_kernel(src_ptr, out_ptr, row_map_ptr, w_ptr, n_tokens, n_src_rows, hidden, top_k,
                            stride_src_row, stride_out_row, HAS_W: tl.constexpr, BLOCK_R: tl.constexpr,
                            BLOCK_H: tl.constexpr, ACC: tl.constexpr):
    t = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    t_ok = t < n_tokens
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    acc = tl.zeros((BLOCK_R, BLOCK_H), dtype=ACC)
    for j in range(0, top_k):
        a = t * top_k + j
        r = tl.load(row_map_ptr + a, mask=t_ok, other=-1).to(tl.int64)
        # A row map entry outside [0, n_src_rows) (-1: a dropped assignment) adds exactly 0, even with a NaN
        # weight: its row loads as 0 and its weight is 0.
        r_ok = t_ok & (r >= 0) & (r < n_src_rows)
        ok = r_ok[:, None] & (h < hidden)[None, :]
        v = tl.load(src_ptr + r[:, None] * stride_src_row + h[None, :], mask=ok, other=0.0).to(ACC)
        if HAS_W:
            # A dropped one's weight is 0 (a select on the row vector: its row already loaded as 0).
            v = v * tl.where(r_ok, tl.load(w_ptr + a, mask=t_ok, other=0.0).to(ACC), 0.0)[:, None]
        acc += v
    ok = t_ok[:, None] & (h < hidden)[None, :]
    tl.store(out_ptr + t[:, None] * stride_out_row + h[None, :], acc.to(out_ptr.dtype.element_ty), mask=ok)


def moe_row_map(indices_flat: torch.Tensor, starts: torch.Tensor, counts: torch.Tensor, n_rows: int) -> torch.Tensor:
    """indices_flat (T*k,) int64, starts (E,) int64, counts (E,) -> row_map (T*k,) int64; -1 where the assignment
    is dropped (its index outside [0, E), or past its group's counts[e] rows or the n_rows of x_sorted)."""
    row_map = torch.full_like(indices_flat, -1)
    cfg = moe_permute_config(1, torch.int64, runtime.arch(indices_flat.device))
    launch(_moe_row_map_kernel, (starts.shape[0],), indices_ptr=indices_flat, starts_ptr=starts, counts_ptr=counts,
           row_map_ptr=row_map, n_assign=indices_flat.numel(), n_rows=n_rows, constexprs=dict(BLOCK_A=cfg.BLOCK_A),
           # Integer prefix sums over 1024 indices: 4 warps give each lane 8 values.
           options={"num_warps": runtime.clamp_num_warps(4, runtime.arch(indices_flat.device)), "num_stages": 1})
    return row_map


def moe_scatter_rows(src: torch.Tensor, row_map: torch.Tensor, n_rows: int, top_k: int,
                     weights: torch.Tensor | None = None, y: torch.Tensor | None = None,
                     zero_fill: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """dst[row_map[a]] = src[a // top_k] (* weights[a]); with y, also dw[a] = <src[a // top_k], y[row_map[a]]>.
    Entries of row_map outside [0, n_rows) (-1: dropped) write nothing and get dw 0.
    zero_fill: dst has rows no assignment writes (group padding), allocated as zeros."""
    hidden = src.shape[1]
    alloc = torch.zeros if zero_fill else torch.empty
    dst = alloc((n_rows, hidden), dtype=src.dtype, device=src.device)
    dw = None if y is None else torch.empty(row_map.shape, dtype=weights.dtype, device=src.device)
    if row_map.numel() == 0 or hidden == 0:
        return dst, (dw.zero_() if dw is not None else None)
    cfg = moe_permute_config(hidden, src.dtype, runtime.arch(src.device))
    launch(_moe_scatter_rows_kernel, (triton.cdiv(row_map.numel(), cfg.BLOCK_R),), src_ptr=src, dst_ptr=dst,
           row_map_ptr=row_map, w_ptr=weights, y_ptr=y, dw_ptr=dw, n_assign=row_map.numel(), n_dst_rows=n_rows,
           hidden=hidden,
           top_k=top_k, stride_src_row=src.stride(0), stride_dst_row=dst.stride(0),
           stride_y_row=0 if y is None else y.stride(0),
           constexprs=dict(HAS_W=weights is not None, COMPUTE_DW=y is not None, BLOCK_R=cfg.BLOCK_R,
                           BLOCK_H=cfg.BLOCK_H, ACC=acc_dtype(src.dtype)),
           options=cfg.options())
    return dst, dw


def moe_gather_rows(src: torch.Tensor, row_map: torch.Tensor, n_tokens: int, top_k: int,
                    weights: torch.Tensor | None = None) -> torch.Tensor:
    """out[t] = sum_j (weights[t*k+j] *) src[row_map[t*k+j]], fp32 accumulation, one rounding; entries of
    row_map outside [0, src rows) (-1: dropped) add 0."""
    hidden = src.shape[1]
    out = torch.empty((n_tokens, hidden), dtype=src.dtype, device=src.device)
    if out.numel() == 0:
        return out
    if top_k == 0:
        return out.zero_()
    cfg = moe_permute_config(hidden, src.dtype, runtime.arch(src.device))
    launch(_moe_gather_rows_kernel, (triton.cdiv(n_tokens, cfg.BLOCK_R), triton.cdiv(hidden, cfg.BLOCK_H)),
           src_ptr=src, out_ptr=out, row_map_ptr=row_map, w_ptr=weights, n_tokens=n_tokens, n_src_rows=src.shape[0],
           hidden=hidden,
           top_k=top_k, stride_src_row=src.stride(0), stride_out_row=out.stride(0),
           constexprs=dict(HAS_W=weights is not None, BLOCK_R=cfg.BLOCK_R, BLOCK_H=cfg.BLOCK_H,
                           ACC=acc_dtype(src.dtype)),
           options=cfg.options())
    return out
