"""An empty batch is a valid batch for the FP8 linear: M = 0 gives an empty output and zero weight and bias
gradients, K = 0 gives bias (+ residual) and an empty weight gradient, in every recipe, through the op, the
Float8Linear module and the prequantized (FSDP2 FP8 all-gather) products. Before: ZeroDivisionError or
"cannot reshape tensor of 0 elements" from the scale bookkeeping."""

from __future__ import annotations

import importlib

import pytest
import torch

from wavefront import ops, reference

op_module = importlib.import_module("wavefront.ops.linear_fp8")

RECIPES = ("tensorwise", "rowwise", "blockwise", "mxfp8")
SHAPES = {"M0": (0, 64, 32), "K0": (4, 0, 32), "M0_K0": (0, 0, 32), "batched_M0": ((2, 0), 64, 32)}


def _operands(shape, dtype=torch.bfloat16):
    rows, K, N = shape
    lead = rows if isinstance(rows, tuple) else (rows,)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(*lead, K, generator=gen).to(dtype).requires_grad_()
    w = torch.randn(N, K, generator=gen).to(dtype).requires_grad_()
    b = torch.randn(N, generator=gen).to(dtype).requires_grad_()
    r = torch.randn(*lead, N, generator=gen).to(dtype)
    return x, w, b, r


def _check(y, x, w, b, r, dy):
    # y = x W^T + b + r: with K = 0 the product is zero, with M = 0 there is no row.
    assert y.shape == (*x.shape[:-1], w.shape[0]) and y.dtype == x.dtype
    torch.testing.assert_close(y, (b.detach().float() + r.float()).to(y.dtype).expand(y.shape))
    assert x.grad.shape == x.shape and not x.grad.abs().sum()
    assert w.grad.shape == w.shape and not w.grad.abs().sum()
    torch.testing.assert_close(b.grad, dy.float().reshape(-1, w.shape[0]).sum(0).to(b.dtype))


@pytest.mark.parametrize("shape", list(SHAPES), ids=list(SHAPES))
@pytest.mark.parametrize("recipe", RECIPES)
def test_linear_fp8_empty_batch(recipe, shape):
    x, w, b, r = _operands(SHAPES[shape])
    y = ops.linear_fp8(x, w, b, residual=r, recipe=recipe)
    dy = torch.randn(y.shape).to(y.dtype)
    y.backward(dy)
    _check(y, x, w, b, r, dy)


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("shape", ["M0", "K0"])
def test_float8_linear_empty_batch(recipe, shape):
    from wavefront.nn import Float8Linear

    rows, K, N = SHAPES[shape]
    layer = Float8Linear(K, N, recipe=recipe, dtype=torch.bfloat16)
    x = torch.randn(rows, K).to(torch.bfloat16).requires_grad_()
    y = layer(x)
    assert y.shape == (rows, N)
    y.backward(torch.ones_like(y))
    assert x.grad.shape == x.shape
    assert layer.weight.grad.shape == (N, K) and not layer.weight.grad.abs().sum()
    torch.testing.assert_close(layer.bias.grad.float(), torch.full((N,), float(rows)))


@pytest.mark.parametrize("recipe", RECIPES)
def test_prequantized_products_empty_batch(recipe):
    N, K = 32, 64
    w = torch.randn(N, K).to(torch.bfloat16)
    fmt, scaling, pow2 = reference.fp8_recipe_operand(recipe, "weight")
    q, s = reference.fp8_quantize(w, dtype=fmt, scaling=scaling, pow2_scale=pow2)
    qt, st = reference.fp8_quantize(w.t().contiguous(), dtype=fmt, scaling=scaling, pow2_scale=pow2)
    row, col = ops.Quantized(q, s, scaling), ops.Quantized(qt, st, scaling)
    x2 = torch.randn(0, K).to(torch.bfloat16)
    bias = torch.randn(N).to(torch.bfloat16)
    y = op_module.forward_prequantized(x2, row, bias, None, recipe, False, "auto")
    assert y.shape == (0, N)
    dx, dw, db = op_module.backward_prequantized(torch.zeros(0, N, dtype=torch.bfloat16), x2, col, (N, K),
                                                 torch.bfloat16, recipe, False, "auto", (True, True, True))
    assert dx.shape == (0, K) and dw.shape == (N, K) and db.shape == (N,)
    assert not dw.abs().sum() and not db.abs().sum()
