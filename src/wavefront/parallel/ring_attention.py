"""Ring attention (context parallelism): each rank holds a shard of the sequence; K/V travel around the ring.

Rank r of a context-parallel group of size P holds q, k, v [B, H(kv), S / P, D] for its part of the
sequence. The sequence is cut into chunks of c tokens and each rank holds n chunks (``layout``):

    "contiguous"  n = 1: rank r holds chunk r of P
    "zigzag"      n = 2: rank r holds chunks r and 2P - 1 - r of 2P (causal load balancing: every rank
                  holds one early and one late chunk, so every rank does the same work at every step)

Forward. At step s = 0 .. P - 1 rank r holds the K/V of rank j = (r - s) mod P and, while it computes on
them, already sends them to rank r + 1 and receives rank r - 1's (one batched isend/irecv per step, K and V
packed in one buffer). What a step computes, per pair of a query chunk a and a key chunk b (global chunk
indices):

    not causal          every pair, as one block: the whole local q against the whole K/V shard
    causal, j == r      one causal block: the local q against the local K/V (chunks in ascending order,
                        so the shard's own causal mask is exactly the global one restricted to it)
    causal, j != r      the pairs with a > b, each a full c x c block (b > a is masked out entirely; a == b
                        only happens when j == r); the pairs of one step go to one call, stacked along the
                        batch dim (zigzag: always 2 pairs per rank and step, contiguous: 1 or 0)

Each block is one call of the forward of wavefront.ops.attention (``torch.ops.wavefront.attention_fwd``),
which returns the block's output o_b and its log-sum-exp in base 2, lse2_b. Blocks are merged per query row
in fp32:

    lse2 = log2(2^lse2 + 2^lse2_b),   out = out 2^(lse2_old - lse2) + o_b 2^(lse2_b - lse2)

No S x S matrix exists and no rank holds more than its own shard and one travelling K/V shard (two while
the next one arrives).

Backward: a ring backward that recomputes every block with the attention backward
(``torch.ops.wavefront.attention_bwd``) given the final output O and the merged lse2. With them, the
kernel's P_ij = 2^(c S_ij - lse2_i) are the probabilities of the whole sequence and its delta_i =
sum_d dO_id O_id is the whole row's, so each block's dQ, dK, dV are exactly that block's share of the
unsharded gradient. dQ accumulates locally (fp32); the K/V shards travel the ring again, and their fp32
dK, dV accumulators travel with them one step behind: after P steps each accumulator has visited every
rank and one last send hands it to its owner. Per step: one K/V exchange (prefetched before the compute)
and one dK/dV exchange (after it). We chose the recomputing ring backward over saving each step's
probabilities: it needs only O and lse2 ([B, H, S / P] fp32) beyond the inputs, as FlashAttention does.

Precision. The O saved for backward is the fp32 merge, not the output rounded to the input dtype: the
attention backward reads O only for delta_i = sum_d dO_id O_id, and every dS_ij = P_ij (dP_ij - delta_i) of
the row, so dQ and dK inherit delta's error, and the merged O carries the rounding of every block's o_b
(written in the input dtype by the forward kernel) on top of the final one. With bf16 inputs, 2 ranks,
zig-zag, causal, GQA (tests/parallel/_ring_worker.py), the error against float64 relative to eager bf16's
goes from 2.69x to 1.50x for dK and from 1.83x to 1.24x for dQ (dV does not depend on delta: 1.08x both
ways). The price: O saved in fp32 (4 bytes per element instead of 2 for 16-bit inputs). Each block's dQ,
dK, dV are also written in fp32 by the attention backward (`fp32_grads=True`), so nothing is rounded before
the fp32 sums: 1.05x (dQ), 1.04x (dK), the unsharded kernel's own ratios (from 1.24x and 1.50x with the
block gradients in the input dtype).

GQA: k, v may have fewer heads (dividing q's); the blocks take them as they are and the attention backward
sums dK, dV over each group.

Positions: RoPE is the caller's, with the global positions of the shard
(``shard_sequence(torch.arange(S), rank, world, 0, layout)``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import Tensor

import wavefront.ops.attention  # noqa: F401  (registers torch.ops.wavefront.attention_fwd/_bwd)
from wavefront import reference, runtime
from wavefront.ops.attention import _check
from wavefront.parallel._agree import check_agreement, fingerprint
from wavefront.parallel.vocab_parallel import check_group

__all__ = ["LAYOUTS", "ring_attention", "shard_sequence", "unshard_sequence", "zigzag_shard", "zigzag_unshard"]

LAYOUTS = ("zigzag", "contiguous")


def _chunk_ids(rank: int, world: int, layout: str) -> tuple[int, ...]:
    """Global chunk indices held by `rank`, in sequence order."""
    return (rank, 2 * world - 1 - rank) if layout == "zigzag" else (rank,)


def _check_split(op: str, x: Tensor, dim: int, n_chunks: int) -> None:
    if x.shape[dim] % n_chunks:
        raise ValueError(f"{op}: the sequence length along dim {dim} ({x.shape[dim]}) must be a multiple of "
                         f"{n_chunks} (the number of chunks of the layout)")


def shard_sequence(x: Tensor, rank: int, world: int, dim: int, layout: str = "zigzag") -> Tensor:
    """This rank's part of a whole sequence along `dim` in `layout` (see the module docstring)."""
    if layout not in LAYOUTS:
        raise ValueError(f"shard_sequence: argument 'layout' must be one of {LAYOUTS}, got {layout!r}")
    if not 0 <= rank < world:
        raise ValueError(f"shard_sequence: argument 'rank' must be in [0, {world}), got {rank}")
    n_chunks = world * (2 if layout == "zigzag" else 1)
    _check_split("shard_sequence", x, dim, n_chunks)
    chunks = x.chunk(n_chunks, dim)
    return torch.cat([chunks[i] for i in _chunk_ids(rank, world, layout)], dim)


def unshard_sequence(shards: Sequence[Tensor], dim: int, layout: str = "zigzag") -> Tensor:
    """The whole sequence from every rank's shard (in rank order): the inverse of :func:`shard_sequence`."""
    if layout not in LAYOUTS:
        raise ValueError(f"unshard_sequence: argument 'layout' must be one of {LAYOUTS}, got {layout!r}")
    world = len(shards)
    if layout == "contiguous":
        return torch.cat(list(shards), dim)
    halves = [s.chunk(2, dim) for s in shards]
    return torch.cat([halves[i][0] for i in range(world)] + [halves[i][1] for i in reversed(range(world))], dim)


def zigzag_shard(x: Tensor, rank: int, world: int, dim: int) -> Tensor:
    """Chunks rank and 2 world - 1 - rank of 2 world equal chunks of x along dim, concatenated."""
    return shard_sequence(x, rank, world, dim, "zigzag")


def zigzag_unshard(shards: Sequence[Tensor], dim: int) -> Tensor:
    """The inverse of :func:`zigzag_shard` given every rank's shard in rank order."""
    return unshard_sequence(shards, dim, "zigzag")


# ---------------------------------------------------------------------------------------------------
# Blocks: the kernels of wavefront.ops.attention, or the float64-capable reference.


def _acc(q: Tensor) -> torch.dtype:
    """The accumulators' dtype: fp32, fp64 for fp64 inputs."""
    return torch.float64 if q.dtype == torch.float64 else torch.float32


def _uses_kernels(q: Tensor) -> bool:
    return runtime.uses_triton(q.device) and q.dtype != torch.float64


def _block_fwd(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float) -> tuple[Tensor, Tensor]:
    if _uses_kernels(q):
        return torch.ops.wavefront.attention_fwd(q, k, v, None, -1, causal, scale)
    return reference.attention_block(q, k, v, causal, scale)


def _block_bwd(do: Tensor, q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse2: Tensor, causal: bool,
               scale: float) -> tuple[Tensor, Tensor, Tensor]:
    if _uses_kernels(q):
        return torch.ops.wavefront.attention_bwd(do, q, k, v, o, lse2, None, -1, causal, scale, True, True)
    return reference.attention_block_bwd(do, q, k, v, o, lse2, causal, scale)


def _pairs(rank: int, src: int, world: int, layout: str) -> list[tuple[int, int]]:
    """Causal step against rank src's K/V (src != rank): (local q chunk, local k chunk) pairs fully visible."""
    q_ids, k_ids = _chunk_ids(rank, world, layout), _chunk_ids(src, world, layout)
    return [(a, b) for a, qa in enumerate(q_ids) for b, kb in enumerate(k_ids) if qa > kb]


def _step_blocks(rank: int, src: int, world: int, layout: str, causal: bool, n_local: int, c: int):
    """What one step computes: a list of (q rows, k rows, causal) where rows are lists of local chunk slices
    (a whole-shard block is one slice each side); pairs of one step are stacked into one call."""
    whole = [slice(0, n_local)]
    if not causal:
        return [(whole, whole, False)]
    if src == rank:
        return [(whole, whole, True)]
    pairs = _pairs(rank, src, world, layout)
    if not pairs:
        return []
    return [([slice(a * c, (a + 1) * c) for a, _ in pairs], [slice(b * c, (b + 1) * c) for _, b in pairs], False)]


def _gather(t: Tensor, rows: list[slice]) -> Tensor:
    """Rows of the sequence dim, stacked along the batch dim (a view when there is one slice)."""
    if len(rows) == 1:
        return t[:, :, rows[0]]
    return torch.cat([t[:, :, r] for r in rows], dim=0)


def _split(t: Tensor, rows: list[slice]) -> list[Tensor]:
    return list(t.chunk(len(rows), dim=0)) if len(rows) > 1 else [t]


# ---------------------------------------------------------------------------------------------------
# The ring.


class _Ring:
    """Send to the next rank, receive from the previous one, in one batched isend/irecv."""

    def __init__(self, group, rank: int, world: int):
        self.group = group
        to_global = (lambda r: r) if group is None else (lambda r: dist.get_global_rank(group, r))
        self.next, self.prev = to_global((rank + 1) % world), to_global((rank - 1) % world)

    def start(self, send: Tensor) -> tuple[Tensor, list]:
        recv = torch.empty_like(send)
        ops = [dist.P2POp(dist.isend, send, self.next, self.group), dist.P2POp(dist.irecv, recv, self.prev, self.group)]
        return recv, dist.batch_isend_irecv(ops)

    @staticmethod
    def wait(works: list) -> None:
        for w in works:
            w.wait()


def _merge_(out: Tensor, lse2: Tensor, o_b: Tensor, lse2_b: Tensor) -> None:
    """out, lse2 (views of the accumulators) <- their log-sum-exp merge with one block's (o_b, lse2_b)."""
    new = torch.logaddexp2(lse2, lse2_b)
    out.mul_(torch.exp2(lse2 - new)[..., None]).add_(o_b.to(out.dtype) * torch.exp2(lse2_b - new)[..., None])
    lse2.copy_(new)


def _forward(q, k, v, causal, scale, layout, ring, rank, world):
    n_local = q.shape[2]
    c = n_local // len(_chunk_ids(rank, world, layout))
    acc = _acc(q)
    out = torch.zeros(q.shape, dtype=acc, device=q.device)
    lse2 = torch.full(q.shape[:3], float("-inf"), dtype=acc, device=q.device)
    kv = torch.stack([k, v])
    for step in range(world):
        src = (rank - step) % world
        pending = ring.start(kv) if step < world - 1 else None
        for q_rows, k_rows, block_causal in _step_blocks(rank, src, world, layout, causal, n_local, c):
            o_b, l_b = _block_fwd(_gather(q, q_rows), _gather(kv[0], k_rows), _gather(kv[1], k_rows), block_causal,
                                  scale)
            for rows, o_i, l_i in zip(q_rows, _split(o_b, q_rows), _split(l_b, q_rows), strict=True):
                _merge_(out[:, :, rows], lse2[:, :, rows], o_i, l_i)
        if pending is not None:
            kv, works = pending
            _Ring.wait(works)
    return out, lse2


def _backward(do, q, k, v, o, lse2, causal, scale, layout, ring, rank, world):
    n_local = q.shape[2]
    c = n_local // len(_chunk_ids(rank, world, layout))
    acc = _acc(q)
    dq = torch.zeros(q.shape, dtype=acc, device=q.device)
    kv = torch.stack([k, v])
    travelling = None  # the fp32 (dK, dV) of the K/V shard this rank holds, from the ranks it has visited
    for step in range(world):
        src = (rank - step) % world
        pending = ring.start(kv) if step < world - 1 else None
        local = torch.zeros(kv.shape, dtype=acc, device=q.device)
        for q_rows, k_rows, block_causal in _step_blocks(rank, src, world, layout, causal, n_local, c):
            lse_b = _gather(lse2, q_rows)
            dq_b, dk_b, dv_b = _block_bwd(_gather(do, q_rows), _gather(q, q_rows), _gather(kv[0], k_rows),
                                          _gather(kv[1], k_rows), _gather(o, q_rows), lse_b.contiguous(),
                                          block_causal, scale)
            for rows, g in zip(q_rows, _split(dq_b, q_rows), strict=True):
                dq[:, :, rows] += g
            for rows, gk, gv in zip(k_rows, _split(dk_b, k_rows), _split(dv_b, k_rows), strict=True):
                local[0][:, :, rows] += gk
                local[1][:, :, rows] += gv
        if travelling is not None:
            _Ring.wait(travelling[1])
            local += travelling[0]
        travelling = ring.start(local) if world > 1 else (local, [])
        if pending is not None:
            kv, works = pending
            _Ring.wait(works)
    dkv, works = travelling
    _Ring.wait(works)
    return dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype)


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, scale, layout, group, rank, world):
        ring = _Ring(group, rank, world)
        out, lse2 = _forward(q, k, v, causal, scale, layout, ring, rank, world)
        ctx.save_for_backward(q, k, v, out, lse2)  # out unrounded (fp32, fp64): see "Precision"
        ctx.args = (causal, scale, layout, group, rank, world)
        return out.to(q.dtype)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, do):
        q, k, v, out, lse2 = ctx.saved_tensors
        causal, scale, layout, group, rank, world = ctx.args
        ring = _Ring(group, rank, world)
        dq, dk, dv = _backward(do.contiguous(), q, k, v, out, lse2, causal, scale, layout, ring, rank, world)
        return dq, dk, dv, None, None, None, None, None, None


def _dim(t, d: int) -> int:
    return t.shape[d] if isinstance(t, Tensor) and t.dim() > d else -1


def _shape_but_seq(t) -> tuple:
    return tuple(t.shape[:2]) + tuple(t.shape[3:]) if isinstance(t, Tensor) else (type(t).__name__,)


def ring_attention(q: Tensor, k: Tensor, v: Tensor, group: dist.ProcessGroup | None = None, *,
                   causal: bool = False, layout: str = "zigzag", scale: float | None = None) -> Tensor:
    """Attention over the whole sequence from this rank's shard of it: q [B, H, S / P, D], k and v
    [B, H_kv, S / P, D] (H_kv divides H), each rank of ``group`` holding the rows :func:`shard_sequence` gives
    it in ``layout`` ("zigzag": causal load balancing; "contiguous"). Returns this rank's rows of the output,
    [B, H, S / P, D] in q's dtype; gradients reach this rank's q, k, v. scale defaults to 1/sqrt(D).
    """
    op = "ring_attention"
    if dist.is_available() and dist.is_initialized():
        check_group(op, group)
        # Before any check that could fail on some ranks only (the others would wait in the ring): every rank
        # raises, or none.
        check_agreement(op, group, q.device, {
            "q's local sequence length (dim 2)": _dim(q, 2), "k's local sequence length (dim 2)": _dim(k, 2),
            "v's local sequence length (dim 2)": _dim(v, 2),
            "shape fingerprint (q, k, v without the sequence dim)": fingerprint(
                *(_shape_but_seq(t) for t in (q, k, v))),
            "options fingerprint (dtypes, causal, layout, scale)": fingerprint(
                q.dtype, k.dtype, v.dtype, causal, layout, scale)})
    _check(q, k, v, causal, scale, None, None)
    if layout not in LAYOUTS:
        raise ValueError(f"{op}: argument 'layout' must be one of {LAYOUTS}, got {layout!r}")
    rank, world = check_group(op, group)
    if q.shape[2] == 0 or k.shape[2] == 0:
        # Every rank's shard is empty (they agree): attention over no rows. Empty output, empty gradients.
        return q + 0 * (k.sum() + v.sum())
    n_chunks = 2 if layout == "zigzag" else 1
    if q.shape[2] % n_chunks:
        raise ValueError(f"{op}: the local sequence length ({q.shape[2]}) must be even with layout='zigzag' "
                         f"(two chunks per rank)")
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)  # _check refused a non-finite one
    q, k, v = (t.contiguous() for t in (q, k, v))
    return _RingAttention.apply(q, k, v, causal, scale, layout, group, rank, world)
