"""The launch door: recording, record-only mode, 64-bit offsets and the interpreter's bf16 rounding."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import torch

import wavefront.ops as wops
from wavefront import runtime as wavefront_runtime
from wavefront.kernels._launch import TensorArg, recording


def test_recording_captures_forward_and_backward_launches():
    x = torch.randn(8, 512, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(512, dtype=torch.bfloat16, requires_grad=True)
    with recording() as launches:
        wops.rms_norm(x, w).sum().backward()
    names = [launch.name for launch in launches]
    assert names == ["_norm_fwd_kernel", "_norm_bwd_kernel"]
    fwd = launches[0]
    assert fwd.op == "rms_norm" and fwd.grid == (8,)
    assert isinstance(fwd.args[0], TensorArg) and fwd.args[0].dtype == torch.bfloat16
    assert fwd.constexprs["IS_RMS"] is True and fwd.constexprs["BLOCK_N"] == 512
    assert fwd.options["num_warps"] >= 1


def test_record_only_mode_launches_nothing():
    x = torch.randn(4, 64) * 3 + 1  # fresh values: no earlier result can sit in recycled memory
    with recording(execute=False) as launches:
        y = wops.softmax(x)
    assert len(launches) == 1
    assert not torch.allclose(y, torch.softmax(x, -1)), "record-only mode ran the kernel"
    with recording() as again:
        y2 = wops.softmax(x)
    assert len(again) == 1
    torch.testing.assert_close(y2, torch.softmax(x, -1))


def test_row_offsets_past_2_to_the_31_elements():
    """Rows that start beyond 2^31 elements in one buffer: int32 offsets would wrap (and the interpreter
    would read garbage or crash), so this runs in a subprocess and checks the numbers."""
    code = textwrap.dedent("""
        import os
        os.environ["TRITON_INTERPRET"] = os.environ.get("TRITON_INTERPRET", "1")
        import torch, wavefront.ops as wops
        from wavefront import reference
        big = torch.empty(3 * 2**30 + 256, dtype=torch.bfloat16)   # 6 GiB virtual, pages touched: 3 rows
        rows = big.as_strided((3, 256), (2**30, 1))
        rows.copy_(torch.randn(3, 256).to(torch.bfloat16))
        w = torch.randn(256, dtype=torch.bfloat16)
        for f, ref in ((wops.rms_norm, reference.rms_norm), (wops.softmax, reference.softmax)):
            args = (rows, w) if f is wops.rms_norm else (rows,)
            y = f(*args)
            assert torch.allclose(y.float(), ref(*args).float(), atol=2e-2), f
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().endswith("ok")


def test_interpreter_rounds_bf16_like_the_gpu():
    """fp32 -> bf16 inside a kernel must round to nearest even, as cvt.rn.bf16.f32 does."""
    x = torch.randn(4, 1000)
    y = wops.rms_norm(x.to(torch.bfloat16).float(), None).to(torch.bfloat16)
    ours = wops.rms_norm(x.to(torch.bfloat16), None)
    # Normalizing in fp32 then rounding (RNE, by torch) must equal the kernel's own rounding bit for bit
    # on most elements; truncation would disagree on about half of them.
    agree = (ours == y).float().mean().item()
    assert agree > 0.97, agree


def test_named_runtime_arguments_are_checked_against_the_signature():
    """A misspelt, missing or doubly given runtime argument is refused before anything launches."""
    import pytest

    from wavefront.kernels._launch import launch
    from wavefront.kernels.softmax import _softmax_fwd_kernel

    x = torch.randn(2, 8)
    y = torch.empty_like(x)
    ok = dict(x_ptr=x, y_ptr=y, n_cols=8, stride_x_row=8, stride_y_row=8)
    cx = dict(SINGLE_PASS=True, BLOCK_N=8, ACC=None)
    with recording(execute=False) as launches:
        launch(_softmax_fwd_kernel, (2,), constexprs=cx, options={}, **ok)
    assert [a if not isinstance(a, TensorArg) else "T" for a in launches[0].args] == ["T", "T", 8, 8, 8]
    bad = dict(ok, stride_x_rows=8)
    del bad["stride_x_row"]
    with pytest.raises(TypeError, match="no runtime parameter 'stride_x_rows'"):
        launch(_softmax_fwd_kernel, (2,), constexprs=cx, options={}, **bad)
    missing = dict(ok)
    del missing["stride_y_row"]
    with pytest.raises(TypeError, match="missing runtime arguments stride_y_row"):
        launch(_softmax_fwd_kernel, (2,), constexprs=cx, options={}, **missing)
    with pytest.raises(TypeError, match="given twice"):
        launch(_softmax_fwd_kernel, (2,), x, constexprs=cx, options={}, **ok)


def test_gpu_rounding_stays_inside_wavefront_launches():
    """Issue #14: the interpreter's rounding is patched only around wavefront's own launches. A foreign
    interpreted kernel storing fp32 -> bf16 gives the interpreter's own result before and after a
    wavefront op, and the patched result inside the scope."""
    import triton
    import triton.language as tl
    from triton.runtime import interpreter

    from wavefront.kernels._interpreter import gpu_rounding

    if not wavefront_runtime.interpreting():
        import pytest

        pytest.skip("the interpreter is not in use")

    @triton.jit
    def to_bf16(x_ptr, y_ptr, N: tl.constexpr):
        offs = tl.arange(0, N)
        tl.store(y_ptr + offs, tl.load(x_ptr + offs).to(tl.bfloat16))

    # Values just above a bf16 rounding midpoint: truncation and round-to-nearest differ on every one.
    x = (torch.arange(1, 65, dtype=torch.float32) * 2.0 ** -7 + 1.0) + 2.0 ** -8 + 2.0 ** -12

    def foreign():
        y = torch.empty(64, dtype=torch.bfloat16)
        to_bf16[(1,)](x, y, N=64)
        return y

    original = interpreter._convert_float
    before = foreign()
    wops.rms_norm(torch.randn(4, 64, dtype=torch.bfloat16), None)
    after = foreign()
    assert interpreter._convert_float is original
    assert torch.equal(before, after)
    with gpu_rounding():
        inside = foreign()
    assert torch.equal(inside, x.to(torch.bfloat16))  # PyTorch's RNE, as the GPU rounds
    assert not torch.equal(before, inside)  # so the check above could fail
