"""MoE ops beyond the registry's accuracy sweep: the integer outputs (indices, counts, offsets, row map), tie
breaking, stability, padding, determinism, agreement with Hugging Face's router and aux loss, bad input."""

from __future__ import annotations

import pytest
import torch

from wavefront import ops, reference


def _logits(t, e, seed=0, scale=2.0, dtype=torch.float32):
    return (torch.randn(t, e, generator=torch.Generator().manual_seed(seed)) * scale).to(dtype)


@pytest.mark.parametrize("opts", [
    {}, {"normalize": False}, {"order": "topk_softmax"}, {"score": "sigmoid", "bias": torch.linspace(-0.3, 0.3, 10)},
], ids=["softmax", "no_norm", "topk_softmax", "sigmoid_bias"])
def test_router_integer_outputs_match_reference(opts):
    logits = _logits(33, 10)
    w, idx, counts, _ = ops.moe_router(logits, 3, **opts)
    rw, ridx, rcounts, _ = reference.moe_router(logits.double(), 3, **opts)
    assert idx.dtype == torch.int64 and counts.dtype == torch.int32
    assert torch.equal(idx, ridx)
    assert torch.equal(counts, rcounts)
    assert int(counts.sum()) == 33 * 3
    torch.testing.assert_close(w.double(), rw, rtol=0, atol=1e-6)


def test_router_matches_torch_topk_for_distinct_values():
    logits = _logits(40, 16, seed=3)
    _, idx, _, _ = ops.moe_router(logits, 4, normalize=False)
    assert torch.equal(idx, torch.topk(torch.softmax(logits, -1), 4, dim=-1).indices)


def test_router_ties_go_to_lowest_index():
    logits = torch.zeros(5, 8)
    logits[:, 6] = 1.0  # one clear winner, then seven equal logits
    _, idx, counts, _ = ops.moe_router(logits, 3)
    assert idx.tolist() == [[6, 0, 1]] * 5
    assert counts.tolist() == [5, 5, 0, 0, 0, 0, 5, 0]


def test_router_bias_changes_selection_not_weights():
    logits = _logits(12, 8, seed=5)
    bias = torch.zeros(8)
    bias[7] = 10.0  # expert 7 always selected, its weight still from the unbiased sigmoid score
    w, idx, _, _ = ops.moe_router(logits, 2, score="sigmoid", normalize=False, bias=bias)
    assert (idx[:, 0] == 7).all()
    torch.testing.assert_close(w[:, 0], torch.sigmoid(logits[:, 7]))


def test_router_matches_hf_mixtral_router_and_aux_loss():
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

    logits = _logits(30, 8, seed=7)
    w, idx, _, aux = ops.moe_router(logits, 2, aux_loss_coef=1.0)
    probs = torch.softmax(logits, -1)
    hw, hidx = torch.topk(probs, 2, dim=-1)
    assert torch.equal(idx, hidx)
    torch.testing.assert_close(w, hw / hw.sum(-1, keepdim=True))
    torch.testing.assert_close(aux, load_balancing_loss_func((logits,), 8, 2))


def test_router_z_loss_and_its_gradient():
    logits = _logits(9, 6, seed=11).requires_grad_()
    _, _, _, z = ops.moe_router(logits, 2, z_loss_coef=0.5)
    ref = logits.detach().double().requires_grad_()
    expect = 0.5 * torch.logsumexp(ref, -1).pow(2).mean()
    torch.testing.assert_close(z.double(), expect)
    (g,) = torch.autograd.grad(z, logits)
    (rg,) = torch.autograd.grad(expect, ref)
    torch.testing.assert_close(g.double(), rg, rtol=1e-5, atol=1e-7)


def test_router_is_deterministic():
    logits = _logits(64, 32, seed=2).requires_grad_()
    runs = []
    for _ in range(2):
        w, idx, counts, aux = ops.moe_router(logits, 4, aux_loss_coef=0.1, z_loss_coef=0.01)
        (g,) = torch.autograd.grad((w * w).sum() + aux, logits)
        runs.append((w, idx, counts, aux, g))
    for a, b in zip(*runs, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("pad_to", [1, 4])
def test_permute_offsets_row_map_stable_and_padded(pad_to):
    gen = torch.Generator().manual_seed(4)
    n_tokens, n_experts, top_k, hidden = 13, 5, 2, 24
    indices = torch.rand(n_tokens, n_experts, generator=gen).argsort(-1)[:, :top_k]
    indices[:, 0] = 2  # one crowded expert, and (likely) some empty ones
    counts = torch.bincount(indices.reshape(-1), minlength=n_experts).to(torch.int32)
    x = torch.randn(n_tokens, hidden, generator=gen)
    xs, offsets, row_map = ops.moe_permute(x, indices, counts, pad_to=pad_to)
    rxs, roffsets, rrow_map = reference.moe_permute(x, indices, counts, pad_to=pad_to)
    assert offsets.dtype == torch.int32 and torch.equal(offsets, roffsets)
    assert torch.equal(row_map, rrow_map) and torch.equal(xs, rxs)
    assert xs.shape == (n_tokens * top_k + n_experts * (pad_to - 1), hidden)
    padded = (counts + pad_to - 1) // pad_to * pad_to
    assert torch.equal(offsets, torch.cumsum(padded, 0).to(torch.int32))
    flat = indices.reshape(-1)
    starts = offsets - padded
    used = torch.zeros(xs.shape[0], dtype=torch.bool)
    for e in range(n_experts):
        rows = row_map[flat == e]
        # Stable: the group holds its assignments in (token, slot) order, from the group's start.
        assert torch.equal(rows, torch.arange(int(starts[e]), int(starts[e]) + int(counts[e])))
        assert all(torch.equal(xs[r], x[a // top_k]) for r, a in zip(rows, torch.nonzero(flat == e).flatten(),
                                                                      strict=True))
        used[rows] = True
    assert (xs[~used] == 0).all()


def test_unpermute_inverts_permute_with_weights():
    gen = torch.Generator().manual_seed(8)
    logits = torch.randn(11, 6, generator=gen)
    x = torch.randn(11, 40, generator=gen, dtype=torch.float32)
    w, idx, counts, _ = ops.moe_router(logits, 2)
    xs, _, row_map = ops.moe_permute(x, idx, counts, pad_to=4)
    # Identity experts: the combine of renormalized weights gives x back.
    torch.testing.assert_close(ops.moe_unpermute(xs, row_map, w), x)


def test_permute_and_unpermute_gradients_are_deterministic_and_zero_on_padding():
    gen = torch.Generator().manual_seed(9)
    indices = torch.rand(10, 4, generator=gen).argsort(-1)[:, :2]
    counts = torch.bincount(indices.reshape(-1), minlength=4).to(torch.int32)
    x0 = torch.randn(10, 16, generator=gen)
    w0 = torch.rand(10, 2, generator=gen)
    dout = torch.randn(10, 16, generator=gen)
    runs = []
    for _ in range(2):
        x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        xs, _, row_map = ops.moe_permute(x, indices, counts, pad_to=8)
        y = (xs * 2.0).detach().requires_grad_()
        ops.moe_unpermute(y, row_map, w).backward(dout)
        xs.backward(y.grad)
        runs.append((x.grad, w.grad, y.grad, row_map))
    used = torch.zeros(runs[0][2].shape[0], dtype=torch.bool)
    used[runs[0][3]] = True
    assert (runs[0][2][~used] == 0).all() and (runs[0][2][used] != 0).any()
    # dy_sorted rows = w * dout, gathered back: dx = sum over slots of w * dout; dw = <dout, 2 x>.
    torch.testing.assert_close(runs[0][0], w0.sum(1, keepdim=True) * dout)
    torch.testing.assert_close(runs[0][1], (2 * x0 * dout).sum(1, keepdim=True).expand(10, 2))
    for a, b in zip(*runs, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize(("call", "message"), [
    (lambda: ops.moe_router(torch.randn(4, 8), 9), "'top_k' must be an int in"),
    (lambda: ops.moe_router(torch.randn(4, 8), 2, score="relu"), "'score' must be one of"),
    (lambda: ops.moe_router(torch.randn(4, 8), 2, score="sigmoid", order="topk_softmax"), "needs score='softmax'"),
    (lambda: ops.moe_router(torch.randn(4, 8), 2, bias=torch.zeros(7)), "'bias' must have shape"),
    (lambda: ops.moe_router(torch.randn(4, 8, 2), 2), "'logits' must have 2 dims"),
    (lambda: ops.moe_permute(torch.randn(4, 8), torch.zeros(3, 2, dtype=torch.int64),
                             torch.zeros(4, dtype=torch.int32)), "'indices' must have 4 rows"),
    (lambda: ops.moe_permute(torch.randn(4, 8), torch.zeros(4, 2), torch.zeros(4, dtype=torch.int32)),
     "'indices' must have dtype"),
    (lambda: ops.moe_permute(torch.randn(4, 8), torch.zeros(4, 2, dtype=torch.int64),
                             torch.zeros(4, dtype=torch.int32), pad_to=0), "'pad_to' must be an int >= 1"),
    (lambda: ops.moe_unpermute(torch.randn(8, 8), torch.zeros(6, dtype=torch.int64), torch.rand(4, 2)),
     "'row_map' must have weights.numel()"),
])
def test_bad_input_names_the_argument(call, message):
    with pytest.raises((TypeError, ValueError), match=message):
        call()
