"""wavefront.nn.MoE against transformers' sparse MoE blocks: the same state_dict keys, outputs and gradients
(Mixtral, Qwen3-MoE, DeepSeek-V3 with its shared expert, sigmoid scores, bias, group-limited routing and
scaling), the aux loss, padding, and the tokens-per-expert counters."""

from __future__ import annotations

import pytest
import torch

from wavefront.nn import MoE, tokens_per_expert

transformers = pytest.importorskip("transformers")

H, I, E, K = 16, 12, 4, 2


def _hf_block(family: str):
    torch.manual_seed(0)
    if family == "mixtral":
        from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

        cfg = transformers.MixtralConfig(hidden_size=H, intermediate_size=I, num_local_experts=E,
                                         num_experts_per_tok=K)
        block, ours = MixtralSparseMoeBlock(cfg), MoE(H, I, E, K)
    elif family == "qwen3_moe":
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

        cfg = transformers.Qwen3MoeConfig(hidden_size=H, moe_intermediate_size=I, num_experts=E, num_experts_per_tok=K,
                                          norm_topk_prob=False)
        block, ours = Qwen3MoeSparseMoeBlock(cfg), MoE(H, I, E, K, normalize=False)
    else:
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE

        cfg = transformers.DeepseekV3Config(hidden_size=H, moe_intermediate_size=I, n_routed_experts=E,
                                            num_experts_per_tok=K, n_group=2, topk_group=1, n_shared_experts=1,
                                            routed_scaling_factor=2.5, norm_topk_prob=True)
        block = DeepseekV3MoE(cfg)
        ours = MoE(H, I, E, K, score="sigmoid", score_bias=True, routed_scaling_factor=2.5, router_fp32=True,
                   n_group=2, topk_group=1, shared_expert=I)
    cfg._experts_implementation = "eager"
    with torch.no_grad():
        for name, t in block.state_dict(keep_vars=True).items():
            t.copy_(torch.randn(t.shape) * (0.1 if name.endswith("bias") else 0.4))
    return block, ours


@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe", "deepseek_v3"])
def test_moe_matches_transformers_block(family):
    block, ours = _hf_block(family)
    assert sorted(ours.state_dict()) == sorted(block.state_dict())
    ours.load_state_dict(block.state_dict())
    x = torch.randn(2, 5, H)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    expect, got = block(xa), ours(xb)
    torch.testing.assert_close(got, expect, rtol=1e-5, atol=1e-5)
    dy = torch.randn(expect.shape)
    expect.backward(dy)
    got.backward(dy)
    torch.testing.assert_close(xb.grad, xa.grad, rtol=1e-5, atol=1e-5)
    theirs = dict(block.named_parameters())
    for name, p in ours.named_parameters():
        torch.testing.assert_close(p.grad, theirs[name].grad, rtol=1e-5, atol=1e-5, msg=name)
    # A checkpoint of ours loads back into transformers' block.
    block.load_state_dict(ours.state_dict())


def test_aux_loss_is_mixtrals_load_balancing_loss():
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

    moe = MoE(H, I, E, K, aux_loss_coef=0.02, z_loss_coef=0.001)
    x = torch.randn(3, 4, H)
    moe(x)
    logits = moe.router_logits
    expect = 0.02 * load_balancing_loss_func((logits,), E, K) + 0.001 * torch.logsumexp(logits, -1).pow(2).mean()
    torch.testing.assert_close(moe.aux_loss, expect)
    moe.aux_loss.backward()
    assert moe.gate.weight.grad is not None and moe.gate.weight.grad.abs().sum() > 0


def test_padding_changes_nothing_but_the_layout():
    torch.manual_seed(1)
    a = MoE(H, I, E, K)
    b = MoE(H, I, E, K, pad_to=8)
    b.load_state_dict(a.state_dict())
    x = torch.randn(7, H)
    torch.testing.assert_close(b(x), a(x))


def test_tokens_per_expert_accumulate_and_reset():
    moe = MoE(H, I, E, K)
    model = torch.nn.Sequential(moe)
    x = torch.randn(9, H)
    model(x)
    model(x[:4])
    counts = tokens_per_expert(model)
    assert list(counts) == ["0.experts"] and sum(counts["0.experts"]) == (9 + 4) * K
    assert "experts.tokens_per_expert" not in moe.state_dict()
    assert tokens_per_expert(model) == {"0.experts": [0] * E}


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"top_k": 5}, "'top_k' must be <= num_experts"),
    ({"hidden": 0}, "'hidden' must be an int >= 1"),
    ({"shared_expert": 0}, "'shared_expert' must be None or an int"),
    ({"n_group": 3}, "n_group .* must divide num_experts"),
])
def test_bad_arguments_are_named(kwargs, message):
    args = {"hidden": H, "intermediate": I, "num_experts": E, "top_k": K, **kwargs}
    with pytest.raises(ValueError, match=message):
        MoE(**args)


def _grouped_linear_without_sync(x, weight, offsets, *, activation=None):
    """A host-sync-free grouped linear for this test (the stand-in op reads its offsets on the host): every
    expert's product on every row, rows outside the expert's group masked to zero."""
    rows = torch.arange(x.shape[0], device=x.device)[:, None]
    starts = torch.cat([offsets.new_zeros(1), offsets[:-1]])
    member = ((rows >= starts) & (rows < offsets)).to(x.dtype)  # (T, E)
    y = torch.einsum("te,enk,tk->tn", member, weight, x)
    if activation == "swiglu":
        gate, up = y.chunk(2, dim=-1)
        y = torch.nn.functional.silu(gate) * up
    return y


def test_moe_compiles_in_one_graph(monkeypatch):
    # fullgraph=True fails on any host sync (.item(), .tolist()) or graph break in the router, the permutation,
    # the combine, the counters or the module's own code.
    from wavefront import ops

    monkeypatch.setattr(ops, "grouped_linear", _grouped_linear_without_sync)
    torch._dynamo.reset()
    torch.manual_seed(2)
    moe = MoE(H, I, E, K, aux_loss_coef=0.01, pad_to=4)
    x = torch.randn(6, H)

    def run(fn):
        xg = x.clone().requires_grad_()
        y = fn(xg)
        (y.square().sum() + moe.aux_loss).backward()
        return y.detach(), xg.grad, moe.gate.weight.grad.clone()

    expect = run(moe)
    moe.zero_grad()
    got = run(torch.compile(moe, backend="aot_eager", fullgraph=True))
    for g, e in zip(got, expect, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-6)
    assert int(moe.experts.tokens_per_expert.sum()) == 2 * 6 * K


# A token whose router logits hold NaN (or overflow): NaN for that token's output row, exactly the eager values for
# every other token, and (before the fix) no out-of-bounds scatter of its rows (the router gave it expert E).
@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe", "deepseek_v3"])
@pytest.mark.parametrize("where", ["hidden", "router_row"])
def test_nan_token_matches_eager_shape_for_shape(family, where):
    block, ours = _hf_block(family)
    ours.load_state_dict(block.state_dict())
    x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(4))
    if where == "hidden":
        x[1, 2] = float("nan")  # the token's hidden state: its logits and its expert rows are NaN
    else:
        x[1, 2, 3] = 1e38  # one huge feature: this token's router logits overflow to +-inf (and NaN)
    with torch.no_grad():
        expect, got = block(x), ours(x)
    assert got.shape == expect.shape
    assert torch.equal(torch.isnan(got), torch.isnan(expect))
    assert torch.isnan(got[1, 2]).any()
    fine = ~torch.isnan(expect)
    torch.testing.assert_close(got[fine], expect[fine], rtol=1e-5, atol=1e-5)
    # Every routed assignment went to a real expert (none dropped): the counters hold T * k.
    assert sum(sum(c) for c in tokens_per_expert(ours).values()) == 10 * 2


def test_nan_token_backward_keeps_the_other_tokens_gradients():
    block, ours = _hf_block("mixtral")
    ours.load_state_dict(block.state_dict())
    x = torch.randn(1, 6, 16, generator=torch.Generator().manual_seed(5))
    x[0, 4] = float("nan")
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    block(xa).nansum().backward()
    ours(xb).nansum().backward()
    assert torch.equal(torch.isnan(xb.grad), torch.isnan(xa.grad))
    fine = ~torch.isnan(xa.grad)
    torch.testing.assert_close(xb.grad[fine], xa.grad[fine], rtol=1e-5, atol=1e-5)


def test_experts_drop_and_count_invalid_indices():
    # An index outside [0, E) (a router bug, or transformers' "dropped" slot E) adds nothing and is counted.
    from wavefront.nn import MoEExperts

    torch.manual_seed(0)
    experts = MoEExperts(E, H, I)
    x = torch.randn(5, H)
    idx = torch.tensor([[0, 1], [2, E], [3, -1], [1, 2], [E, 0]])
    w = torch.rand(5, 2)
    out = experts(x, idx, w)
    kept = ((idx >= 0) & (idx < E))
    expect = experts(x, torch.where(kept, idx, 0), torch.where(kept, w, 0.0))
    torch.testing.assert_close(out, expect)
    assert int(experts.dropped_assignments) == 3
    assert int(experts.tokens_per_expert.sum()) == 7 + 10  # the kept ones, then all ten of the second call
