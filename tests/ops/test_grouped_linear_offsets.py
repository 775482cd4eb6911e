"""grouped_linear with offsets out of range: negative, past T, decreasing at the end. Nothing is read or written
outside x, the weights or the outputs (memcheck where this build has it), and the result is the reference's on
the offsets' running maximum clamped to [0, T] (a negative or decreasing end is an empty group, groups never
overlap, the padding rows after the largest end are zero)."""

from __future__ import annotations

import contextlib

import pytest
import torch

from wavefront import ops, reference


def _checked():
    try:
        from wavefront.memcheck import checking
    except ImportError:
        return contextlib.nullcontext()
    return checking()


OFFSETS = {
    "negative_first": [-6, 5, 9, 12],
    "negative_middle": [3, -2, 7, 12],
    "past_t": [4, 8, 40, 2 ** 30],
    "decreasing_tail": [5, 12, 3, 1],
    "decreasing_then_up": [6, 2, 9, 11],
    "all_negative": [-1, -5, -(2 ** 30), -3],
}


@pytest.mark.parametrize("path", ["tma", "pointer"])
@pytest.mark.parametrize("activation", [None, "swiglu"])
@pytest.mark.parametrize("name", list(OFFSETS), ids=list(OFFSETS))
def test_offsets_out_of_range_stay_in_bounds(name, activation, path, monkeypatch):
    from wavefront.kernels import grouped_linear as kernels

    if path == "pointer":
        monkeypatch.setattr(kernels, "_tma_ok", lambda *tensors: False)
    gen = torch.Generator().manual_seed(0)
    T, K, N, E = 12, 16, 16, 4
    x = torch.randn(T, K, generator=gen).requires_grad_()
    w = (torch.randn(E, N, K, generator=gen) * 0.3).requires_grad_()
    offsets = torch.tensor(OFFSETS[name], dtype=torch.int64)
    clamped = torch.cummax(offsets.clamp(0, T), 0).values
    with _checked():
        y = ops.grouped_linear(x, w, offsets, activation=activation)
        dy = torch.randn(y.shape, generator=gen)
        dx, dw = torch.autograd.grad(y, (x, w), dy)
    xr, wr = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    yr = reference.grouped_linear(xr, wr, clamped, activation)
    dxr, dwr = torch.autograd.grad(yr, (xr, wr), dy.double())
    torch.testing.assert_close(y.double(), yr, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dx.double(), dxr, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dw.double(), dwr, rtol=1e-5, atol=1e-5)
