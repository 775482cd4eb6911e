"""FP8 quantization: the interpreter's fp8 casts against PyTorch's, saturation, power-of-two scales, zero
and non-finite groups, and input validation. Bit-exactness against the reference on every registered case
is in test_accuracy.py (the quantize spec's tolerance has no floor)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import triton
import triton.language as tl

from wavefront import ops, reference
from wavefront.kernels._launch import launch

FORMATS = {"e4m3": (torch.float8_e4m3fn, tl.float8e4nv), "e5m2": (torch.float8_e5m2, tl.float8e5),
           "e4m3fnuz": (torch.float8_e4m3fnuz, tl.float8e4b8), "e5m2fnuz": (torch.float8_e5m2fnuz, tl.float8e5b16)}


@triton.jit
def _round_trip(x_ptr, q_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(q_ptr + offs, x.to(q_ptr.dtype.element_ty), mask=mask)
    q = tl.load(q_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, q.to(tl.float32), mask=mask)


def _finite_codes(fmt: torch.dtype) -> torch.Tensor:
    values = torch.arange(256, dtype=torch.uint8).view(fmt).float()
    return values[torch.isfinite(values)].unique()


@pytest.mark.parametrize("name", sorted(FORMATS))
@pytest.mark.parametrize("src", [torch.float32, torch.bfloat16])
def test_interpreter_fp8_casts_round_like_torch(name, src):
    """Every finite code, every midpoint between neighbours (the ties: round to even) and points a third of
    the way between them, through a kernel's cast and back: bit-identical to torch's float8 casts, which
    round to nearest even with the formats' subnormals and FNUZ encodings, as the GPUs' cvt instructions do
    for in-range values."""
    fmt = FORMATS[name][0]
    codes = _finite_codes(fmt)
    mids = (codes[1:] + codes[:-1]) / 2
    thirds = codes[:-1] + (codes[1:] - codes[:-1]) / 3
    x = torch.cat([codes, mids, thirds]).to(src)
    q = torch.empty(x.shape, dtype=fmt)
    y = torch.empty(x.shape, dtype=torch.float32)
    launch(_round_trip, (triton.cdiv(x.numel(), 1024),), x_ptr=x, q_ptr=q, y_ptr=y, n=x.numel(),
           constexprs=dict(BLOCK=1024), options={"num_warps": 4})
    expect = x.to(fmt)
    assert torch.equal(q.view(torch.uint8), expect.view(torch.uint8))
    assert torch.equal(y, expect.float())


def _overflowing_amax(fp8_max: float) -> float:
    """An fp32 amax whose scaled value fp32(amax * fp32(fp8_max / amax)) lands above fp8_max."""
    for k in range(1, 200_000):
        amax = torch.tensor(1.0 + k * 2.0 ** -23, dtype=torch.float32) * 3.0
        scale = torch.tensor(fp8_max, dtype=torch.float32) / amax
        if float(amax * scale) > fp8_max:
            return float(amax)
    raise AssertionError("no overflowing amax found")


@pytest.mark.parametrize("name", ["e4m3", "e4m3fnuz"])
def test_saturates_where_the_scaled_amax_rounds_past_the_max(name):
    """fp32(amax * s) can exceed FP8_MAX by an fp32 ulp: the codes are the max, never inf or NaN."""
    fmt = FORMATS[name][0]
    fp8_max = torch.finfo(fmt).max
    amax = _overflowing_amax(fp8_max)
    x = torch.tensor([[amax, -amax, 0.5]], dtype=torch.float32)
    q, scale = ops.quantize(x, dtype=name, scaling="rowwise")
    assert q.float()[0, :2].tolist() == [fp8_max, -fp8_max]
    assert float(x[0, 0] * scale[0, 0]) > fp8_max, "the scaled amax is past the max (test premise)"


def test_pow2_scales_are_the_power_of_two_below_the_scale():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(16, 64, generator=gen) * torch.logspace(-4, 4, 16)[:, None]
    _, exact = ops.quantize(x, scaling="rowwise")
    _, pow2 = ops.quantize(x, scaling="rowwise", pow2_scale=True)
    mantissa, _ = torch.frexp(pow2)
    assert torch.all(mantissa == 0.5), "a power of two"
    assert torch.all(pow2 <= exact) and torch.all(pow2 > exact / 2)


def test_zero_groups_get_finite_scales_and_zero_codes():
    x = torch.zeros(4, 256)
    x[1, 128:] = torch.linspace(-1, 1, 128)
    q, scale = ops.quantize(x, scaling="block1x128")
    assert torch.isfinite(scale).all()
    assert scale[0, 0] == torch.tensor(448.0) / torch.tensor(reference.FP8_EPS, dtype=torch.float32)
    assert torch.equal(q.float()[0], torch.zeros(256)) and q.float()[1, 128:].abs().max() == 448.0


def test_non_finite_inputs_as_stated():
    """The amax ignores NaN (so a NaN stays one NaN code); an inf makes its group's scale 0, its own code
    NaN (inf * 0) and the group's other codes 0. Other groups are untouched (kernels/quantize.py)."""
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(1))
    x[0, 5] = float("inf")
    x[1, 7] = float("nan")
    q, scale = ops.quantize(x, scaling="rowwise")
    ref_q, ref_s = reference.fp8_quantize(x, scaling="rowwise")
    nan = torch.isnan(q.float())
    assert nan.nonzero().tolist() == [[0, 5], [1, 7]] and torch.equal(nan, torch.isnan(ref_q.float()))
    assert scale[0, 0] == 0 and torch.all(q.float()[0, ~nan[0]] == 0)
    assert torch.equal(scale, ref_s)
    assert torch.equal(q.float()[~nan], ref_q.float()[~nan])
    clean, _ = ops.quantize(torch.cat([x[1:2, :7], x[1:2, 8:]], 1), scaling="rowwise")
    assert torch.equal(torch.cat([q[1:2, :7], q[1:2, 8:]], 1).float(), clean.float()), "NaN left the scale alone"


def test_dequantized_error_is_half_an_fp8_ulp():
    """The grid: |q / s - x| <= 2^-4 |x| (e4m3 keeps 3 mantissa bits) for normal values, per 1x128 tile."""
    x = torch.randn(8, 384, generator=torch.Generator().manual_seed(2))
    q, s = ops.quantize(x, scaling="block1x128")
    deq = reference.fp8_dequantize(q, s, "block1x128")
    normal = (x.double().abs() * s.repeat_interleave(128, 1).double()) >= 2.0 ** -6
    err = (deq - x.double()).abs()[normal] / x.double().abs()[normal]
    assert 0 < float(err.max()) <= 2.0 ** -4


@pytest.mark.parametrize("scaling", ["tensorwise", "block1x128"])
def test_fp16_inputs_are_bit_exact(scaling):
    """The registry checks fp32 and bf16; fp16 (a 16-bit load widened to fp32 like bf16) here."""
    x = (torch.randn(24, 200, generator=torch.Generator().manual_seed(5)) * 30).half()
    q, s = ops.quantize(x, dtype="e5m2", scaling=scaling)
    ref_q, ref_s = reference.fp8_quantize(x, dtype="e5m2", scaling=scaling)
    assert torch.equal(q.view(torch.uint8), ref_q.view(torch.uint8)) and torch.equal(s, ref_s)


@pytest.mark.parametrize(("kwargs", "match"), [
    (dict(dtype="e4m3fn"), "'dtype' must be one of"),
    (dict(scaling="columnwise"), "'scaling' must be one of"),
])
def test_bad_options_name_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ops.quantize(torch.randn(4, 8), **kwargs)


def test_bad_inputs_name_the_argument():
    with pytest.raises(TypeError, match="quantize: argument 'x' must have dtype"):
        ops.quantize(torch.ones(4, 8, dtype=torch.int32))
    with pytest.raises(ValueError, match="block128x128.*2-D"):
        ops.quantize(torch.randn(2, 4, 8), scaling="block128x128")


def test_ampere_is_refused_clearly_and_not_inspected():
    """Triton has no OCP e4m3 before sm_89: the ops say so by name instead of a compiler trace, and inspect
    plans no sm_80 rows for them (absent, not failures), while Ada/Hopper/AMD stay in."""
    from wavefront import runtime
    from wavefront.archs import compiles_fp8_e4m3
    from wavefront.ops import REGISTRY
    from wavefront.workbench.static.inspect import plan

    assert [compiles_fp8_e4m3(runtime.get_arch(t)) for t in ("sm_80", "sm_90", "gfx90a", "cpu")] == [
        False, True, True, True]
    assert compiles_fp8_e4m3(dataclasses.replace(runtime.get_arch("sm_80"), name="sm_89"))
    x = torch.randn(4, 64)
    with runtime.assume_target("sm_80", 108), pytest.raises(ValueError, match="quantize.*sm_89.*sm_80"):
        ops.quantize(x, scaling="rowwise")
    with runtime.assume_target("sm_80", 108), pytest.raises(ValueError, match="linear_fp8.*sm_89.*sm_80"):
        ops.linear_fp8(x, torch.randn(32, 64))
    spec = REGISTRY["quantize"]
    planned = plan([spec], ["sm_80", "sm_90"], torch.bfloat16,
                   cases=lambda s: s.bench_cases[:1])
    assert planned and {p.target for p in planned} == {"sm_90"}
