"""Attention (FlashAttention-2 style), forward and backward, with GQA/MQA, causal masking and packed
variable-length sequences.

Per (batch, head), with Q [S, D], K and V [S, D] (K/V head ``h // group`` for GQA), scale ``s``:

    S_ij = s * q_i . k_j                  (masked to -inf where j > i when causal, or j >= seqlen)
    P    = softmax_j(S)                   O = P V
    lse_i = log sum_j exp(S_ij)           (saved for backward in base 2, lse2 = lse log2 e, fp32)

Operand layouts. A product that contracts over the sequence (P V forward; P^T dO, dS^T Q, dS K backward)
reads its second operand along a dimension that is not contiguous in memory. On AMD, Triton then writes
the tile to LDS and reads it back one 16-bit element per ds_read_u16; with ``transposed`` the launcher
makes [B, H, head_dim, S] copies (V forward; Q, dO and K backward: one extra read and write of each, S D
elements against the kernels' S^2 D work) and the kernels read them sequence-contiguous. With head_dim
256 the dK/dV (dQ) accumulators of a tile wide enough for wgmma/tcgen05 do not fit the registers:
``d_split`` programs share a key (query) tile, each accumulating BLOCK_D / d_split columns and
recomputing S and dP (d_split 4 for dK/dV: 2.5x that kernel's matrix work). On RDNA3 (wave32 WMMA,
operands replicated over the half-waves) even the tiles a program keeps across its loop (Q and dO in dQ, Q
forward, K and V in dK/dV) fill the registers at head_dim >= 128: ``d_chunk`` (D_CHUNK < BLOCK_D) sums S
and dP over head-dim chunks whose operands are loaded inside the loop, re-reading the kept tile from the
cache each step (one extra tile read per step, no extra matrix work); the accumulators stay whole.

Saved for backward: Q, K, V, O and lse2 ([B, H, S] fp32). Nothing of size S x S.
Rounding: the scaled score x = c S' is rounded once and both m = max x and x - m use that value, so
the largest entry of every row is exactly exp2(0) = 1 (a one-key row reproduces V exactly). lse stays in
base 2: converting to natural log and back would add two fp32 roundings at |lse|, which reaches 20-100
for peaked softmaxes, each an error shared by a whole row of the recomputed P.

Packed variable-length input (``cu_seqlens``): q is [1, H, total, D] and k/v [1, H_kv, total, D], the
sequences concatenated along the sequence axis; sequence b occupies rows cu_seqlens[b]:cu_seqlens[b+1]
and attends only within itself. lse2 is then [1, H, total].

FLOPs (field convention, non-causal): forward 4 B H S^2 D; causal half that. Bytes (16-bit, minimum):
forward reads Q, K, V and writes O: 2 B (2 H + 2 H_kv) S D, plus 4 B H S for lse2. Intensity at
S = 8192, D = 128, H = H_kv: 4 S^2 D / (8 S D) = S/2 = 4096 FLOP/B, far right of every ridge point:
compute bound, so the tiles are sized for the matrix units, not for bandwidth.

Program order: a 1-D grid, head-major (programs sharing a K/V head are consecutive, so their K/V stays in
L2), remapped on MI300X so those programs share an XCD (kernels/_program_order.py). Causal forward and
dQ programs start from the last query tile (the longest row of work) so the tail of the grid is short.

Offsets: sequence, batch and head offsets are promoted to int64 before they multiply a stride.

The kernels live in three modules: ``attention_fwd`` (forward: the online softmax, the TMA/warp-specialized
and pipelined key loops, the FP8 epilogue), ``attention_bwd`` (the delta, dK/dV and dQ kernels, the atomic
dQ variant) and ``attention_common`` (tile loads, sequence bounds, masks and launcher helpers both use).
This module is the entry point the op layer calls.
"""

from __future__ import annotations

from wavefront.kernels.attention_bwd import attention_bwd
from wavefront.kernels.attention_fwd import attention_fwd

__all__ = ["attention_bwd", "attention_fwd"]
