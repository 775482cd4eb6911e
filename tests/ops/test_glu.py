"""swiglu / geglu beyond the registry sweep: Hugging Face's rounding order, fused layouts, bad input."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from wavefront.ops import geglu, swiglu


def _gelu_tanh_exact(g):
    # 1 + tanh(u) = 2 sigmoid(2u): no cancellation in the negative tail, where float64 F.gelu returns -0.
    return g * torch.sigmoid(2 * 0.7978845608028654 * (g + 0.044715 * g ** 3))


def _gelu_erf_exact(g):
    return 0.5 * g * torch.special.erfc(-g / 2 ** 0.5)


@pytest.mark.parametrize(("op", "act", "exact_act"), [
    (swiglu, F.silu, F.silu),
    (lambda g, u: geglu(g, u, "tanh"), lambda g: F.gelu(g, approximate="tanh"), _gelu_tanh_exact),
    (lambda g, u: geglu(g, u, "none"), F.gelu, _gelu_erf_exact),
])
def test_bf16_rounding_order_is_hf(op, act, exact_act):
    # HF: act(gate) is a bf16 tensor, then times up (a bf16 product). One rounding after an fp32 product
    # (Liger before PR #783) gives different bits; the last assertion shows this test tells them apart.
    gen = torch.Generator().manual_seed(0)
    gate = (torch.randn(64, 256, generator=gen) * 2).bfloat16()
    up = torch.randn(64, 256, generator=gen).bfloat16()
    ours = op(gate, up)
    a = op(gate, torch.ones_like(up))  # our activation, rounded to bf16 (times 1 is exact)
    assert torch.equal(ours, a * up)
    # The activation itself, element by element, is as close to float64 as torch's bf16 value, give or take
    # one ulp (the fp32 evaluations differ; near gelu's tail torch's 1 + tanh cancels to 0, ours does not).
    exact = exact_act(gate.double())
    ulp = torch.finfo(torch.bfloat16).eps * exact.abs()
    assert ((a.double() - exact).abs() <= (act(gate).double() - exact).abs() + ulp).all()
    assert not torch.equal(ours, (act(gate.float()) * up.float()).bfloat16())


def test_fused_projection_halves_without_copy():
    both = torch.randn(10, 2 * 96)
    gate, up = both[:, :96], both[:, 96:]
    g, u = gate.clone().requires_grad_(), up.clone().requires_grad_()
    fused = both.clone().requires_grad_()
    out = swiglu(fused[:, :96], fused[:, 96:])
    expect = F.silu(g) * u
    torch.testing.assert_close(out, expect)
    dy = torch.randn_like(out)
    out.backward(dy)
    expect.backward(dy)
    torch.testing.assert_close(fused.grad[:, :96], g.grad)
    torch.testing.assert_close(fused.grad[:, 96:], u.grad)


@pytest.mark.parametrize(("call", "error", "match"), [
    (lambda: swiglu(torch.randn(4, 8), torch.randn(4, 9)), ValueError,
     r"swiglu: argument 'up' must have shape \(4, 8\)"),
    (lambda: swiglu(torch.randn(4, 8), torch.randn(4, 8, dtype=torch.float64)), TypeError,
     r"swiglu: argument 'up' must have the dtype of 'gate'"),
    (lambda: swiglu(torch.ones(4, 8, dtype=torch.int32), torch.ones(4, 8, dtype=torch.int32)), TypeError,
     r"swiglu: argument 'gate' must have dtype"),
    (lambda: geglu(torch.randn(4, 8), torch.randn(4, 8), approximate="erf"), ValueError,
     r"geglu: argument 'approximate' must be one of"),
    (lambda: swiglu([1.0], torch.randn(1)), TypeError, r"swiglu: argument 'gate' must be a torch.Tensor"),
])
def test_bad_input_is_named(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_empty_batch():
    out = swiglu(torch.randn(0, 16, requires_grad=True), torch.randn(0, 16))
    assert out.shape == (0, 16)


@pytest.mark.parametrize("arch_name", ["sm_80", "sm_90", "sm_100", "gfx90a", "gfx942", "gfx1100"])
def test_launch_configs_give_whole_16_byte_vectors(arch_name):
    # Pure config functions: every thread of a full block owns whole 16-byte vectors (the precondition for
    # 128-bit loads), and num_warps fits the architecture.
    from wavefront.kernels.adamw import adamw_config
    from wavefront.kernels.glu import glu_config
    from wavefront.kernels.rope import rope_config
    from wavefront.runtime import get_arch

    arch = get_arch(arch_name)
    for dtype, per_vector in ((torch.bfloat16, 8), (torch.float32, 4)):
        for n_cols in (14336, 28672, 18944):
            cfg = glu_config(n_cols, dtype, arch)
            assert cfg.num_warps <= arch.max_num_warps
            assert (cfg.BLOCK_N // (cfg.num_warps * arch.warp_size)) % per_vector == 0, cfg
        cfg = adamw_config(dtype, arch)
        assert cfg.num_warps <= arch.max_num_warps
        assert (cfg.BLOCK // (cfg.num_warps * arch.warp_size)) % per_vector == 0, cfg
        for heads, kv in ((32, 8), (64, 8), (128, 8), (28, 4)):
            cfg = rope_config(heads, kv, 128, 128, dtype, arch)
            threads = cfg.num_warps * arch.warp_size
            assert cfg.num_warps <= arch.max_num_warps
            assert (cfg.BLOCK_HQ * cfg.BLOCK_HALF) // threads >= per_vector, cfg
            # k's tile gets whole vectors unless the cap on q values per thread (32) needs more threads.
            ratio = cfg.BLOCK_HQ // cfg.BLOCK_HK
            if ratio * per_vector <= 32:
                assert (cfg.BLOCK_HK * cfg.BLOCK_HALF) // threads >= per_vector, cfg
