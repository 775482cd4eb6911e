"""ops.linear_fp8 with operands given pre-quantized (ops.Quantized, in ops.quantize's layout): bit-identical to
the op quantizing them itself, forward and backward (the FP8 copies are forward-only shortcuts); the FSDP2
entry points (forward_prequantized / backward_prequantized) equal the op; clear errors for a copy in the wrong
layout."""

from __future__ import annotations

import pytest
import torch

from wavefront import ops, reference
from wavefront.ops.linear_fp8 import backward_prequantized, forward_prequantized


def _data(dtype=torch.bfloat16, K=64):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 12, K, generator=gen).to(dtype)
    w = (torch.randn(40, K, generator=gen) * K ** -0.5).to(dtype)
    b = torch.randn(40, generator=gen).to(dtype)
    dy = torch.randn(2, 12, 40, generator=gen).to(dtype)
    return x, w, b, dy


def _quantized(t, recipe, role):
    fmt, scaling, pow2 = reference.fp8_recipe_operand(recipe, role)
    q, s = ops.quantize(t, dtype=fmt, scaling=scaling, pow2_scale=pow2)
    return ops.Quantized(q, s, scaling)


def _bits(t):
    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t.view(torch.int32)


@pytest.mark.parametrize("recipe", ["rowwise", "tensorwise", pytest.param("blockwise", marks=pytest.mark.slow),
                                    pytest.param("mxfp8", marks=pytest.mark.slow)])
@pytest.mark.parametrize("given", ["x", "weight", "both"])
def test_prequantized_operands_are_bit_identical(recipe, given):
    x, w, b, dy = _data(K=256 if recipe == "blockwise" else 64)
    runs = []
    for pre in (False, True):
        xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
        kw = {}
        if pre and given in ("x", "both"):
            kw["x_fp8"] = _quantized(x, recipe, "act")
        if pre and given in ("weight", "both"):
            kw["weight_fp8"] = _quantized(w, recipe, "weight")
        y = ops.linear_fp8(xs, ws, b, recipe=recipe, **kw)
        y.backward(dy)
        runs.append((y.detach(), xs.grad, ws.grad))
    for a, c in zip(*runs, strict=True):
        assert torch.equal(_bits(a), _bits(c))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64])
def test_fsdp_entry_points_equal_the_op(dtype):
    """forward/backward_prequantized with the weight's forward copy and its dx copy (W^T quantized along N):
    the op's numbers bit for bit; float64 takes the reference fallback (the path of CPU runs without Triton)."""
    recipe = "rowwise"
    x, w, b, dy = (t.reshape(-1, t.shape[-1]) if t.dim() == 3 else t for t in _data(torch.bfloat16))
    if dtype == torch.float64:
        x, w, b, dy = (t.double() for t in (x, w, b, dy))
        wq = ops.Quantized(*reference.fp8_quantize(w, dtype="e4m3", scaling="rowwise", pow2_scale=True), "rowwise")
        wtq = ops.Quantized(*reference.fp8_quantize(w.t(), dtype="e4m3", scaling="rowwise", pow2_scale=True),
                            "rowwise")
    else:
        wq, wtq = _quantized(w, recipe, "weight"), _quantized(w.t().contiguous(), recipe, "weight")
    xs, ws, bs = x.clone().requires_grad_(), w.clone().requires_grad_(), b.clone().requires_grad_()
    y = ops.linear_fp8(xs, ws, bs, recipe=recipe)
    y.backward(dy)
    y2 = forward_prequantized(x, wq, b, None, recipe, False, "auto")
    dx, dw, db = backward_prequantized(dy, x, wtq, tuple(w.shape), w.dtype, recipe, False, "auto", (True, True, True))
    for ours, want in ((y2, y), (dx, xs.grad), (dw, ws.grad), (db, bs.grad)):
        assert torch.equal(ours, want)
    none = backward_prequantized(dy, x, None, tuple(w.shape), w.dtype, recipe, False, "auto", (False, True, False))
    assert none[0] is None and torch.equal(none[1], ws.grad) and none[2] is None
    with pytest.raises(ValueError, match="needs the weight's backward FP8 copy"):
        backward_prequantized(dy, x, None, tuple(w.shape), w.dtype, recipe, False, "auto", (True, False, False))


def test_wrong_layouts_are_refused():
    x, w, _, _ = _data()
    good = _quantized(x, "rowwise", "act")
    with pytest.raises(TypeError, match="'x_fp8' must be a wavefront.ops.Quantized"):
        ops.linear_fp8(x, w, x_fp8=(good.data, good.scale))
    with pytest.raises(ValueError, match="'x_fp8' must be .*rowwise scales.*got .* tensorwise"):
        ops.linear_fp8(x, w, x_fp8=_quantized(x, "tensorwise", "act"))
    q5 = ops.Quantized(good.data.to(torch.float8_e5m2), good.scale, "rowwise")
    with pytest.raises(ValueError, match="e4m3 data"):
        ops.linear_fp8(x, w, x_fp8=q5)
    with pytest.raises(ValueError, match=r"'weight_fp8.scale' must be float32 of shape \(40, 1\)"):
        wq = _quantized(w, "rowwise", "weight")
        ops.linear_fp8(x, w, weight_fp8=ops.Quantized(wq.data, wq.scale.view(-1), "rowwise"))
    with pytest.raises(ValueError, match=r"data of shape \(40, 64\)"):
        ops.linear_fp8(x, w, weight_fp8=_quantized(w[:20], "rowwise", "weight"))


def test_prequantized_operands_compile_fullgraph():
    """torch.compile(fullgraph=True) captures the Quantized operands (aot_eager: dynamo and the fake kernels,
    as tests/ops/test_compile.py), forward and backward, bit-identical to eager."""
    x, w, b, dy = _data()
    qx, qw = _quantized(x, "rowwise", "act"), _quantized(w, "rowwise", "weight")

    def fn(x, w, b, qx, qw):
        return ops.linear_fp8(x, w, b, x_fp8=qx, weight_fp8=qw)

    outs = []
    for f in (fn, torch.compile(fn, backend="aot_eager", fullgraph=True)):
        xs, ws = x.clone().requires_grad_(), w.clone().requires_grad_()
        y = f(xs, ws, b, qx, qw)
        y.backward(dy)
        outs.append((y.detach(), xs.grad, ws.grad))
    for a, c in zip(*outs, strict=True):
        assert torch.equal(_bits(a), _bits(c))


def test_attention_fp8_output_feeds_o_proj():
    """ops.attention's FP8 epilogue output (quantize="block1x128") is o_proj's x in the blockwise recipe's
    layout: passed as x_fp8 it gives the output of quantizing x in the op, bit for bit."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, 8, 128, generator=gen).bfloat16() for _ in range(3))
    out, out_fp8, out_scale = ops.attention(q, k, v, causal=True, quantize="block1x128")
    x = out.transpose(1, 2).reshape(1, 8, 128)
    w = (torch.randn(24, 128, generator=gen) / 11).bfloat16()
    y = ops.linear_fp8(x, w, recipe="blockwise", x_fp8=ops.Quantized(out_fp8, out_scale, "block1x128"))
    assert torch.equal(_bits(y), _bits(ops.linear_fp8(x, w, recipe="blockwise")))
