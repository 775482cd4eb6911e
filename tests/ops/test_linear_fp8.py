"""FP8 linear beyond the registry's accuracy rule: against torch._scaled_mm on the same quantized operands
(CPU has it for tensorwise and rowwise scales), the vendor provider path, the error against the bf16
linear (what FP8 costs), the provider rule and input validation."""

from __future__ import annotations

import pytest
import torch

from wavefront import ops, reference
from wavefront.kernels.linear_fp8 import fp8_gemm_provider
from wavefront.runtime import get_arch


def _data(M=48, N=40, K=64, dtype=torch.bfloat16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=gen).to(dtype)
    w = (torch.randn(N, K, generator=gen) * K ** -0.5).to(dtype)
    return x, w


def _ulp(t: torch.Tensor) -> float:
    return torch.finfo(t.dtype).eps * float(t.float().abs().max())


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_forward_matches_torch_scaled_mm(recipe):
    """Same quantized operands through torch._scaled_mm (dequantization scales 1/s): the outputs agree to
    the bf16 output rounding (the two sum in different orders in fp32)."""
    x, w = _data()
    y = ops.linear_fp8(x, w, recipe=recipe)
    fmt, scaling, pow2 = reference.fp8_recipe_operand(recipe, "act")
    qx, sx = reference.fp8_quantize(x, dtype=fmt, scaling=scaling, pow2_scale=pow2)
    qw, sw = reference.fp8_quantize(w, dtype=fmt, scaling=scaling, pow2_scale=pow2)
    inv_w = sw.reciprocal() if sw.dim() == 0 else sw.reciprocal().view(1, -1)
    vendor = torch._scaled_mm(qx, qw.t(), scale_a=sx.reciprocal(), scale_b=inv_w, out_dtype=torch.bfloat16)
    assert (y.float() - vendor.float()).abs().max() <= _ulp(vendor)


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_vendor_provider_forward_and_backward(recipe):
    """provider="vendor" runs every product through torch._scaled_mm: same results as ours to the output
    rounding, forward and both gradients."""
    x, w = _data(32, 48, 64)
    dy = torch.randn(32, 48, generator=torch.Generator().manual_seed(3)).bfloat16()
    got = {}
    for provider in ("wavefront", "vendor"):
        xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
        y = ops.linear_fp8(xs, ws, recipe=recipe, provider=provider)
        y.backward(dy)
        got[provider] = (y.detach(), xs.grad, ws.grad)
    for ours, vendor in zip(got["wavefront"], got["vendor"], strict=True):
        assert (ours.float() - vendor.float()).abs().max() <= 2 * _ulp(vendor)


@pytest.mark.parametrize(("recipe", "fwd_rel", "bwd_rel"), [
    # Relative Frobenius error vs the bf16 linear. e4m3 keeps 3 mantissa bits: one rounding has a relative
    # rms error of about 2^-4 / sqrt(3) = 3.6% per operand, ~5% for a product of two (independent errors
    # add in quadrature); e5m2 gradients (2 bits) double the gradient's share. Bounds: 1.5x that estimate.
    ("tensorwise", 0.075, 0.15),
    ("rowwise", 0.075, 0.075),
    pytest.param("blockwise", 0.075, 0.075, marks=pytest.mark.slow),
    pytest.param("mxfp8", 0.075, 0.075, marks=pytest.mark.slow),
])
def test_error_against_the_bf16_linear(recipe, fwd_rel, bwd_rel):
    x, w = _data(32, 48, 256)
    dy = torch.randn(32, 48, generator=torch.Generator().manual_seed(4)).bfloat16()
    outs = {}
    for name, fn in (("fp8", lambda a, b: ops.linear_fp8(a, b, recipe=recipe)), ("bf16", ops.linear)):
        xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
        y = fn(xs, ws)
        y.backward(dy)
        outs[name] = (y.detach().double(), xs.grad.double(), ws.grad.double())
    rel = [float((a - b).norm() / b.norm()) for a, b in zip(outs["fp8"], outs["bf16"], strict=True)]
    print(f"{recipe}: relative error vs bf16 linear: y {rel[0]:.4f} dx {rel[1]:.4f} dW {rel[2]:.4f}")
    assert 1e-3 < rel[0] < fwd_rel, "FP8 forward error out of the expected range (1e-3: it did quantize)"
    assert all(1e-3 < r < bwd_rel for r in rel[1:])


def test_blockwise_kernel_scales_each_k_block():
    """Two K blocks of very different magnitudes: one scale for the whole row would flush the small block
    to zero (or subnormals); the per-block scales keep its contribution, as the float64 reference does."""
    x, w = _data(16, 32, 256, dtype=torch.float32)
    x[:, 128:] *= 1e-4
    w[:, 128:] *= 1e4
    y = ops.linear_fp8(x, w, recipe="blockwise")
    ref = reference.linear_fp8(x.double(), w.double(), recipe="blockwise")
    assert (y.double() - ref).abs().max() <= 4 * torch.finfo(torch.float32).eps * float(ref.abs().max()) * 16
    exact = x.double() @ w.double().t()
    assert float((y.double() - exact).norm() / exact.norm()) < 0.06


def test_provider_rule():
    sm90, sm100, mi300 = get_arch("sm_90"), get_arch("sm_100"), get_arch("gfx942")
    assert fp8_gemm_provider("tensorwise", sm90, torch.bfloat16, 4096, 4096, 4096).provider == "vendor"
    assert fp8_gemm_provider("rowwise", sm100, torch.bfloat16, 4096, 4096, 4096).provider == "vendor"
    assert fp8_gemm_provider("rowwise", sm90, torch.float32, 4096, 4096, 4096).provider == "wavefront"
    assert fp8_gemm_provider("block1x128", sm90, torch.bfloat16, 4096, 4096, 4096).provider == "wavefront"
    assert fp8_gemm_provider("tensorwise", sm90, torch.bfloat16, 4095, 4096, 4096).provider == "wavefront"
    assert fp8_gemm_provider("tensorwise", mi300, torch.bfloat16, 4096, 4096, 4096).provider == "vendor"
    assert fp8_gemm_provider("rowwise", mi300, torch.bfloat16, 4096, 4096, 4096).provider == "wavefront"


def test_fnuz_formats_run_and_match_their_reference():
    x, w = _data(24, 40, 64)
    # blockwise: fp32 scales (with power-of-two scales the two e4m3 grids coincide up to the extremes).
    y = ops.linear_fp8(x, w, recipe="blockwise", fnuz=True)
    ref = reference.linear_fp8(x.double(), w.double(), recipe="blockwise", fnuz=True)
    eager = reference.linear_fp8(x, w, recipe="blockwise", fnuz=True)
    assert (y.double() - ref).abs().max() <= 2 * (eager.double() - ref).abs().max() + _ulp(eager)
    assert not torch.equal(y, ops.linear_fp8(x, w, recipe="blockwise", fnuz=False)), "FNUZ has another grid"


@pytest.mark.parametrize(("kwargs", "exc", "match"), [
    (dict(recipe="deepseek"), ValueError, "'recipe' must be one of"),
    (dict(provider="cublas"), ValueError, "'provider' must be one of"),
    (dict(recipe="blockwise", provider="vendor"), ValueError, "takes tensorwise or rowwise"),
])
def test_bad_options(kwargs, exc, match):
    x, w = _data(4, 8, 16)
    with pytest.raises(exc, match=match):
        ops.linear_fp8(x, w, **kwargs)


def test_bad_shapes_and_dtypes():
    x, w = _data(4, 8, 16)
    with pytest.raises(ValueError, match="last dim of 'x'"):
        ops.linear_fp8(x[:, :8], w)
    with pytest.raises(TypeError, match="'weight' must have the dtype of 'x'"):
        ops.linear_fp8(x, w.float())
    with pytest.raises(ValueError, match="'bias' must have shape"):
        ops.linear_fp8(x, w, torch.zeros(3, dtype=x.dtype))


def test_fnuz_default_follows_the_target():
    """gfx942's matrix units take only FNUZ FP8; with OCP operands its compiler converts them to f16 MFMA
    (what inspect showed before the default followed runtime.assume_target)."""
    from wavefront import runtime
    from wavefront.ops.linear_fp8 import default_fnuz

    assert not default_fnuz("cpu")
    with runtime.assume_target("gfx942", 304):
        assert default_fnuz("cpu")
    with runtime.assume_target("sm_90", 132):
        assert not default_fnuz("cpu")


@pytest.mark.parametrize("provider", ["wavefront", "vendor"])
def test_residual_in_the_epilogue(provider):
    """y = x W^T + b + r with r added to the fp32 accumulator (one rounding; the vendor path adds it after
    _scaled_mm's rounding); dr = dy."""
    x, w = _data(24, 32, 64)
    b = torch.randn(32, generator=torch.Generator().manual_seed(6)).bfloat16()
    r = torch.randn(24, 32, generator=torch.Generator().manual_seed(7)).bfloat16().requires_grad_()
    y = ops.linear_fp8(x, w, b, residual=r, recipe="rowwise", provider=provider)
    ref = reference.linear_fp8(x.double(), w.double(), b.double(), residual=r.detach().double(), recipe="rowwise")
    assert (y.double() - ref).abs().max() <= 2 * _ulp(y)
    dy = torch.randn(24, 32, generator=torch.Generator().manual_seed(8)).bfloat16()
    y.backward(dy)
    assert torch.equal(r.grad, dy)
    with pytest.raises(ValueError, match="'residual' must have the output's shape"):
        ops.linear_fp8(x, w, residual=r[:, :8])
