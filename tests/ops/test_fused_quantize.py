"""FP8 quantization fused into the producers of linear inputs (the norms' and the gated activations'
``quantize=`` option): (q, scale) bit-identical to ``ops.quantize`` of the op's own output, in its layout,
for every fused scaling, format and input dtype, ragged groups and both norm paths (one pass, looped);
the op's outputs and gradients unchanged by the option; the refused combinations' errors;
torch.compile(fullgraph=True)."""

from __future__ import annotations

import pytest
import torch

from wavefront import ops, reference

FORMATS = ("e4m3", "e5m2", "e4m3fnuz", "e5m2fnuz")
SCALINGS = (("rowwise", False), ("block1x128", False), ("block1x32", True))  # block1x32 + pow2: MXFP8


def _inputs(op: str, shape, dtype, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)

    def randn(*s, scale=1.0):
        return (torch.randn(*s, generator=gen) * scale).to(dtype)

    n = shape[-1]
    x = randn(*shape, scale=2.0)
    if len(shape) > 1:  # row magnitudes over 4 decades (the gated activations' scales differ per row)
        x = (x.float() * torch.logspace(-2, 2, shape[-2]).view(-1, 1)).to(dtype)
    if op == "rms_norm":
        return (x, randn(n)), {}
    if op == "layer_norm":
        return (x, randn(n), randn(n)), {}
    if op == "add_rms_norm":
        return (x, randn(*shape), randn(n)), {}
    return (x, randn(*shape)), {}  # swiglu, geglu: gate, up


def _fn(op: str):
    return getattr(ops, op)


def _n_outputs(op: str) -> int:
    return 2 if op == "add_rms_norm" else 1


def _assert_matches_quantize(op, shape, dtype, scaling, fmt, pow2):
    args, kwargs = _inputs(op, shape, dtype)
    plain = _fn(op)(*args, **kwargs)
    plain = plain if isinstance(plain, tuple) else (plain,)
    out = _fn(op)(*args, **kwargs, quantize=scaling, fp8_dtype=fmt, pow2_scale=pow2)
    k = _n_outputs(op)
    assert len(out) == k + 2
    for a, b in zip(out[:k], plain, strict=True):  # the op's own outputs: unchanged, bit for bit
        assert torch.equal(a, b)
    q, scale = out[k:]
    q_ref, scale_ref = ops.quantize(out[0], dtype=fmt, scaling=scaling, pow2_scale=pow2)
    assert q.dtype == reference.FP8_FORMATS[fmt] and scale.dtype == torch.float32
    assert q.shape == q_ref.shape and scale.shape == scale_ref.shape
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8)), "FP8 codes differ from ops.quantize(out)"
    assert torch.equal(scale, scale_ref), "scales differ from ops.quantize(out)"
    # The quantization is not trivial: the codes span the format and dequantize to the output.
    assert q.float().abs().max() > 0.5 * torch.finfo(q.dtype).max
    deq = reference.fp8_dequantize(q, scale, scaling).float()
    y = out[0].float()
    assert torch.allclose(deq, y, rtol=0.25, atol=1e-3 * float(y.abs().max()))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize(("scaling", "pow2"), SCALINGS)
def test_rms_norm_formats_and_scalings(scaling, pow2, fmt):
    # 300 columns: 1x128 groups of 128, 128, 44 and 1x32 groups of 32 x 9 + 12 (ragged last groups).
    _assert_matches_quantize("rms_norm", (5, 300), torch.bfloat16, scaling, fmt, pow2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize(("scaling", "pow2"), SCALINGS)
def test_rms_norm_input_dtypes(scaling, pow2, dtype):
    _assert_matches_quantize("rms_norm", (4, 200), dtype, scaling, "e4m3", pow2)


@pytest.mark.parametrize(("scaling", "pow2"), [("block1x128", False), ("block1x32", False), ("rowwise", True)])
@pytest.mark.parametrize("n_cols", [1, 33, 100])
def test_narrow_rows(n_cols, scaling, pow2):
    """Rows narrower than one group (1, 33 < 128; 1 < 32) and just past one (33 = 32 + 1)."""
    _assert_matches_quantize("rms_norm", (3, n_cols), torch.bfloat16, scaling, "e4m3", pow2)


@pytest.mark.parametrize(("scaling", "fmt"), [("rowwise", "e4m3"), ("block1x128", "e5m2fnuz"),
                                              pytest.param("block1x32", "e4m3fnuz", marks=pytest.mark.slow)])
def test_wide_rows_looped_path(scaling, fmt):
    """Rows over the single-pass limit (16384): blocks quantize in the normalize pass, rowwise in a third
    pass over the stored y."""
    _assert_matches_quantize("rms_norm", (2, 20000), torch.bfloat16, scaling, fmt, False)


@pytest.mark.parametrize(("dtype", "scaling", "fmt"), [
    (torch.float32, "rowwise", "e4m3"), (torch.bfloat16, "block1x128", "e4m3fnuz"),
    (torch.float16, "block1x32", "e5m2"),
], ids=["fp32-rowwise", "bf16-1x128", "fp16-1x32"])
def test_layer_norm(dtype, scaling, fmt):
    _assert_matches_quantize("layer_norm", (4, 300), dtype, scaling, fmt, scaling == "block1x32")


def test_add_rms_norm_returns_both_and_the_quantized_norm():
    _assert_matches_quantize("add_rms_norm", (4, 300), torch.bfloat16, "block1x128", "e4m3", False)


@pytest.mark.parametrize(("dtype", "fmt"), [(torch.bfloat16, "e4m3"), (torch.float32, "e5m2"),
                                            (torch.float16, "e4m3fnuz")], ids=["bf16", "fp32", "fp16"])
@pytest.mark.parametrize(("scaling", "pow2"), SCALINGS[1:])
def test_swiglu(scaling, pow2, dtype, fmt):
    _assert_matches_quantize("swiglu", (3, 300), dtype, scaling, fmt, pow2)


@pytest.mark.parametrize("n_cols", [40, 4200])
def test_swiglu_block_programs(n_cols):
    """40 columns: one program narrower than a 1x128 group; 4200: two 4096-column programs per row (the
    second program's scales land at its offset) and a ragged 104-column (1x128) / 8-column (1x32) last group."""
    _assert_matches_quantize("swiglu", (1, n_cols), torch.bfloat16, "block1x128", "e4m3", False)
    _assert_matches_quantize("geglu", (1, n_cols), torch.bfloat16, "block1x32", "e5m2fnuz", True)


@pytest.mark.parametrize("op", ["rms_norm", "swiglu"])
def test_leading_dims_and_one_dim_layouts(op):
    """ops.quantize's layout for [..., N] outputs: q like the output, scales [..., groups]; 1-D: 1-D."""
    _assert_matches_quantize(op, (2, 3, 200), torch.bfloat16, "block1x128", "e4m3", False)
    _assert_matches_quantize(op, (200,), torch.bfloat16, "block1x32", "e4m3", True)


def test_zero_rows_and_empty_input():
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    x[1] = 0
    y, q, s = ops.rms_norm(x, None, quantize="rowwise")
    q_ref, s_ref = ops.quantize(y, scaling="rowwise")
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8)) and torch.equal(s, s_ref)
    assert torch.isfinite(s).all() and (q[1].float() == 0).all()
    empty = torch.empty(0, 300, dtype=torch.bfloat16)
    y, q, s = ops.rms_norm(empty, torch.ones(300, dtype=torch.bfloat16), quantize="block1x128")
    assert y.shape == q.shape == (0, 300) and s.shape == (0, 3) and q.dtype == torch.float8_e4m3fn


@pytest.mark.parametrize("op", ["rms_norm", "add_rms_norm", "layer_norm", "swiglu"])
def test_gradients_unchanged_and_fp8_outputs_carry_none(op):
    """The option changes nothing in autograd: same gradients as without it; q and scale need no grad."""
    args, _ = _inputs(op, (3, 256), torch.float32, seed=1)
    grads = []
    for quantize in (None, "block1x128"):
        leaves = [a.detach().clone().requires_grad_(True) for a in args]
        out = _fn(op)(*leaves, quantize=quantize)
        out = out if isinstance(out, tuple) else (out,)
        k = _n_outputs(op)
        if quantize is not None:
            assert not out[k].requires_grad and not out[k + 1].requires_grad
        dys = [torch.randn(o.shape, generator=torch.Generator().manual_seed(i)) for i, o in enumerate(out[:k])]
        grads.append(torch.autograd.grad(out[:k], leaves, dys))
    for a, b in zip(*grads, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize(("op", "quantize", "match"), [
    ("rms_norm", "tensorwise", "amax of the whole output"),
    ("layer_norm", "block128x128", "span 128 rows"),
    ("swiglu", "rowwise", "cross-program amax"),
    ("swiglu", "tensorwise", "amax of the whole output"),
    ("rms_norm", "rowwise_ish", "argument 'quantize' must be one of"),
])
def test_refused_combinations_say_why(op, quantize, match):
    args, _ = _inputs(op, (2, 64), torch.bfloat16)
    with pytest.raises(ValueError, match=match):
        _fn(op)(*args, quantize=quantize)


def test_bad_format_and_input_dtype():
    x = torch.randn(2, 64)
    with pytest.raises(ValueError, match="argument 'fp8_dtype' must be one of"):
        ops.rms_norm(x, None, quantize="rowwise", fp8_dtype="e3m4")
    with pytest.raises(ValueError, match="float32, bfloat16 or float16"):
        ops.rms_norm(x.double(), None, quantize="rowwise")


@pytest.mark.parametrize("op", ["rms_norm", "swiglu"])
def test_compiles_fullgraph(op):
    torch._dynamo.reset()
    args, _ = _inputs(op, (3, 160), torch.bfloat16)

    def fn(*a):
        return _fn(op)(*a, quantize="block1x32", fp8_dtype="e4m3", pow2_scale=True)

    eager = fn(*args)
    compiled = torch.compile(fn, backend="aot_eager", fullgraph=True)(*args)
    assert len(compiled) == len(eager) == 3
    for c, e in zip(compiled, eager, strict=True):
        assert c.dtype == e.dtype and c.shape == e.shape
        assert torch.equal(c.view(torch.uint8) if c.dtype.itemsize == 1 else c,
                           e.view(torch.uint8) if e.dtype.itemsize == 1 else e)


@pytest.mark.parametrize("op", ["rms_norm", "add_rms_norm", "swiglu"])
def test_reference_path_without_triton(op, monkeypatch):
    """CPU without the interpreter: the reference op, then ops.quantize of its output (same layout)."""
    from wavefront import runtime

    args, _ = _inputs(op, (3, 200), torch.bfloat16)
    monkeypatch.setattr(runtime, "uses_triton", lambda device: False)
    out = _fn(op)(*args, quantize="block1x128", fp8_dtype="e4m3fnuz")
    k = _n_outputs(op)
    q_ref, s_ref = reference.fp8_quantize(out[0], dtype="e4m3fnuz", scaling="block1x128")
    assert len(out) == k + 2 and out[k].dtype == torch.float8_e4m3fnuz and out[k + 1].shape == (3, 2)
    assert torch.equal(out[k].view(torch.uint8), q_ref.view(torch.uint8)) and torch.equal(out[k + 1], s_ref)


def test_fused_bench_cases_skip_targets_without_fp8():
    """Inspect plans the fused cases for FP8-capable targets only (no FP8 conversion on sm_80): no rows there,
    not compile failures; the plain cases still run there."""
    from wavefront.ops import REGISTRY
    from wavefront.workbench.static.inspect import plan

    spec = REGISTRY["swiglu"]
    fused = [c for c in spec.bench_cases if "quantize" in c.options]
    assert fused and all(c.targets is not None for c in fused)
    assert plan([spec], ["sm_80"], torch.bfloat16, cases=lambda s: fused) == []
    assert {p.case.name for p in plan([spec], ["sm_90"], torch.bfloat16, cases=lambda s: fused[:1])} == {fused[0].name}
    assert plan([spec], ["sm_80"], torch.bfloat16, cases=lambda s: spec.bench_cases[:1])


@pytest.mark.parametrize(("op", "recipe"), [("rms_norm", "rowwise"), ("rms_norm", "blockwise"),
                                            ("swiglu", "mxfp8")])
def test_linear_fp8_fed_the_fused_operand_is_bit_identical(op, recipe):
    """The point of the option: linear_fp8 given the producer's (q, scale) as x_fp8 computes exactly what it
    computes quantizing the producer's output itself, in each recipe's activation layout."""
    fmt, scaling, pow2 = reference.fp8_recipe_operand(recipe, "act")
    args, _ = _inputs(op, (4, 256), torch.bfloat16, seed=2)
    y, q, scale = _fn(op)(*args, quantize=scaling, fp8_dtype=fmt, pow2_scale=pow2)
    w = torch.randn(64, 256, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    fused = ops.linear_fp8(y, w, recipe=recipe, fnuz=False, x_fp8=ops.Quantized(q, scale, scaling))
    assert torch.equal(fused, ops.linear_fp8(y, w, recipe=recipe, fnuz=False))


def test_liger_baselines_refuse_the_fused_cases():
    """wavefront bench's Liger peers have no FP8 output: the fused cases are refused by name, the plain ones
    still reach Liger's function."""
    from wavefront.workbench.bench import providers

    class Fake:
        @staticmethod
        def apply(*args):
            return "called"

    norm, glu = providers._liger_rms_norm(Fake), providers._liger_swiglu(Fake)
    x = torch.ones(2, 8)
    assert norm(x, x[0]) == "called" and glu(x, x) == "called"
    with pytest.raises(NotImplementedError, match="no FP8 output"):
        norm(x, x[0], quantize="rowwise")
    with pytest.raises(NotImplementedError, match="no FP8 output"):
        glu(x, x, quantize="block1x128", pow2_scale=True)
