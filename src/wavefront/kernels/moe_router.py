"""Mixture-of-experts router: scores, top-k selection, weights, per-expert counts and the loss statistics,
one pass over the (T, E) router logits; and its backward.

Per token t (a row of logits l, E experts):

    p = softmax(l)                     lse = logsumexp(l)            (always: the aux and z losses use them)
    s = sigmoid(l)  (SIGMOID)  else p  q = s / sum(s) (SIGMOID) else p   (the router probability of the aux loss)
    key = l (TOPK_FIRST) else s; key += bias (HAS_BIAS, DeepSeek-V3's correction: selection only; (E,) or
          (T, E), a per-token bias carrying -inf on experts outside the token's groups for group-limited routing)
    idx_j, j < k: the k largest keys, descending, equal keys by lowest expert index (the order torch.topk
                  gives for distinct values; deterministic for ties); a NaN key ranks above +inf (torch's
                  order), so every index is a real expert in [0, E) whatever the logits hold
    w_j = softmax over the k selected logits                       (TOPK_FIRST, Mixtral's original order)
        = s[idx_j] / (sum_i s[idx_i] + eps)   (NORMALIZE)          eps = 1e-20 with SIGMOID, else 0
        = s[idx_j]                             otherwise
    counts[e] += #{t, j: idx_tj = e}          integer atomics: the sum is exact and order-free (deterministic)
    psum_part[program, e] = sum over the program's rows of q[t, e]   (the host sums the partials in order)

The op turns counts, psum = sum_t q and lse into the aux losses with a few E-sized torch ops, so their
gradients arrive here as dpsum (E,) and dlse (T,). Backward per row (saved: logits, indices, weights):

    G_e   = dw_j at e = idx_j, else 0;  dot = sum_j dw_j w_j
    TOPK_FIRST:  dl = [e selected] w_e (G_e - dot) + p (dpsum - <p, dpsum>)
    softmax:     dp = [e selected] (NORMALIZE ? (G_e - dot) / S : G_e) + dpsum;  dl = p (dp - <p, dp>)
    SIGMOID:     ds = [e selected] (NORMALIZE ? (G_e - dot) / (S + eps) : G_e) + (dpsum - <q, dpsum>) / sum(s)
                 dl = ds s (1 - s)
    and always dl += dlse * p.  S = sum of the selected scores, recomputed from the logits.

Traffic per token, 16-bit logits: forward reads 2E B and writes k (4 + 8) + 4 B (fp32 weights, int64
indices, fp32 lse); backward reads 2E + 20k + 4 B and writes 2E B. The top-k is k max-reductions over the
row (O(kE) compare/select), so at E = 256, k = 8 it is ~30 operations per byte: still memory bound on
every GPU we target, but far from the 1-2 of a softmax.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from wavefront import runtime
from wavefront.kernels._heuristics import acc_dtype, next_pow2, stat_dtype
from wavefront.kernels._launch import launch
from wavefront.kernels._tables import FamilyTable, SingleStage
from wavefront.runtime import Arch

SIGMOID_NORM_EPS = tl.constexpr(1e-20)  # = reference.MOE_SIGMOID_NORM_EPS; constexpr: read inside the kernels


@dataclass(frozen=True)
class RouterTable:
    # Elements of the (rows x experts) tile one program holds. The top-k loop keeps ~6 tiles live (logits,
    # p, s, key, chosen, rank). Measured with `wavefront inspect --op moe_router` (AOT, bf16 bench shapes):
    # 4096-element tiles over 4 warps took 187-195 registers on sm_90 at E = 128/256 and spilled on
    # gfx942/gfx1100; 2048 keeps 16 values per lane per tile (8 on wave64).
    tile_elems: int
    max_rows: int
    num_warps: int


ROUTER_TABLES: FamilyTable[RouterTable] = FamilyTable(
    RouterTable(tile_elems=2048, max_rows=64, num_warps=4),
    "one row on every family: 4096-element tiles took 187-195 registers on sm_90 and spilled on gfx942 and "
    "gfx1100 (the fields' comments); 2048 fits all three",
)


@dataclass(frozen=True)
class RouterConfig(SingleStage):
    BLOCK_T: int
    BLOCK_E: int
    num_warps: int


def moe_router_config(n_experts: int, dtype: torch.dtype, arch: Arch) -> RouterConfig:
    """Pure function of (experts, dtype, architecture): one power-of-two tile of whole rows per program."""
    if n_experts < 1:
        raise ValueError(f"n_experts must be >= 1, got {n_experts}")
    table = ROUTER_TABLES[arch.family]
    block_e = next_pow2(n_experts)
    block_t = max(1, min(table.max_rows, table.tile_elems // block_e))
    return RouterConfig(BLOCK_T=block_t, BLOCK_E=block_e, num_warps=runtime.clamp_num_warps(table.num_warps, arch))


@triton.jit
def _row_tile(logits_ptr, pid, n_tokens, n_experts, stride_logits_row, SIGMOID: tl.constexpr, BLOCK_T: tl.constexpr,
              BLOCK_E: tl.constexpr, ACC: tl.constexpr):
    """Program `pid`'s (BLOCK_T, BLOCK_E) tile of logits and the scores both directions derive from it: the
    forward selects on them, the backward recomputes them instead of saving (T, E) probabilities."""
    rows = pid * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = tl.arange(0, BLOCK_E)
    row_ok = rows < n_tokens
    col_ok = cols < n_experts
    mask = row_ok[:, None] & col_ok[None, :]
    ptrs = logits_ptr + rows.to(tl.int64)[:, None] * stride_logits_row + cols[None, :]
    # Rows past the end read 0 (finite everywhere); columns past E are -inf so exp() gives exactly 0.
    lg = tl.load(ptrs, mask=mask, other=0.0).to(ACC)
    lg = tl.where(col_ok[None, :], lg, float("-inf"))
    m = tl.max(lg, axis=1)
    ex = tl.exp(lg - m[:, None])
    z = tl.sum(ex, axis=1)
    p = ex / z[:, None]
    lse = m + tl.log(z)
    if SIGMOID:
        s = tl.where(col_ok[None, :], 1.0 / (1.0 + tl.exp(-lg)), 0.0)
        ssum = tl.sum(s, axis=1)
        q = s / ssum[:, None]
    else:
        s = p
        ssum = tl.sum(p, axis=1)
        q = p
    return rows, cols, row_ok, col_ok, mask, lg, p, s, q, ssum, lse


@triton.jit
def _max_keep_nan(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _moe_router_fwd_kernel(logits_ptr, bias_ptr, weights_ptr, indices_ptr, counts_ptr, psum_part_ptr, lse_ptr,
                           n_tokens, n_experts, stride_logits_row, stride_bias_row,
                           TOP_K: tl.constexpr, SIGMOID: tl.constexpr, TOPK_FIRST: tl.constexpr,
                           NORMALIZE: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_T: tl.constexpr,
                           BLOCK_E: tl.constexpr, ACC: tl.constexpr):
    pid = tl.program_id(0)
    rows, cols, row_ok, col_ok, mask, lg, p, s, q, ssum, lse = _row_tile(
        logits_ptr, pid, n_tokens, n_experts, stride_logits_row, SIGMOID, BLOCK_T, BLOCK_E, ACC)
    if TOPK_FIRST:
        key = lg
    else:
        key = s
    if HAS_BIAS:
        # stride_bias_row 0: one (E,) bias for every token; else a (T, E) bias (group-limited routing's mask).
        key = key + tl.load(bias_ptr + rows.to(tl.int64)[:, None] * stride_bias_row + cols[None, :], mask=mask,
                            other=0.0).to(ACC)
    rows64 = rows.to(tl.int64)
    chosen = tl.zeros((BLOCK_T, BLOCK_E), dtype=tl.int1)
    rank = tl.full((BLOCK_T, BLOCK_E), -1, dtype=tl.int32)
    for j in tl.static_range(TOP_K):
        avail = col_ok[None, :] & (chosen == 0)
        k2 = tl.where(avail, key, float("-inf"))
        # The maximum with NaN propagating (tl.max may drop a NaN on a GPU): a NaN key ranks above +inf, as in
        # torch.topk, so a token whose logits hold a NaN selects it and its weights come out NaN, as in eager.
        mk = tl.reduce(k2, 1, _max_keep_nan)
        is_max = (k2 == mk[:, None]) | ((k2 != k2) & (mk != mk)[:, None])
        # Lowest index among the maxima (also when every remaining key is -inf). Never E or more: j < k <= E
        # leaves an available column, and the maximum is one of the available keys.
        ij = tl.min(tl.where(avail & is_max, cols[None, :], BLOCK_E), axis=1)
        pick = cols[None, :] == ij[:, None]
        chosen = chosen | pick
        rank = tl.where(pick, j, rank)
        tl.store(indices_ptr + rows64 * TOP_K + j, ij.to(tl.int64), mask=row_ok)
    if TOPK_FIRST:
        lm = tl.max(tl.where(chosen, lg, float("-inf")), axis=1)
        ew = tl.where(chosen, tl.exp(lg - lm[:, None]), 0.0)
        w = ew / tl.sum(ew, axis=1)[:, None]
    else:
        w = tl.where(chosen, s, 0.0)
        if NORMALIZE:
            if SIGMOID:
                w = w / (tl.sum(w, axis=1)[:, None] + SIGMOID_NORM_EPS)
            else:
                w = w / tl.sum(w, axis=1)[:, None]
    for j in tl.static_range(TOP_K):
        wj = tl.sum(tl.where(rank == j, w, 0.0), axis=1)
        tl.store(weights_ptr + rows64 * TOP_K + j, wj, mask=row_ok)
    hits = tl.sum(tl.where(chosen & row_ok[:, None], 1, 0), axis=0)
    tl.atomic_add(counts_ptr + cols, hits.to(tl.int32), mask=col_ok)
    tl.store(psum_part_ptr + pid.to(tl.int64) * n_experts + cols, tl.sum(tl.where(mask, q, 0.0), axis=0),
             mask=col_ok)
    tl.store(lse_ptr + rows, lse, mask=row_ok)


@triton.jit
def _moe_router_bwd_kernel(logits_ptr, indices_ptr, weights_ptr, dweights_ptr, dpsum_ptr, dlse_ptr, dlogits_ptr,
                           n_tokens, n_experts, stride_logits_row, stride_dlogits_row,
                           TOP_K: tl.constexpr, SIGMOID: tl.constexpr, TOPK_FIRST: tl.constexpr,
                           NORMALIZE: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr,
                           ACC: tl.constexpr):
    pid = tl.program_id(0)
    rows, cols, row_ok, col_ok, mask, lg, p, s, q, ssum, lse = _row_tile(
        logits_ptr, pid, n_tokens, n_experts, stride_logits_row, SIGMOID, BLOCK_T, BLOCK_E, ACC)
    rows64 = rows.to(tl.int64)
    g = tl.zeros((BLOCK_T, BLOCK_E), dtype=ACC)
    wmat = tl.zeros((BLOCK_T, BLOCK_E), dtype=ACC)
    chosen = tl.zeros((BLOCK_T, BLOCK_E), dtype=tl.int1)
    dot = tl.zeros((BLOCK_T,), dtype=ACC)
    for j in tl.static_range(TOP_K):
        ij = tl.load(indices_ptr + rows64 * TOP_K + j, mask=row_ok, other=0)
        wj = tl.load(weights_ptr + rows64 * TOP_K + j, mask=row_ok, other=0.0).to(ACC)
        dwj = tl.load(dweights_ptr + rows64 * TOP_K + j, mask=row_ok, other=0.0).to(ACC)
        pick = cols[None, :].to(tl.int64) == ij[:, None]
        chosen = chosen | pick
        g = tl.where(pick, dwj[:, None], g)
        wmat = tl.where(pick, wj[:, None], wmat)
        dot += dwj * wj
    dpsum = tl.load(dpsum_ptr + cols, mask=col_ok, other=0.0).to(ACC)[None, :]
    dlse = tl.load(dlse_ptr + rows, mask=row_ok, other=0.0).to(ACC)
    if TOPK_FIRST:
        dl = tl.where(chosen, wmat * (g - dot[:, None]), 0.0)
        dl += p * (dpsum - tl.sum(p * dpsum, axis=1)[:, None])
    else:
        if NORMALIZE:
            sel = tl.sum(tl.where(chosen, s, 0.0), axis=1)
            if SIGMOID:
                sel += SIGMOID_NORM_EPS
            dsel = (g - dot[:, None]) / sel[:, None]
        else:
            dsel = g
        if SIGMOID:
            ds = tl.where(chosen, dsel, 0.0) + (dpsum - tl.sum(q * dpsum, axis=1)[:, None]) / ssum[:, None]
            dl = ds * s * (1.0 - s)
        else:
            dp = tl.where(chosen, dsel, 0.0) + dpsum
            dl = p * (dp - tl.sum(p * dp, axis=1)[:, None])
    dl += dlse[:, None] * p
    tl.store(dlogits_ptr + rows64[:, None] * stride_dlogits_row + cols[None, :],
             dl.to(dlogits_ptr.dtype.element_ty), mask=mask)


def moe_router_fwd(logits: torch.Tensor, bias: torch.Tensor | None, top_k: int, sigmoid: bool, topk_first: bool,
                   normalize: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """logits: (T, E) with unit column stride -> (weights (T, k) fp32, indices (T, k) int64, counts (E,) int32,
    psum (E,) fp32, lse (T,) fp32); fp64 statistics for fp64 logits."""
    n_tokens, n_experts = logits.shape
    dev, stat = logits.device, stat_dtype(logits.dtype)
    cfg = moe_router_config(n_experts, logits.dtype, runtime.arch(dev))
    n_programs = triton.cdiv(n_tokens, cfg.BLOCK_T)
    weights = torch.empty((n_tokens, top_k), dtype=stat, device=dev)
    indices = torch.empty((n_tokens, top_k), dtype=torch.int64, device=dev)
    counts = torch.zeros((n_experts,), dtype=torch.int32, device=dev)
    psum_part = torch.empty((n_programs, n_experts), dtype=stat, device=dev)
    lse = torch.empty((n_tokens,), dtype=stat, device=dev)
    launch(_moe_router_fwd_kernel, (n_programs,),
           logits_ptr=logits, bias_ptr=bias, weights_ptr=weights, indices_ptr=indices, counts_ptr=counts,
           psum_part_ptr=psum_part, lse_ptr=lse, n_tokens=n_tokens, n_experts=n_experts,
           stride_logits_row=logits.stride(0), stride_bias_row=bias.stride(0) if bias is not None and bias.dim() == 2
           else 0,
           constexprs=dict(TOP_K=top_k, SIGMOID=sigmoid, TOPK_FIRST=topk_first, NORMALIZE=normalize,
                           HAS_BIAS=bias is not None, BLOCK_T=cfg.BLOCK_T, BLOCK_E=cfg.BLOCK_E,
                           ACC=acc_dtype(logits.dtype)),
           options=cfg.options())
    # Partials summed in program order: the same result on every run (no float atomics).
    return weights, indices, counts, psum_part.sum(0), lse


def moe_router_bwd(logits: torch.Tensor, indices: torch.Tensor, weights: torch.Tensor, dweights: torch.Tensor,
                   dpsum: torch.Tensor, dlse: torch.Tensor, sigmoid: bool, topk_first: bool,
                   normalize: bool) -> torch.Tensor:
    n_tokens, n_experts = logits.shape
    top_k = indices.shape[1]
    dlogits = torch.empty((n_tokens, n_experts), dtype=logits.dtype, device=logits.device)
    cfg = moe_router_config(n_experts, logits.dtype, runtime.arch(logits.device))
    launch(_moe_router_bwd_kernel, (triton.cdiv(n_tokens, cfg.BLOCK_T),),
           logits_ptr=logits, indices_ptr=indices, weights_ptr=weights, dweights_ptr=dweights, dpsum_ptr=dpsum,
           dlse_ptr=dlse, dlogits_ptr=dlogits, n_tokens=n_tokens, n_experts=n_experts,
           stride_logits_row=logits.stride(0), stride_dlogits_row=dlogits.stride(0),
           constexprs=dict(TOP_K=top_k, SIGMOID=sigmoid, TOPK_FIRST=topk_first, NORMALIZE=normalize,
                           BLOCK_T=cfg.BLOCK_T, BLOCK_E=cfg.BLOCK_E, ACC=acc_dtype(logits.dtype)),
           options=cfg.options())
    return dlogits
