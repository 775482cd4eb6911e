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


# --- muP multipliers (Falcon-H1's mlp_multipliers) -------------------------------------------------------

def test_gate_multiplier_rounds_like_falcon_h1():
    """Falcon-H1: ``up * act(gate_proj(x) * m_g)``: the scaled gate is a bf16 tensor before the activation."""
    gen = torch.Generator().manual_seed(1)
    gate = (torch.randn(16, 320, generator=gen) * 2).bfloat16()
    up = torch.randn(16, 320, generator=gen).bfloat16()
    m_g = 0.3535
    scaled = gate * m_g  # rounded to bf16, as the model computes it
    assert torch.equal(swiglu(gate, up, gate_multiplier=m_g), swiglu(scaled, up))
    assert torch.equal(geglu(gate, up, gate_multiplier=m_g), geglu(scaled, up))
    assert not torch.equal(swiglu(gate, up, gate_multiplier=m_g), swiglu(gate, up))


def test_unit_multipliers_launch_the_kernel_without_them():
    from wavefront.kernels._launch import recording

    g, u = torch.randn(4, 64), torch.randn(4, 64)
    with recording() as launches:
        plain = swiglu(g, u)
        ones = swiglu(g, u, gate_multiplier=1, output_multiplier=1.0)
        scaled = swiglu(g, u, output_multiplier=2.0)
    assert [launch.constexprs["SCALED"] for launch in launches] == [False, False, True]
    assert torch.equal(plain, ones)
    assert torch.equal(scaled, (2.0 * plain))  # a power of two: exact in fp32


@pytest.mark.parametrize("op", ["swiglu", "geglu"])
def test_multipliers_under_compile_against_float64(op):
    """Both multipliers inside torch.compile(fullgraph=True), forward and backward in bf16, against float64:
    our error at most 2x eager's (Falcon-H1's module ops in bf16) plus one ulp, the accuracy rule."""
    from wavefront import reference
    from wavefront.ops._spec import Tolerance

    torch._dynamo.reset()
    mults = {"gate_multiplier": 0.42, "output_multiplier": 1.9}
    gen = torch.Generator().manual_seed(2)
    g64, u64, dy64 = ((torch.randn(8, 200, generator=gen, dtype=torch.float64) * s) for s in (2.0, 1.0, 1.0))
    ours = torch.compile(lambda g, u: (swiglu if op == "swiglu" else geglu)(g, u, **mults), backend="aot_eager",
                         fullgraph=True)
    eager = getattr(reference, f"{op}_eager")

    def run(fn, dtype):
        g, u = (t.detach().to(dtype).clone().requires_grad_() for t in (g64, u64))
        y = fn(g, u)
        y.backward(dy64.to(dtype))
        return y.detach().double(), g.grad.double(), u.grad.double()

    ref, got, base = run(lambda g, u: eager(g, u, **mults), torch.float64), run(ours, torch.bfloat16), \
        run(lambda g, u: eager(g, u, **mults), torch.bfloat16)
    for name, r, o, e in zip(("y", "dgate", "dup"), ref, got, base, strict=True):
        bound = Tolerance().bound((e - r).abs().max().item(), r.abs().max().item(), torch.bfloat16)
        assert (o - r).abs().max().item() <= bound, name


@pytest.mark.parametrize("value", [float("nan"), float("inf"), "2", None, True])
def test_bad_multiplier_is_named(value):
    with pytest.raises(ValueError, match=r"swiglu: argument 'gate_multiplier' must be a finite number"):
        swiglu(torch.randn(2, 8), torch.randn(2, 8), gate_multiplier=value)
