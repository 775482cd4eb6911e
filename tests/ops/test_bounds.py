"""Masks and strides of every registered op: no read or write outside its operands.

The Triton interpreter does not fault on out-of-bounds pointers, so this makes them visible: every
floating input is re-laid (same shape and strides) inside a buffer padded with NaN, so an out-of-bounds
read poisons the outputs; every buffer an op allocates with torch.empty / empty_like / zeros is padded
with a sentinel, so an out-of-bounds write changes a sentinel. Forward and backward run on every
registered case up to MAX_ELEMENTS; outputs and gradients must match an unpadded run (NaN for NaN).
"""

from __future__ import annotations

import pytest
import torch

from wavefront.ops import REGISTRY

PAD = 257  # elements on each side; odd so padded views start unaligned as well
SENTINEL = 7777.0
SENTINEL_FP8 = 224.0  # 7777 overflows the FP8 formats (e4m3fnuz's max is 240); 224 is exact in all four


def _sentinel(dtype: torch.dtype) -> float:
    return SENTINEL_FP8 if dtype.itemsize == 1 else SENTINEL


def _nan_padded(t: torch.Tensor) -> torch.Tensor:
    if not (isinstance(t, torch.Tensor) and t.is_floating_point()) or t.numel() == 0:
        return t
    span = 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride(), strict=True))
    buf = torch.full((span + 2 * PAD,), float("nan"), dtype=t.dtype)
    view = buf.as_strided(t.shape, t.stride(), PAD)
    view.copy_(t.detach())
    return view


class _CanaryAllocations:
    """Patch torch's allocators so every new floating tensor sits between sentinel-filled pads."""

    def __init__(self, monkeypatch):
        self.buffers: list[torch.Tensor] = []
        self._mp = monkeypatch

    def _wrap(self, original, fill_inside):
        def alloc(*args, **kwargs):
            t = original(*args, **kwargs)
            if not t.is_floating_point() or t.numel() == 0 or t.device.type != "cpu":
                return t
            buf = torch.full((t.numel() + 2 * PAD,), _sentinel(t.dtype), dtype=t.dtype)
            inside = buf[PAD:PAD + t.numel()].view(t.shape)
            if fill_inside is not None:
                inside.fill_(fill_inside)
            self.buffers.append(buf)
            return inside
        return alloc

    def __enter__(self):
        self._mp.setattr(torch, "empty", self._wrap(torch.empty, float("nan")))
        self._mp.setattr(torch, "empty_like", self._wrap(torch.empty_like, float("nan")))
        self._mp.setattr(torch, "zeros", self._wrap(torch.zeros, 0.0))
        return self

    def __exit__(self, *exc):
        self._mp.undo()

    def intact(self) -> bool:
        return all(torch.equal(b[:PAD], torch.full_like(b[:PAD], _sentinel(b.dtype)))
                   and torch.equal(b[-PAD:], torch.full_like(b[-PAD:], _sentinel(b.dtype))) for b in self.buffers)


MAX_ELEMENTS = 20_000  # wide-row cases add interpreter time, not new masks: their narrow siblings cover them


def _params():
    for spec in REGISTRY.values():
        for case in spec.cases:
            if not case.slow and _size(spec, case) <= MAX_ELEMENTS:
                yield pytest.param(spec, case, id=f"{spec.name}-{case.name}")


def _size(spec, case) -> int:
    inputs = spec.make_inputs(case, torch.float32, torch.device("meta"), torch.Generator().manual_seed(0))
    tensors = [*inputs.args, *inputs.kwargs.values()]
    return sum(t.numel() for t in tensors if isinstance(t, torch.Tensor))


def _run(spec, inputs, args, kwargs, gen_seed):
    grad_argnums = inputs.grad_argnums if spec.has_backward else ()
    args = [a.requires_grad_() if i in grad_argnums else a for i, a in enumerate(args)]
    out = spec.fn(*args, **kwargs)
    outs = [o for o in (out if isinstance(out, tuple | list) else (out,)) if isinstance(o, torch.Tensor)]
    results = [o.detach().clone() for o in outs]
    if grad_argnums:
        gen = torch.Generator().manual_seed(gen_seed)
        diff = [o for o in outs if o.requires_grad]
        dys = [torch.randn(o.shape, generator=gen).to(o.dtype) for o in diff]
        grads = torch.autograd.grad(diff, [args[i] for i in grad_argnums], dys)
        results += [g.detach().clone() for g in grads]
    return results


@pytest.mark.parametrize(("spec", "case"), list(_params()))
def test_no_access_outside_operands(spec, case, monkeypatch):
    gen = torch.Generator().manual_seed(0)
    inputs = spec.make_inputs(case, torch.float32, torch.device("cpu"), gen)
    plain_args = [a.detach().clone() if isinstance(a, torch.Tensor) else a for a in inputs.args]
    expect = _run(spec, inputs, plain_args, dict(inputs.kwargs), 1)
    padded_args = [_nan_padded(a) for a in inputs.args]
    padded_kwargs = {k: _nan_padded(v) for k, v in inputs.kwargs.items()}
    with _CanaryAllocations(monkeypatch) as canary:
        got = _run(spec, inputs, padded_args, padded_kwargs, 1)
    assert canary.buffers, "no allocation was observed"
    assert canary.intact(), "a kernel wrote outside a buffer it allocated"
    for g, e in zip(got, expect, strict=True):
        # A NaN read poisons the result; GEMMs on the unaligned padded views may move the last bits.
        assert torch.isnan(g).sum() == torch.isnan(e).sum()
        torch.testing.assert_close(g, e, equal_nan=True)
