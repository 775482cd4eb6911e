"""Norms and softmax beyond the registry sweep: gradcheck, determinism, properties, bad input, empties."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import wavefront.ops as wops
from wavefront import reference

SETTINGS = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# --- gradcheck in float64 ------------------------------------------------------------------------------

@pytest.mark.parametrize("n_cols", [7, 33])
def test_gradcheck_rms_norm(n_cols):
    x = torch.randn(3, n_cols, dtype=torch.float64, requires_grad=True)
    w = torch.randn(n_cols, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w: wops.rms_norm(x, w, 1e-6, 0.5, cast="gemma"), (x, w))


def test_gradcheck_add_rms_norm():
    x, r = (torch.randn(2, 9, dtype=torch.float64, requires_grad=True) for _ in range(2))
    w = torch.randn(9, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, r, w: wops.add_rms_norm(x, r, w), (x, r, w))


def test_gradcheck_layer_norm():
    x = torch.randn(3, 11, dtype=torch.float64, requires_grad=True)
    w = torch.randn(11, dtype=torch.float64, requires_grad=True)
    b = torch.randn(11, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(wops.layer_norm, (x, w, b))


def test_gradcheck_softmax():
    x = torch.randn(4, 13, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(wops.softmax, (x,))


def test_gradcheck_wide_rows_take_the_looped_path():
    # 16385 columns exceed the single-pass limit: the two-pass kernels must be differentiable too.
    x = torch.randn(1, 16385, dtype=torch.float64, requires_grad=True)
    w = torch.randn(16385, dtype=torch.float64, requires_grad=True)
    dy = torch.randn(1, 16385, dtype=torch.float64)
    for f, ref in ((wops.rms_norm, reference.rms_norm), (wops.layer_norm, reference.layer_norm)):
        g = torch.autograd.grad(f(x, w), (x, w), dy)
        g_ref = torch.autograd.grad(ref(x, w), (x, w), dy)
        for a, b in zip(g, g_ref, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


# --- determinism ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("n_cols", [300, 20000])
@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
def test_weight_gradients_are_bitwise_reproducible(op, n_cols):
    torch.manual_seed(0)
    x = torch.randn(37, n_cols, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(n_cols, dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(37, n_cols, dtype=torch.bfloat16)
    fn = getattr(wops, op)
    runs = [torch.autograd.grad(fn(x, w), (x, w), dy) for _ in range(2)]
    for a, b in zip(*runs, strict=True):
        assert torch.equal(a.view(torch.int16), b.view(torch.int16))


# --- properties ----------------------------------------------------------------------------------------

@SETTINGS
@given(n_rows=st.integers(1, 6), n_cols=st.integers(1, 700), scale=st.floats(-30, 30))
def test_softmax_rows_sum_to_one_and_shift_invariant(n_rows, n_cols, scale):
    x = torch.randn(n_rows, n_cols) * scale
    y = wops.softmax(x)
    assert torch.all(y >= 0)
    torch.testing.assert_close(y.sum(-1), torch.ones(n_rows), rtol=0, atol=1e-5)
    torch.testing.assert_close(wops.softmax(x + 7.0), y, rtol=1e-5, atol=1e-6)


@SETTINGS
@given(n_rows=st.integers(1, 5), n_cols=st.integers(2, 600), log_scale=st.floats(-3, 3))
def test_rms_norm_is_scale_invariant(n_rows, n_cols, log_scale):
    x = torch.randn(n_rows, n_cols)
    w = torch.randn(n_cols)
    y = wops.rms_norm(x, w, eps=0.0)
    torch.testing.assert_close(wops.rms_norm(x * 10.0**log_scale, w, eps=0.0), y, rtol=1e-5, atol=1e-5)
    # Without a weight the output has unit root-mean-square.
    torch.testing.assert_close(wops.rms_norm(x, None, eps=0.0).pow(2).mean(-1), torch.ones(n_rows), rtol=1e-5, atol=0)


@SETTINGS
@given(n_rows=st.integers(1, 5), n_cols=st.integers(2, 600), shift=st.floats(-100, 100))
def test_layer_norm_is_shift_invariant_and_standardizes(n_rows, n_cols, shift):
    x = torch.randn(n_rows, n_cols, dtype=torch.float64)
    y = wops.layer_norm(x, eps=0.0)
    torch.testing.assert_close(wops.layer_norm(x + shift, eps=0.0), y, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(y.mean(-1), torch.zeros(n_rows, dtype=torch.float64), rtol=0, atol=1e-12)


@SETTINGS
@given(n_rows=st.integers(1, 4), n_cols=st.integers(1, 500))
def test_add_rms_norm_equals_rms_norm_of_the_returned_sum(n_rows, n_cols):
    x, r = torch.randn(n_rows, n_cols, dtype=torch.bfloat16), torch.randn(n_rows, n_cols, dtype=torch.bfloat16)
    w = torch.randn(n_cols, dtype=torch.bfloat16)
    y, s = wops.add_rms_norm(x, r, w)
    assert torch.equal(s, x + r)
    assert torch.equal(y, wops.rms_norm(s, w))


# --- casting conventions ---------------------------------------------------------------------------------

def test_llama_and_gemma_casting_follow_their_references_bitwise_on_easy_inputs():
    torch.manual_seed(1)
    x = torch.randn(4, 256, dtype=torch.bfloat16)
    w = torch.randn(256, dtype=torch.bfloat16)
    for cast in ("llama", "gemma"):
        ours = wops.rms_norm(x, w, cast=cast, offset=1.0)
        ref = reference.rms_norm(x, w, cast=cast, offset=1.0)
        # Same rounding points: at most one bf16 ulp apart (fp32 rstd may differ in its last bit).
        assert (ours.float() - ref.float()).abs().max() <= (ref.float().abs().max() * 2**-7)
    assert not torch.equal(wops.rms_norm(x, w, cast="llama"), wops.rms_norm(x, w, cast="gemma"))



def _input_dtype_rms(x, w, offset):
    """Eager PyTorch in x's dtype, no upcast: the model code cast="input" stands for."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * (w + offset)


@pytest.mark.parametrize("n_cols", [300, 20000])  # single pass and the looped (wide-row) path
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_input_dtype_casting_rounds_where_eager_in_that_dtype_rounds(dtype, n_cols):
    from wavefront.kernels.norm import norm_fwd

    torch.manual_seed(2)
    x = torch.randn(3, n_cols, dtype=dtype)
    w = (torch.randn(n_cols) * 0.1).to(dtype)
    y, _, _, rstd, _, _ = norm_fwd(x, w, None, None, 1e-6, 1.0, True, True, round_stats=True)
    # rstd is a value of the input dtype, and y is exactly round(round(x * rstd) * round(w + 1)), eager's steps.
    assert torch.equal(rstd.to(dtype).float(), rstd)
    assert torch.equal(y, (x * rstd[:, None].to(dtype)) * (w + 1.0))
    # rstd itself: eager's mean square is summed in another order, so it may land one ulp of the dtype apart.
    eager = _input_dtype_rms(x, w, 1.0)
    eager_rstd = torch.rsqrt(x.pow(2).mean(-1) + 1e-6).float()
    assert ((rstd - eager_rstd).abs() <= torch.finfo(dtype).eps * eager_rstd).all()
    assert torch.equal(wops.rms_norm(x, w, offset=1.0, cast="input"), y)
    assert not torch.equal(y, wops.rms_norm(x, w, offset=1.0, cast="llama")), "no upcast must change numbers"
    assert eager.dtype == y.dtype


def test_input_dtype_casting_is_llama_in_fp32():
    x, w = torch.randn(4, 96), torch.randn(96)
    assert torch.equal(wops.rms_norm(x, w, cast="input"), wops.rms_norm(x, w, cast="llama"))


@pytest.mark.parametrize("op", ["rms_norm", "add_rms_norm"])
def test_input_dtype_casting_under_compile_against_float64(op):
    """cast="input" inside torch.compile(fullgraph=True), forward and backward, bf16, against the float64
    reference: our error at most 2x eager's (in bf16, no upcast) plus one ulp, the accuracy rule."""
    from wavefront.ops._spec import Tolerance

    torch._dynamo.reset()
    torch.manual_seed(3)
    x64, r64 = torch.randn(6, 200, dtype=torch.float64), torch.randn(6, 200, dtype=torch.float64)
    w64 = torch.randn(200, dtype=torch.float64)
    dy64 = torch.randn(6, 200, dtype=torch.float64)

    def ours(x, r, w):
        if op == "rms_norm":
            return wops.rms_norm(x, w, cast="input")
        return wops.add_rms_norm(x, r, w, cast="input")[0]

    def eager(x, r, w):
        return _input_dtype_rms(x if op == "rms_norm" else x + r, w, 0.0)

    def run(fn, dtype):
        args = [t.detach().to(dtype).clone().requires_grad_() for t in (x64, r64, w64)]
        y = fn(*args)
        y.backward(dy64.to(dtype))
        return [y.detach().double()] + [a.grad.double() for a in args if a.grad is not None]

    compiled = torch.compile(ours, backend="aot_eager", fullgraph=True)
    ref, got, base = run(eager, torch.float64), run(compiled, torch.bfloat16), run(eager, torch.bfloat16)
    names = ("y", "dx", "dr", "dw") if op == "add_rms_norm" else ("y", "dx", "dw")
    assert len(ref) == len(got) == len(base) == len(names)
    for name, r, g, e in zip(names, ref, got, base, strict=True):
        bound = Tolerance().bound((e - r).abs().max().item(), r.abs().max().item(), torch.bfloat16)
        assert (g - r).abs().max().item() <= bound, name


# --- empties and shapes ------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(0, 64), (3, 0, 64), (4, 0)])
def test_empty_inputs_return_empty_without_a_launch(shape):
    from wavefront.kernels._launch import recording

    x = torch.randn(shape, requires_grad=True)
    w = torch.randn(shape[-1])
    with recording() as launches:
        outs = [wops.rms_norm(x, w), wops.layer_norm(x, w, w), wops.softmax(x), wops.add_rms_norm(x, x, w)[0]]
    assert launches == []
    assert all(o.shape == x.shape for o in outs)


def test_leading_dims_and_non_contiguous_inputs():
    base = torch.randn(2, 3, 5, 70)
    x = base[..., :64]  # row stride 70: a view, not a copy
    w = torch.randn(64)
    torch.testing.assert_close(wops.rms_norm(x, w), reference.rms_norm(x, w))
    xt = torch.randn(64, 12).t()  # last dim not unit-stride
    torch.testing.assert_close(wops.softmax(xt), reference.softmax(xt))


def test_fp32_weight_with_bf16_input_keeps_input_dtype():
    x = torch.randn(3, 128, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(128, dtype=torch.float32, requires_grad=True)
    y = wops.rms_norm(x, w)
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert x.grad.dtype == torch.bfloat16 and w.grad.dtype == torch.float32


# --- bad input ---------------------------------------------------------------------------------------------

def test_bad_input_errors_name_the_argument():
    x = torch.randn(4, 16)
    w = torch.randn(16)
    cases = [
        (lambda: wops.rms_norm(torch.tensor(1.0), None), ValueError, "'x' must have at least 1 dim"),
        (lambda: wops.rms_norm(torch.ones(4, 16, dtype=torch.int32), None), TypeError, "'x' must have dtype"),
        (lambda: wops.rms_norm(x, torch.randn(15)), ValueError, "'weight' must have shape (16,)"),
        (lambda: wops.rms_norm(x, torch.randn(2, 16)), ValueError, "'weight' must have 1 dims"),
        (lambda: wops.rms_norm(x, w, cast="mistral"), ValueError, "'cast' must be one of"),
        (lambda: wops.rms_norm(x, "w"), TypeError, "'weight' must be a torch.Tensor"),
        (lambda: wops.add_rms_norm(x, torch.randn(4, 8), w), ValueError, "'residual' must have shape (4, 16)"),
        (lambda: wops.add_rms_norm(x, x.half(), w), TypeError, "'residual' must have the dtype of 'x'"),
        (lambda: wops.layer_norm(x, w, torch.randn(3)), ValueError, "'bias' must have shape (16,)"),
        (lambda: wops.softmax(torch.ones(3, dtype=torch.int64)), TypeError, "softmax: argument 'x'"),
        (lambda: wops.softmax(torch.tensor(2.0)), ValueError, "at least 1 dim"),
    ]
    for call, exc, text in cases:
        with pytest.raises(exc, match=None) as info:
            call()
        assert text in str(info.value), (text, str(info.value))


def test_tensors_on_different_devices_are_rejected():
    x = torch.randn(2, 8)
    w = torch.randn(8, device="meta")
    with pytest.raises(ValueError, match="'weight' is on meta"):
        wops.rms_norm(x, w)


@pytest.mark.parametrize("n_cols", [64, 20000])
def test_layer_norm_variance_overflow_is_nan_like_torch(n_cols):
    # Issue #13 defect 4: |x| ~ 1e37 overflows the fp32 variance; rstd became 0 and the output exactly the
    # bias, hiding the overflow. PyTorch's layer_norm returns NaN; so do we. A normal row next to it is
    # unaffected, and RMSNorm keeps PyTorch's result (x * 0 = 0).
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, n_cols, generator=gen)
    x[0] *= 1e37
    w, b = torch.randn(n_cols, generator=gen), torch.randn(n_cols, generator=gen)
    ours = wops.layer_norm(x, w, b)
    expect = torch.nn.functional.layer_norm(x, (n_cols,), w, b)
    assert torch.isnan(expect[0]).all() and torch.isnan(ours[0]).all()
    torch.testing.assert_close(ours[1], expect[1], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(wops.rms_norm(x, w), torch.nn.functional.rms_norm(x, (n_cols,), w, 1e-6),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
def test_table_selected_variants_match_the_default(op, monkeypatch):
    # The forward's weight-first load, several rows per program and the backward's next-row prefetch are
    # chosen by row_config's table (off where inspect measured an occupancy cost); each must give the same
    # numbers as the default path, bit for bit (same arithmetic, other load order).
    import dataclasses

    from wavefront.kernels import row_config as rc

    gen = torch.Generator().manual_seed(7)
    x = torch.randn(13, 300, generator=gen)
    w, b = torch.randn(300, generator=gen), torch.randn(300, generator=gen)
    dy = torch.randn(13, 300, generator=gen)

    def run():
        xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
        y = wops.rms_norm(xr, wr) if op == "rms_norm" else wops.layer_norm(xr, wr, b)
        y.backward(dy)
        return y.detach(), xr.grad, wr.grad

    default = run()
    table = dataclasses.replace(rc.ROW_TABLES["cpu"], weight_first=True, prefetch_next_row=True,
                                multi_row_max_cols=4096)
    monkeypatch.setitem(rc.ROW_TABLES, "cpu", table)
    from wavefront.runtime import ARCHS

    assert rc.row_config(300, torch.float32, ARCHS["cpu"], accumulate=True).prefetch
    assert rc.row_config(300, torch.float32, ARCHS["cpu"], multi_row=True).rows_per_program > 1
    variant = run()
    for a, c in zip(default, variant, strict=True):
        assert torch.equal(a, c)
