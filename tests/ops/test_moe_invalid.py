"""Data-dependent indices are safe by construction: router logits holding NaN or infinities, and expert indices or
counts that disagree, never make the MoE ops read or write outside a buffer, and give the documented result
(NaN where eager gives NaN; dropped assignments with row_map -1 and a zero contribution). Each kernel call runs
under memcheck where this build has it, which turns any out-of-bounds access into an error."""

from __future__ import annotations

import contextlib

import pytest
import torch

from wavefront import ops, reference

NAN, INF = float("nan"), float("inf")


def _checked():
    """Memcheck around the kernel launches when this build has it (every access bounds-checked)."""
    try:
        from wavefront.memcheck import checking
    except ImportError:
        return contextlib.nullcontext()
    return checking()


def _eager_router(logits: torch.Tensor, top_k: int, score: str, order: str, normalize: bool):
    """What Hugging Face's routers compute (Mixtral, Qwen-MoE: softmax then top-k; DeepSeek-V3: sigmoid; Mixtral's
    original order: top-k of the logits then softmax), in plain torch: weights and indices."""
    lf = logits.double()
    if order == "topk_softmax":
        v, i = torch.topk(lf, top_k, dim=-1)
        return torch.softmax(v, -1), i
    s = torch.sigmoid(lf) if score == "sigmoid" else torch.softmax(lf, -1)
    v, i = torch.topk(s, top_k, dim=-1)
    if normalize:
        v = v / (v.sum(-1, keepdim=True) + (1e-20 if score == "sigmoid" else 0.0))
    return v, i


ROUTERS = [
    ("softmax", "softmax_topk", True), ("softmax", "softmax_topk", False), ("softmax", "topk_softmax", True),
    ("sigmoid", "softmax_topk", True), ("sigmoid", "softmax_topk", False),
]
BAD_ROWS = {
    "one_nan": [1.0, NAN, 0.5, -1.0, 2.0, 0.0],
    "all_nan": [NAN] * 6,
    "pos_inf": [0.5, 1.0, INF, -2.0, 0.0, 1.0],
    "two_pos_inf": [INF, 1.0, INF, -2.0, 0.0, 1.0],
    "all_neg_inf": [-INF] * 6,
    "neg_inf_and_nan": [-INF, -INF, NAN, -INF, -INF, -INF],
}


@pytest.mark.parametrize(("score", "order", "normalize"), ROUTERS,
                         ids=["softmax", "softmax_no_norm", "topk_softmax", "sigmoid", "sigmoid_no_norm"])
@pytest.mark.parametrize("row", list(BAD_ROWS), ids=list(BAD_ROWS))
def test_router_bad_logits_give_eager_nans_and_real_experts(score, order, normalize, row):
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(9, 6, generator=gen) * 2.0
    good = logits.clone()
    logits[4] = torch.tensor(BAD_ROWS[row])
    top_k = 3
    with _checked():
        w, idx, counts, aux = ops.moe_router(logits, top_k, score=score, order=order, normalize=normalize,
                                             aux_loss_coef=0.1)
        gw, gidx, _, _ = ops.moe_router(good, top_k, score=score, order=order, normalize=normalize)
    # Every index names a real expert, each token's k are distinct, and the counts add up.
    assert ((idx >= 0) & (idx < 6)).all()
    assert all(len(set(r)) == top_k for r in idx.tolist())
    assert torch.equal(counts, torch.bincount(idx.reshape(-1), minlength=6).to(torch.int32))
    # Nothing else changes: the other tokens' weights and indices are the ones without the bad token.
    others = torch.arange(9) != 4
    assert torch.equal(idx[others], gidx[others]) and torch.equal(w[others], gw[others])
    # The bad token: NaN exactly where eager has NaN, eager's values elsewhere. Eager's order among equal
    # keys (NaNs, two +inf) is unspecified, ours is the lowest index first: compare as sets of (index, weight).
    ew, eidx = _eager_router(logits[4:5], top_k, score, order, normalize)
    assert torch.isnan(w[4]).sum() == torch.isnan(ew[0]).sum()
    if not torch.isnan(ew[0]).any():
        mine = sorted(zip(idx[4].tolist(), w[4].double().tolist(), strict=True))
        theirs = sorted(zip(eidx[0].tolist(), ew[0].tolist(), strict=True))
        for (_, a), (_, b) in zip(mine, theirs, strict=True):
            assert a == pytest.approx(b, abs=1e-6)
    # The reference agrees index for index (NaN ranks first, ties by lowest index).
    rw, ridx, rcounts, _ = reference.moe_router(logits.double(), top_k, score=score, order=order,
                                                normalize=normalize)
    assert torch.equal(idx, ridx) and torch.equal(counts, rcounts)
    torch.testing.assert_close(w.double(), rw, rtol=0, atol=1e-6, equal_nan=True)


def test_router_backward_with_a_nan_token_keeps_other_rows_finite():
    logits = torch.randn(7, 8, generator=torch.Generator().manual_seed(3))
    logits[2, 5] = NAN
    logits.requires_grad_()
    with _checked():
        w, _, _, _ = ops.moe_router(logits, 2)
        (g,) = torch.autograd.grad(w.sum(), logits)
    others = torch.arange(7) != 2
    assert torch.isfinite(g[others]).all() and torch.isnan(g[2]).all()


def _routing(n_tokens=10, n_experts=4, top_k=2, seed=0):
    gen = torch.Generator().manual_seed(seed)
    indices = torch.rand(n_tokens, n_experts, generator=gen).argsort(-1)[:, :top_k]
    x = torch.randn(n_tokens, 16, generator=gen)
    return indices, x


def _counts(indices, n_experts):
    flat = indices.reshape(-1)
    valid = flat[(flat >= 0) & (flat < n_experts)]
    return torch.bincount(valid, minlength=n_experts).to(torch.int32)


@pytest.mark.parametrize("bad", [4, -1, 1000, -(2 ** 40)], ids=["E", "minus_one", "far_past_E", "far_negative"])
@pytest.mark.parametrize("pad_to", [1, 4])
def test_permute_drops_invalid_indices_and_counts_them(bad, pad_to):
    indices, x = _routing()
    indices[3, 1] = bad
    indices[7, 0] = bad
    counts = _counts(indices, 4)  # the counts of the valid assignments, as the router would give them
    with _checked():
        xs, offsets, row_map = ops.moe_permute(x, indices, counts, pad_to=pad_to)
    rxs, roffsets, rrow_map = reference.moe_permute(x, indices, counts, pad_to=pad_to)
    flat = indices.reshape(-1)
    dropped = (flat < 0) | (flat >= 4)
    assert torch.equal(row_map < 0, dropped) and int((row_map < 0).sum()) == 2
    assert torch.equal(row_map, rrow_map) and torch.equal(offsets, roffsets)
    used = row_map[~dropped]
    assert torch.equal(xs[used], rxs[used])
    assert torch.equal(xs[used], x.repeat_interleave(2, 0)[~dropped])
    assert int(used.max()) < xs.shape[0]
    # The combine ignores the dropped slots (zero contribution, even with a NaN weight); identity experts give
    # back sum of the kept weights times x.
    w = torch.rand(10, 2, generator=torch.Generator().manual_seed(2))
    w[3, 1] = NAN
    with _checked():
        out = ops.moe_unpermute(xs, row_map, w)
    kept = torch.where(dropped.view(10, 2), 0.0, w)
    torch.testing.assert_close(out, kept.sum(1, keepdim=True) * x)
    torch.testing.assert_close(reference.moe_unpermute(xs, row_map, w), out)


@pytest.mark.parametrize("case", ["too_small", "too_large", "negative", "huge", "all_zero"])
def test_permute_with_counts_that_disagree_never_leaves_its_groups(case):
    indices, x = _routing(n_tokens=12, n_experts=4, top_k=2, seed=5)
    true = _counts(indices, 4)
    counts = {"too_small": (true - 2).clamp(min=0), "too_large": true + 3,
              "negative": torch.tensor([-3, 50, -1, 2], dtype=torch.int32),
              "huge": torch.full((4,), 2 ** 30, dtype=torch.int32),
              "all_zero": torch.zeros(4, dtype=torch.int32)}[case]
    with _checked():
        xs, offsets, row_map = ops.moe_permute(x, indices, counts)
    rxs, roffsets, rrow_map = reference.moe_permute(x, indices, counts)
    assert torch.equal(row_map, rrow_map) and torch.equal(offsets, roffsets)
    kept = row_map >= 0
    assert torch.equal(xs[row_map[kept]], rxs[row_map[kept]])
    # Every kept row lies inside its expert's group [start, start + max(counts, 0)) and inside x_sorted, and no
    # two assignments share a row.
    flat = indices.reshape(-1)
    cap = counts.to(torch.int64).clamp(min=0)
    starts = torch.cumsum(cap, 0) - cap
    r, e = row_map[kept], flat[kept]
    assert ((r >= starts[e]) & (r < starts[e] + cap[e]) & (r < xs.shape[0])).all()
    assert r.unique().numel() == r.numel()
    # Within a group the kept assignments are the first ones in (token, slot) order; the rest are dropped.
    for ex in range(4):
        mine = kept[flat == ex]
        n_keep = int(mine.sum())
        assert mine[:n_keep].all() and not mine[n_keep:].any()
        assert n_keep == min(int(cap[ex]), int(true[ex]), max(xs.shape[0] - int(starts[ex]), 0))


def test_unpermute_row_map_out_of_range_adds_nothing_and_gets_no_gradient():
    gen = torch.Generator().manual_seed(6)
    y = torch.randn(8, 16, generator=gen).requires_grad_()
    w = torch.rand(4, 2, generator=gen).requires_grad_()
    row_map = torch.tensor([0, -1, 2, 8, 4, 1_000_000, 6, -(2 ** 40)])
    with _checked():
        out = ops.moe_unpermute(y, row_map, w)
        out.backward(torch.ones_like(out))
    ok = (row_map >= 0) & (row_map < 8)
    expect = torch.stack([sum(w[t, j] * y[row_map[2 * t + j]] for j in range(2) if ok[2 * t + j])
                          for t in range(4)])
    torch.testing.assert_close(out, expect)
    assert (w.grad.reshape(-1)[~ok] == 0).all() and (w.grad.reshape(-1)[ok] != 0).all()
    # The rows the valid entries name get w * dout (dout = 1); rows no entry names are not written (unspecified
    # unless they are padding: documented in ops.moe_unpermute).
    for a in torch.nonzero(ok).flatten().tolist():
        torch.testing.assert_close(y.grad[row_map[a]], w.detach().reshape(-1)[a].expand(16))


def test_permute_backward_with_dropped_assignments():
    indices, x0 = _routing(n_tokens=6, n_experts=4, top_k=2, seed=7)
    indices[1, 0] = 4
    counts = _counts(indices, 4)
    x = x0.clone().requires_grad_()
    with _checked():
        xs, _, row_map = ops.moe_permute(x, indices, counts)
        xs.backward(torch.ones_like(xs))
    # Each token's gradient counts only its kept slots.
    kept = (row_map >= 0).view(6, 2).sum(1).to(x.dtype)
    torch.testing.assert_close(x.grad, kept[:, None].expand(6, 16))


def test_expert_counts_ignore_invalid_indices():
    from wavefront.nn.moe import expert_counts

    indices = torch.tensor([[0, 4], [-1, 3], [3, 2]])
    assert expert_counts(indices, 4).tolist() == [1, 0, 1, 2]
