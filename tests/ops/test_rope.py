"""rope beyond the registry sweep: Hugging Face equivalence, the backward as the negated rotation,
position sources (ids, packed cu_seqlens), one launch for q and k, bad input, out-of-table positions."""

from __future__ import annotations

import pytest
import torch

from wavefront.kernels._launch import recording
from wavefront.ops import rope


def _hf_rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def _hf_apply(q, k, cos, sin, unsqueeze_dim=1):
    # transformers' apply_rotary_pos_emb, written out (transformers is not a test dependency).
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return q * cos + _hf_rotate_half(q) * sin, k * cos + _hf_rotate_half(k) * sin


def _hf_cos_sin(position_ids, dim, base=10000.0):
    # LlamaRotaryEmbedding: inv_freq outer positions, cat(freqs, freqs), cos and sin.
    inv_freq = 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    freqs = position_ids[..., None].float() * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def test_matches_hf_apply_rotary_pos_emb():
    torch.manual_seed(0)
    q, k = torch.randn(2, 8, 10, 64), torch.randn(2, 2, 10, 64)
    cos, sin = _hf_cos_sin(torch.arange(10).expand(2, 10) + 3, 64)
    q_out, k_out = rope(q, k, cos, sin)
    q_ref, k_ref = _hf_apply(q, k, cos, sin)
    torch.testing.assert_close(q_out, q_ref)
    torch.testing.assert_close(k_out, k_ref)


def test_backward_is_rotation_by_the_negated_angle():
    torch.manual_seed(1)
    q = torch.randn(1, 4, 6, 32, requires_grad=True)
    k = torch.randn(1, 2, 6, 32, requires_grad=True)
    cos, sin = _hf_cos_sin(torch.arange(6)[None], 32)
    q_out, k_out = rope(q, k, cos, sin)
    dq, dk = torch.randn_like(q_out), torch.randn_like(k_out)
    torch.autograd.backward((q_out, k_out), (dq, dk))
    expect_q, expect_k = _hf_apply(dq, dk, cos, -sin)
    torch.testing.assert_close(q.grad, expect_q)
    torch.testing.assert_close(k.grad, expect_k)


def test_one_launch_for_q_and_k_each_way():
    q = torch.randn(1, 4, 5, 32, requires_grad=True)
    k = torch.randn(1, 2, 5, 32, requires_grad=True)
    cos, sin = _hf_cos_sin(torch.arange(5), 32)
    with recording() as launches:
        q_out, k_out = rope(q, k, cos, sin)
        (q_out.sum() + k_out.sum()).backward()
    assert [launch.name for launch in launches] == ["_rope_kernel", "_rope_kernel"]
    assert [launch.constexprs["BACKWARD"] for launch in launches] == [False, True]


def test_position_ids_equal_gathered_rows():
    torch.manual_seed(2)
    q, k = torch.randn(2, 4, 7, 64), torch.randn(2, 4, 7, 64)
    table_cos, table_sin = _hf_cos_sin(torch.arange(100), 64)
    pos = torch.randint(0, 100, (2, 7))
    by_ids = rope(q, k, table_cos, table_sin, position_ids=pos)
    direct = rope(q, k, table_cos[pos], table_sin[pos])
    for a, b in zip(by_ids, direct, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_packed_cu_seqlens_restart_positions():
    torch.manual_seed(3)
    lengths = [3, 6, 4]
    q, k = torch.randn(sum(lengths), 4, 32), torch.randn(sum(lengths), 2, 32)
    cos, sin = _hf_cos_sin(torch.arange(16), 32)
    cu = torch.tensor([0, 3, 9, 13], dtype=torch.int32)
    q_out, k_out = rope(q, k, cos, sin, cu_seqlens=cu)
    start = 0
    for n in lengths:
        # Each sequence on its own, in the HF layout: positions 0..n-1.
        qs = q[start:start + n].transpose(0, 1)[None]
        ks = k[start:start + n].transpose(0, 1)[None]
        q_ref, k_ref = _hf_apply(qs, ks, cos[:n][None], sin[:n][None])
        torch.testing.assert_close(q_out[start:start + n], q_ref[0].transpose(0, 1))
        torch.testing.assert_close(k_out[start:start + n], k_ref[0].transpose(0, 1))
        start += n


def test_partial_rotary_passes_the_tail_through_and_k_may_be_none():
    q = torch.randn(2, 3, 5, 64)
    cos, sin = _hf_cos_sin(torch.arange(5), 16)
    q_out, k_out = rope(q, None, cos, sin)
    assert k_out is None
    assert torch.equal(q_out[..., 16:], q[..., 16:])
    q_ref, _ = _hf_apply(q[..., :16], q[..., :16], cos[None], sin[None])
    torch.testing.assert_close(q_out[..., :16], q_ref)


def test_out_of_table_position_poisons_its_token_only():
    # Where the range check would need a device sync the kernel reads row 0 instead of out of bounds and
    # writes NaN for that token: the bug is visible, memory is safe.
    from wavefront.kernels import rope as kernels

    q = torch.randn(4, 2, 32)
    cos, sin = _hf_cos_sin(torch.arange(8), 32)
    pos = torch.tensor([1, 50, 3, -2])
    q_out, _ = kernels.rope(q, None, cos, sin, kernels.POS_IDS, pos, False)
    assert torch.isnan(q_out[1]).all() and torch.isnan(q_out[3]).all()
    good = rope(q[[0, 2]], None, cos, sin, position_ids=pos[[0, 2]])[0]
    torch.testing.assert_close(q_out[[0, 2]], good)


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"q": torch.randn(2, 2, 2, 3, 8)}, ValueError, r"rope: argument 'q' must be \[batch, heads, seq, head_dim\]"),
    ({"k": torch.randn(2, 2, 5, 16)}, ValueError, r"'k' must match 'q' in every dim but the heads"),
    ({"k": torch.randn(2, 2, 4, 32, dtype=torch.float64)}, TypeError, r"'k' must have the dtype of 'q'"),
    ({"cos": torch.randn(5, 32), "sin": torch.randn(5, 32)}, ValueError, r"'cos' must have shape"),
    ({"cos": torch.randn(4, 7), "sin": torch.randn(4, 7)}, ValueError, r"rotary dim .* must be even"),
    ({"cos": torch.randn(4, 34), "sin": torch.randn(4, 34)}, ValueError, r"rotary dim .* \[2, head_dim=32\]"),
    ({"sin": torch.randn(4, 16)}, ValueError, r"'sin' must have the shape of 'cos'"),
    ({"position_ids": torch.tensor([[0, 1, 2, 9]] * 2), "cos": torch.randn(9, 32), "sin": torch.randn(9, 32)},
     ValueError, r"'position_ids' reaches position 9 but the cos/sin table has 9 rows"),
    ({"position_ids": torch.zeros(3, dtype=torch.long), "cos": torch.randn(9, 32), "sin": torch.randn(9, 32)},
     ValueError, r"'position_ids' must have shape"),
    ({"cu_seqlens": torch.tensor([0, 4])}, ValueError, r"'cu_seqlens' needs the packed layout"),
])
def test_bad_input_is_named(kwargs, error, match):
    args = {"q": torch.randn(2, 4, 4, 32), "k": torch.randn(2, 2, 4, 32), "cos": torch.randn(4, 32),
            "sin": torch.randn(4, 32)}
    args.update(kwargs)
    with pytest.raises(error, match=match):
        rope(args.pop("q"), args.pop("k"), args.pop("cos"), args.pop("sin"), **args)


@pytest.mark.parametrize(("cu", "match"), [
    ([0, 3, 5], r"must rise from 0 to the token count 6"),
    ([1, 3, 6], r"must rise from 0 to the token count 6"),
    ([0, 4, 3, 6], r"must rise from 0 to the token count 6"),
    ([0, 6], r"'cu_seqlens' reaches position 5 but the cos/sin table has 4 rows"),
])
def test_bad_cu_seqlens(cu, match):
    q = torch.randn(6, 2, 16)
    cos, sin = _hf_cos_sin(torch.arange(4), 16)
    with pytest.raises(ValueError, match=match):
        rope(q, None, cos, sin, cu_seqlens=torch.tensor(cu))


_MALFORMED = [[0, 2, 1, 6], [2, 6], [0, 3, 9]]  # decreasing, not starting at 0, past the token count


@pytest.mark.parametrize("cu", _MALFORMED)
def test_malformed_cu_seqlens_refused_under_torch_compile(cu):
    # Issue #13 defect 2: eager CPU refused these, torch.compile returned output. The check now lives in the
    # custom op's body, which runs with real values under compile too (and on the device on a GPU).
    q = torch.randn(6, 2, 16)
    cos, sin = _hf_cos_sin(torch.arange(8), 16)
    compiled = torch.compile(lambda q, cu: rope(q, None, cos, sin, cu_seqlens=cu)[0], fullgraph=True)
    with pytest.raises(ValueError, match=r"'cu_seqlens' must rise from 0 to the token count 6"):
        compiled(q, torch.tensor(cu))


@pytest.mark.parametrize(("cu", "ok"), [([0, 2, 6], True), *((cu, False) for cu in _MALFORMED), ([0, 6], False)])
def test_device_form_of_the_cu_seqlens_check(cu, ok):
    # The GPU form (no host sync: torch._assert_async) judges like the host form; on the CPU its assert
    # raises at once, which lets the rule be tested here. [0, 6] outruns a 4-row table.
    from wavefront.ops.rope import check_cu_seqlens

    def run():
        check_cu_seqlens(torch.tensor(cu), 6, 4 if cu == [0, 6] else 8, on_device=True)

    if ok:
        run()
    else:
        with pytest.raises(RuntimeError):
            run()
