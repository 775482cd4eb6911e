"""Rotary position embedding (Hugging Face's rotate_half convention), q and k in one launch.

For each token, head and rotary pair j < R/2 (R = rotary_dim <= head_dim D, x1 = x[j], x2 = x[j + R/2]):

    y[j]       = x1 cos[j]       - x2 sin[j]
    y[j + R/2] = x2 cos[j + R/2] + x1 sin[j + R/2]
    y[R:]      = x[R:]                                   (partial rotary: the tail passes through)

which is HF's ``x * cos + rotate_half(x) * sin`` on the first R dims, with cos/sin as their rotary
embedding makes them (``cat(freqs, freqs)``, so both halves of a row are equal, but the kernel reads each
half where HF does). The backward is the transpose, a rotation by the negated angle: the same kernel
with the sin halves swapped and negated (BACKWARD), applied to dy:

    dx[j] = dy1 cos[j] + dy2 sin[j + R/2],   dx[j + R/2] = dy2 cos[j + R/2] - dy1 sin[j]

Nothing is saved for the backward but cos/sin (inputs). Products and the sum are fp32 (fp64 for fp64), rounded once
(HF rounds each product and the sum in the input dtype).

Positions (POS_MODE): 0 cos/sin rows given per token ([batch, seq, R] or [seq, R], any strides); 1 a
table [max_pos, R] indexed by position_ids; 2 packed sequences: the position of token t is
t - cu_seqlens[i] for the sequence i that contains t (searched in-kernel over cu_seqlens, no host
work). A position outside the table never addresses memory: its token's outputs are NaN.

One program per token handles every q head and every k head: the token's cos/sin row is read once and
reused for all heads. Tiles are [heads, R/2]; with R/2 = 64 a head-half is 128 contiguous bytes in bf16,
so each thread moves 16-byte vectors (``ld.global.v4`` / ``global_load_dwordx4``) when the head stride is
a multiple of 8 elements. Traffic per token, 16-bit: read and write (Hq + Hk) D values (4 (Hq + Hk) D B)
plus 2R cos/sin values; ~6 FLOP per rotated pair: intensity < 1, memory bound.

Offsets: batch, sequence and head indices are int64 before multiplying strides.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from wavefront import runtime
from wavefront.kernels._heuristics import acc_dtype, elems_per_vector, next_pow2
from wavefront.kernels._launch import launch
from wavefront.kernels._tables import FamilyTable, SingleStage
from wavefront.runtime import Arch

POS_DIRECT, POS_IDS, POS_CU_SEQLENS = 0, 1, 2


@dataclass(frozen=True)
class RopeTable:
    # Upper bound on warps per program (one program per token).
    max_warps: int
    # Most q values one thread holds per half tile: 32 fp32 values for x1 and as many for x2 plus the
    # outputs keep a thread near 128 registers (measured: 125 on sm_90, 120 VGPRs on gfx942 for Llama 3
    # 8B's 32/8 heads at 2 warps / 1 wave, no spills); 128 q heads (405B) therefore get 8 warps.
    max_q_per_thread: int


ROPE_TABLES: FamilyTable[RopeTable] = FamilyTable(
    RopeTable(max_warps=8, max_q_per_thread=32),
    "one row on every family: 32 q values per thread measured 125 registers on sm_90 and 120 VGPRs on gfx942, "
    "no spills (the fields' comments)",
)


@dataclass(frozen=True)
class RopeConfig(SingleStage):
    BLOCK_HQ: int
    BLOCK_HK: int
    BLOCK_HALF: int
    BLOCK_PASS: int
    num_warps: int


def rope_config(n_q_heads: int, n_k_heads: int, head_dim: int, rotary_dim: int, dtype: torch.dtype,
                arch: Arch) -> RopeConfig:
    """Pure function of the head geometry, dtype and architecture."""
    if rotary_dim < 2 or rotary_dim % 2 or rotary_dim > head_dim:
        raise ValueError(f"rotary_dim must be even and in [2, head_dim={head_dim}], got {rotary_dim}")
    table = ROPE_TABLES[arch.family]
    half = rotary_dim // 2
    block_half = next_pow2(half)
    per_vector = elems_per_vector(dtype)
    block_hq = next_pow2(n_q_heads)
    block_hk = next_pow2(max(n_k_heads, 1))
    # Size the block to the smaller (k, with GQA) tile so each of its threads still holds a whole 16-byte
    # vector; the q tile then gives each thread several vectors instead of k's threads idling on 4 bytes.
    smallest = min(block_hq, block_hk) if n_k_heads else block_hq
    threads = max(1, smallest * block_half // per_vector, block_hq * block_half // table.max_q_per_thread)
    warps = min(next_pow2(max(1, threads // arch.warp_size)), table.max_warps, arch.max_num_warps)
    return RopeConfig(BLOCK_HQ=block_hq, BLOCK_HK=block_hk, BLOCK_HALF=block_half,
                      BLOCK_PASS=next_pow2(max(head_dim - rotary_dim, 1)), num_warps=warps)


@triton.jit
def _rotate_heads(x_row, out_row, stride_h, stride_out_h, n_heads, c1, c2, s1, s2,
                  HALF: tl.constexpr, PASS: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr,
                  BLOCK_PASS: tl.constexpr):
    OUT = out_row.dtype.element_ty
    # int64 heads: h * stride_h passes 2^31 when one batch entry of a [B, H, S, D] tensor holds 2^31+ elements.
    h = tl.arange(0, BLOCK_H).to(tl.int64)[:, None]
    d = tl.arange(0, BLOCK_HALF)[None, :]
    mask = (h < n_heads) & (d < HALF)
    x_ptr = x_row + h * stride_h + d
    o_ptr = out_row + h * stride_out_h + d
    x1 = tl.load(x_ptr, mask=mask, other=0.0).to(c1.dtype)
    x2 = tl.load(x_ptr + HALF, mask=mask, other=0.0).to(c1.dtype)
    tl.store(o_ptr, (x1 * c1 - x2 * s1).to(OUT), mask=mask)
    tl.store(o_ptr + HALF, (x2 * c2 + x1 * s2).to(OUT), mask=mask)
    if PASS > 0:
        p = tl.arange(0, BLOCK_PASS)[None, :]
        pmask = (h < n_heads) & (p < PASS)
        tail = tl.load(x_row + h * stride_h + 2 * HALF + p, mask=pmask, other=0.0)
        tl.store(out_row + h * stride_out_h + 2 * HALF + p, tail, mask=pmask)


@triton.jit
def _rope_kernel(
    q_ptr, k_ptr, q_out_ptr, k_out_ptr, cos_ptr, sin_ptr, pos_ptr, cu_ptr,
    seq_len, n_q_heads, n_k_heads, n_pos, n_seqs,
    stride_q_b, stride_q_s, stride_q_h, stride_k_b, stride_k_s, stride_k_h,
    stride_qo_b, stride_qo_s, stride_qo_h, stride_ko_b, stride_ko_s, stride_ko_h,
    stride_cos_b, stride_cos_s, stride_sin_b, stride_sin_s, stride_pos_b, stride_pos_s,
    POS_MODE: tl.constexpr, HAS_K: tl.constexpr, BACKWARD: tl.constexpr, HALF: tl.constexpr, PASS: tl.constexpr,
    BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_PASS: tl.constexpr,
    BLOCK_SEQS: tl.constexpr, ACC: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    b = pid // seq_len
    s = pid % seq_len
    poison = 0.0
    if POS_MODE == 0:
        cos_row = cos_ptr + b * stride_cos_b + s * stride_cos_s
        sin_row = sin_ptr + b * stride_sin_b + s * stride_sin_s
    else:
        if POS_MODE == 1:
            pos = tl.load(pos_ptr + b * stride_pos_b + s * stride_pos_s).to(tl.int64)
        else:
            i = tl.arange(0, BLOCK_SEQS)
            # Masked lanes read as 0 = cu_seqlens[0]: they never raise the start above the true one.
            cu = tl.load(cu_ptr + i, mask=i <= n_seqs, other=0).to(tl.int64)
            pos = s - tl.max(tl.where(cu <= s, cu, 0), axis=0)
        ok = (pos >= 0) & (pos < n_pos)
        poison = tl.where(ok, 0.0, float("nan"))
        pos = tl.where(ok, pos, 0)
        cos_row = cos_ptr + pos * stride_cos_s
        sin_row = sin_ptr + pos * stride_sin_s
    d = tl.arange(0, BLOCK_HALF)[None, :]
    dmask = d < HALF
    c1 = tl.load(cos_row + d, mask=dmask, other=0.0).to(ACC) + poison
    c2 = tl.load(cos_row + HALF + d, mask=dmask, other=0.0).to(ACC) + poison
    s1 = tl.load(sin_row + d, mask=dmask, other=0.0).to(ACC)
    s2 = tl.load(sin_row + HALF + d, mask=dmask, other=0.0).to(ACC)
    if BACKWARD:
        # The transpose of the rotation: swap the sin halves and negate them.
        s1, s2 = -s2, -s1
    _rotate_heads(q_ptr + b * stride_q_b + s * stride_q_s, q_out_ptr + b * stride_qo_b + s * stride_qo_s,
                  stride_q_h, stride_qo_h, n_q_heads, c1, c2, s1, s2, HALF, PASS, BLOCK_HQ, BLOCK_HALF, BLOCK_PASS)
    if HAS_K:
        _rotate_heads(k_ptr + b * stride_k_b + s * stride_k_s, k_out_ptr + b * stride_ko_b + s * stride_ko_s,
                      stride_k_h, stride_ko_h, n_k_heads, c1, c2, s1, s2, HALF, PASS, BLOCK_HK, BLOCK_HALF,
                      BLOCK_PASS)


def _bsh_strides(x: torch.Tensor) -> tuple[int, int, int]:
    """(batch, seq, head) strides of [B, H, S, D] (HF) or [T, H, D] (packed: batch stride 0)."""
    if x.dim() == 4:
        return x.stride(0), x.stride(2), x.stride(1)
    return 0, x.stride(0), x.stride(1)


def rope(q: torch.Tensor, k: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor, pos_mode: int,
         positions: torch.Tensor | None, backward: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Rotate q (and k). q, k: [B, H, S, D] or [T, H, D] with unit last stride; outputs keep their strides.

    pos_mode POS_DIRECT: cos/sin [B or 1, S, R] or [S, R] ([T, R] packed). POS_IDS: cos/sin tables [P, R],
    positions = position_ids [B or 1, S] or [S] ([T] packed). POS_CU_SEQLENS: tables [P, R], positions =
    cu_seqlens [n_seqs + 1] (packed only).
    """
    q_out = torch.empty_like(q)
    k_out = torch.empty_like(k) if k is not None else None
    if q.dim() == 4:
        n_batch, seq_len, n_q_heads, head_dim = q.shape[0], q.shape[2], q.shape[1], q.shape[3]
    else:
        n_batch, seq_len, n_q_heads, head_dim = 1, q.shape[0], q.shape[1], q.shape[2]
    n_k_heads = k.shape[1] if k is not None else 0
    rotary_dim = cos.shape[-1]
    if q.numel() == 0:
        return q_out, k_out
    cfg = rope_config(n_q_heads, n_k_heads, head_dim, rotary_dim, q.dtype, runtime.arch(q.device))

    def rows(t: torch.Tensor) -> tuple[int, int]:
        # (batch, seq) strides of cos/sin rows or of position_ids: [B or 1, S, ...] or [S, ...]; a batch
        # dim of 1 broadcasts (stride 0).
        per_token_dims = 2 if t is cos or t is sin else 1
        if t.dim() == per_token_dims:
            return 0, t.stride(0)
        return (t.stride(0) if t.shape[0] > 1 else 0), t.stride(1)

    stride_pos_b, stride_pos_s = rows(positions) if pos_mode == POS_IDS else (0, 0)
    n_seqs = positions.numel() - 1 if pos_mode == POS_CU_SEQLENS else 0
    ko = k_out if k is not None else q_out
    (sq_b, sq_s, sq_h), (sk_b, sk_s, sk_h) = _bsh_strides(q), _bsh_strides(k if k is not None else q)
    (sqo_b, sqo_s, sqo_h), (sko_b, sko_s, sko_h) = _bsh_strides(q_out), _bsh_strides(ko)
    (scos_b, scos_s), (ssin_b, ssin_s) = rows(cos), rows(sin)
    launch(
        _rope_kernel, (n_batch * seq_len,),
        q_ptr=q, k_ptr=k, q_out_ptr=q_out, k_out_ptr=k_out, cos_ptr=cos, sin_ptr=sin,
        pos_ptr=positions if pos_mode == POS_IDS else None, cu_ptr=positions if pos_mode == POS_CU_SEQLENS else None,
        seq_len=seq_len, n_q_heads=n_q_heads, n_k_heads=n_k_heads,
        n_pos=cos.shape[0] if pos_mode != POS_DIRECT else 0, n_seqs=n_seqs,
        stride_q_b=sq_b, stride_q_s=sq_s, stride_q_h=sq_h, stride_k_b=sk_b, stride_k_s=sk_s, stride_k_h=sk_h,
        stride_qo_b=sqo_b, stride_qo_s=sqo_s, stride_qo_h=sqo_h, stride_ko_b=sko_b, stride_ko_s=sko_s,
        stride_ko_h=sko_h, stride_cos_b=scos_b, stride_cos_s=scos_s, stride_sin_b=ssin_b, stride_sin_s=ssin_s,
        stride_pos_b=stride_pos_b, stride_pos_s=stride_pos_s,
        constexprs=dict(POS_MODE=pos_mode, HAS_K=k is not None, BACKWARD=backward, HALF=rotary_dim // 2,
                        PASS=head_dim - rotary_dim, BLOCK_HQ=cfg.BLOCK_HQ, BLOCK_HK=cfg.BLOCK_HK,
                        BLOCK_HALF=cfg.BLOCK_HALF, BLOCK_PASS=cfg.BLOCK_PASS,
                        BLOCK_SEQS=next_pow2(n_seqs + 1) if pos_mode == POS_CU_SEQLENS else 1,
                        ACC=acc_dtype(q.dtype)),
        options=cfg.options(),
    )
    return q_out, k_out
