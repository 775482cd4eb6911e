"""Attention helpers shared by the forward (attention_fwd) and backward (attention_bwd) kernels: tile
loads and stores, sequence bounds of packed input, causal key bounds and masks, program order, and the
launchers' layout, TMA-eligibility and transposed-copy rules. The math and the layouts are in kernels/attention.py.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from wavefront import runtime
from wavefront.kernels.attention_config import AttentionConfig, has_tma
from wavefront.kernels.quantize import EPS

LOG2E = 1.4426950408889634
_FP8_EPS = tl.constexpr(EPS)  # the FP8 scale's amax floor, kernels/quantize.py's (a global read inside @jit)


@triton.jit
def _load_tile(base, rows, stride_row, cols, n_rows, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
               CHECK_ROWS: tl.constexpr):
    """A [rows, BLOCK_D] tile; rows past n_rows and padded head-dim columns read as zero."""
    ptrs = base + rows[:, None].to(tl.int64) * stride_row + cols[None, :]
    if CHECK_ROWS:
        if HEAD_DIM == BLOCK_D:
            tile = tl.load(ptrs, mask=rows[:, None] < n_rows, other=0.0)
        else:
            tile = tl.load(ptrs, mask=(rows[:, None] < n_rows) & (cols[None, :] < HEAD_DIM), other=0.0)
    else:
        if HEAD_DIM == BLOCK_D:
            tile = tl.load(ptrs)
        else:
            tile = tl.load(ptrs, mask=cols[None, :] < HEAD_DIM, other=0.0)
    return tile


@triton.jit
def _store_tile(base, rows, stride_row, cols, n_rows, tile, HEAD_DIM: tl.constexpr):
    ptrs = base + rows[:, None].to(tl.int64) * stride_row + cols[None, :]
    tl.store(ptrs, tile.to(base.dtype.element_ty), mask=(rows[:, None] < n_rows) & (cols[None, :] < HEAD_DIM))


@triton.jit
def _scores_by_chunks(a_base, a_rows, stride_a, b_base, b_rows, stride_b, seqlen, HEAD_DIM: tl.constexpr,
                      BLOCK_D: tl.constexpr, D_CHUNK: tl.constexpr, B_CHECK: tl.constexpr):
    """A B^T for two row tiles read from memory D_CHUNK head-dim columns at a time (RDNA3: no full-width
    operand stays live across the loop; chunks wholly in the padding past HEAD_DIM are skipped). A is the
    tile the program keeps for its whole loop (Q forward and dQ, K and V in dK/dV): its chunk loads are
    volatile because they are loop-invariant, and LLVM would otherwise hoist them out of the loop, holding
    every chunk at once (as many registers as the full-width tile: the spills came back). On AMD the volatile
    flag only pins the load in place: the buffer loads keep their cache policy (no glc/dlc bits)."""
    acc = tl.zeros((a_rows.shape[0], b_rows.shape[0]), tl.float32)
    for c in tl.static_range(0, BLOCK_D, D_CHUNK):
        if c < HEAD_DIM:
            cols = c + tl.arange(0, D_CHUNK)
            a = tl.load(a_base + a_rows[:, None].to(tl.int64) * stride_a + cols[None, :],
                        mask=(a_rows[:, None] < seqlen) & (cols[None, :] < HEAD_DIM), other=0.0, volatile=True)
            b = _load_tile(b_base, b_rows, stride_b, cols, seqlen, HEAD_DIM, BLOCK_D, B_CHECK)
            acc = tl.dot(a, tl.trans(b), acc, input_precision="ieee")
    return acc


@triton.jit
def _sequence(cu_seqlens_ptr, b, seqlen, VARLEN: tl.constexpr):
    """(first row in memory, length, batch index in memory) of sequence b."""
    if VARLEN:
        start = tl.load(cu_seqlens_ptr + b).to(tl.int64)
        length = (tl.load(cu_seqlens_ptr + b + 1).to(tl.int64) - start).to(tl.int32)
        b_mem = b * 0
    else:
        start = (b * 0).to(tl.int64)
        length = seqlen
        b_mem = b
    return start, length, b_mem.to(tl.int64)


@triton.jit
def _key_bounds(start_m, seqlen, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, IS_CAUSAL: tl.constexpr):
    """Key range of a query tile: [0, full_end) needs no mask, [full_end, hi) does."""
    if IS_CAUSAL:
        hi = tl.minimum(start_m + BLOCK_M, seqlen)
        full_end = tl.minimum(start_m + 1, seqlen) // BLOCK_N * BLOCK_N
    else:
        hi = seqlen
        full_end = seqlen // BLOCK_N * BLOCK_N
    return full_end, hi


@triton.jit
def _tile_base(ptr, b_mem, head, seq_start, stride_b, stride_h, stride_s):
    """Address of row 0 of one (batch, head) sequence: the start of its tiles."""
    return ptr + b_mem * stride_b + head * stride_h + seq_start * stride_s


@triton.jit
def _valid_keys(offs_m, offs_n, seqlen, IS_CAUSAL: tl.constexpr):
    """[BLOCK_M, BLOCK_N] mask of the keys a query block may see: inside the sequence, and at or before
    the query when causal."""
    valid = offs_n[None, :] < seqlen
    if IS_CAUSAL:
        valid = valid & (offs_m[:, None] >= offs_n[None, :])
    return valid


@triton.jit
def _query_block(pid, n_m_blocks, n_heads, IS_CAUSAL: tl.constexpr):
    """(batch, head, query block) of a forward or dQ program. Causal grids run the longest
    query blocks (the last ones, which see the most keys) first, so the tail of the launch is short."""
    bh = pid // n_m_blocks
    m_block = pid % n_m_blocks
    if IS_CAUSAL:
        m_block = n_m_blocks - 1 - m_block
    return bh // n_heads, bh % n_heads, m_block




# ---------------------------------------------------------------------------------------------------
# Launchers. q: [B, H, S, D], k/v: [B, H_kv, S, D], each with unit stride along D (the op layer
# guarantees it). Varlen: B == 1 and cu_seqlens [n_seqs + 1] (int32 or int64) on q's device.


def _layout(q: torch.Tensor, cu_seqlens: torch.Tensor | None, max_seqlen: int):
    """(batch programs, seqlen used by the dense path, longest sequence) for the grid."""
    if cu_seqlens is None:
        return q.shape[0], q.shape[2], q.shape[2]
    return cu_seqlens.numel() - 1, 0, max_seqlen


def _strides3(t: torch.Tensor) -> tuple[int, int, int]:
    return t.stride(0), t.stride(1), t.stride(2)


def _tma_ready(*tensors: torch.Tensor) -> bool:
    """Whether every tensor meets the TMA descriptor's rules: 16-byte aligned base, unit last stride, and
    every other stride a multiple of 16 bytes (so each (batch, head, sequence start) base stays aligned)."""
    for t in tensors:
        size = t.element_size()
        if t.data_ptr() % 16 or t.stride(-1) != 1 or any(s * size % 16 for s in t.stride()[:-1]):
            return False
    return True


def _use_tma(arch: runtime.Arch, *tensors: torch.Tensor) -> bool:
    """TMA on sm_90 and later, and under the interpreter (which runs tensor descriptors, so the tests cover
    this path); pointer loads on sm_80, AMD, and for tensors TMA cannot address."""
    return (arch.family == "cpu" or has_tma(arch)) and _tma_ready(*tensors)


def _d_chunk(cfg: AttentionConfig, block_d: int) -> int:
    """The head-dim columns per chunk of the score products; block_d (no chunking) unless the entry sets d_chunk."""
    return min(cfg.d_chunk, block_d) if cfg.d_chunk else block_d


def _transposed(t: torch.Tensor) -> torch.Tensor:
    """[B, H, S, D] -> a [B, H, D, S] copy, sequence contiguous (one extra read and write of t)."""
    return t.transpose(2, 3).contiguous()


def _transposed_strides(t: torch.Tensor | None) -> dict:
    if t is None:
        return {"stride_tb": 0, "stride_th": 0, "stride_t": 0}
    return {"stride_tb": t.stride(0), "stride_th": t.stride(1), "stride_t": t.stride(2)}

