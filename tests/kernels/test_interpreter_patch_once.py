"""The interpreter patches each of Triton's language modules once per grid run inside wavefront's launches
(kernels/_interpreter.py, "Speed"), and leaves Triton's own functions in place outside them."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from wavefront import runtime
from wavefront.kernels._launch import launch


@triton.jit
def _twice(x):
    return x * 2.0


@triton.jit
def _repeat_kernel(x_ptr, y_ptr, N: tl.constexpr, REPEAT: tl.constexpr):
    offs = tl.program_id(0) * N + tl.arange(0, N)
    x = tl.load(x_ptr + offs)
    for _ in tl.static_range(REPEAT):
        x = _twice(x)
    tl.store(y_ptr + offs, x)


def test_helpers_patch_once_per_run_and_triton_is_restored():
    if not runtime.interpreting():
        pytest.skip("the interpreter is not in use")
    from triton.runtime import interpreter

    calls: list[object] = []
    real_patch, real_call = interpreter._patch_lang, interpreter.GridExecutor.__call__

    def counting_patch(fn):
        calls.append(fn)
        return real_patch(fn)

    interpreter._patch_lang = counting_patch
    try:
        x = torch.randn(3 * 16)
        for _ in range(2):  # two launches: each grid run patches afresh
            y = torch.empty_like(x)
            launch(_repeat_kernel, (3,), x_ptr=x, y_ptr=y, constexprs=dict(N=16, REPEAT=4), options={})
            torch.testing.assert_close(y, x * 16.0, rtol=0, atol=0)
            assert tl.core.is_builtin(tl.load), "the language is Triton's own again after the launch"
        assert interpreter._patch_lang is counting_patch and interpreter.GridExecutor.__call__ is real_call
    finally:
        interpreter._patch_lang = real_patch
    # per launch, the kernel's own patch only: the helper sees the same `tl`, already patched in the run (Triton
    # alone patches again on each of the helper's 3 programs x 4 calls: 26 patches)
    assert len(calls) == 2 and _twice.fn not in calls, calls
