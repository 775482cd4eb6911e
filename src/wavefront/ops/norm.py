"""RMSNorm, add+RMSNorm and LayerNorm: validation, torch.library custom ops with fake kernels, autograd.

The three functionals share two custom ops, ``wavefront::norm_fwd`` and ``wavefront::norm_bwd``, so they
work inside ``torch.compile(fullgraph=True)``: the compiler sees opaque ops with shape functions and
never traces into Triton. Absent optional outputs are 0-element tensors (custom ops return tensors).

Non-contiguous inputs: kernels take one row stride (see ops._validate.as_rows); a tensor whose leading
dims do not collapse into one stride, or whose last dim is not unit-stride, is copied once.

``quantize="rowwise" | "block1x128" | "block1x32"`` (with ``fp8_dtype``, ``pow2_scale``) goes through a third
custom op, ``wavefront::norm_fwd_fp8``: the same kernel also writes the normalized output's FP8 quantization,
bit-identical to ``ops.quantize`` of that output (ops/_fused_quantize.py). Its autograd is the norm's: the FP8
outputs are marked non-differentiable.
"""

from __future__ import annotations

import torch
from torch import Tensor

from wavefront import reference, runtime
from wavefront.archs import compiles_fp8_e4m3
from wavefront.kernels._heuristics import stat_dtype
from wavefront.kernels._scope import op_scope
from wavefront.ops._fused_quantize import (
    check_quantize,
    fake_fp8_out,
    fp8_out_bytes,
    quant_spec,
    register_fp8_autograd,
    registry_fns,
    shape_fp8_out,
    with_quantized,
)
from wavefront.ops._rows import bench_row_cases, numel, randn, row_cases, row_tensor
from wavefront.ops._spec import Case, Mode, OpInputs, OpSpec, itemsize
from wavefront.ops._validate import (
    as_rows,
    check_choice,
    check_same_device,
    check_same_dtype,
    check_shape,
    check_tensor,
)
from wavefront.ops.quantize import check_fp8_target

#: RMSNorm casting modes: "llama" rounds xhat before the weight multiply, "gemma" multiplies in fp32,
#: "input" computes in the input dtype (every step rounded where eager PyTorch without an upcast rounds).
CASTS = ("llama", "gemma", "input")


def _stat_dtype(x: Tensor) -> torch.dtype:
    return stat_dtype(x.dtype)


@torch.library.custom_op("wavefront::norm_fwd", mutates_args=())
def _norm_fwd(x: Tensor, weight: Tensor | None, bias: Tensor | None, residual: Tensor | None, eps: float,
              offset: float, is_rms: bool, cast_before_weight: bool,
              round_stats: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    from wavefront.kernels import norm as kernels  # lazy: Triton-free import

    with op_scope("rms_norm" if is_rms else "layer_norm"):
        y, res_out, mean, rstd, _, _ = kernels.norm_fwd(x, weight, bias, residual, eps, offset, is_rms,
                                                        cast_before_weight, round_stats=round_stats)
    empty = x.new_empty(0)
    return y, empty if res_out is None else res_out, x.new_empty(0, dtype=rstd.dtype) if mean is None else mean, rstd


@_norm_fwd.register_fake
def _norm_fwd_fake(x, weight, bias, residual, eps, offset, is_rms, cast_before_weight, round_stats):
    n_rows = x.shape[0]
    stat = _stat_dtype(x)
    return (torch.empty_like(x), torch.empty_like(x) if residual is not None else x.new_empty(0),
            x.new_empty(0 if is_rms else n_rows, dtype=stat), x.new_empty(n_rows, dtype=stat))


@torch.library.custom_op("wavefront::norm_bwd", mutates_args=())
def _norm_bwd(dy: Tensor, x: Tensor, weight: Tensor | None, mean: Tensor, rstd: Tensor,
              d_residual: Tensor | None, is_rms: bool, has_bias: bool, offset: float) -> tuple[Tensor, Tensor, Tensor]:
    from wavefront.kernels import norm as kernels  # lazy: Triton-free import

    with op_scope("rms_norm" if is_rms else "layer_norm"):
        dx, dw, db = kernels.norm_bwd(dy, x, weight, has_bias, None if is_rms else mean, rstd, d_residual,
                                      offset)
    return dx, x.new_empty(0) if dw is None else dw, x.new_empty(0) if db is None else db


@_norm_bwd.register_fake
def _(dy, x, weight, mean, rstd, d_residual, is_rms, has_bias, offset):
    return (torch.empty_like(x), torch.empty_like(weight) if weight is not None else x.new_empty(0),
            x.new_empty(x.shape[1]) if has_bias else x.new_empty(0))


def _setup_context(ctx, inputs, output):
    x, weight, bias, residual = inputs[:4]
    is_rms, offset = inputs[6], inputs[5]
    _, res_out, mean, rstd = output
    ctx.save_for_backward(res_out if residual is not None else x, weight, mean, rstd)
    ctx.offset = offset
    ctx.has_bias = bias is not None
    ctx.bias_dtype = bias.dtype if bias is not None else None
    ctx.has_residual = residual is not None
    ctx.is_rms = is_rms


def _backward(ctx, dy, d_res_out, d_mean, d_rstd):
    x, weight, mean, rstd = ctx.saved_tensors
    d_residual = as_rows(d_res_out) if ctx.has_residual and d_res_out is not None else None
    dx, dw, db = torch.ops.wavefront.norm_bwd(as_rows(dy), x, weight, mean, rstd, d_residual, ctx.is_rms,
                                              ctx.has_bias, ctx.offset)
    return (dx, dw if weight is not None else None, db.to(ctx.bias_dtype) if ctx.has_bias else None,
            dx if ctx.has_residual else None, None, None, None, None, None)


_norm_fwd.register_autograd(_backward, setup_context=_setup_context)


@torch.library.custom_op("wavefront::norm_fwd_fp8", mutates_args=())
def _norm_fwd_fp8(x: Tensor, weight: Tensor | None, bias: Tensor | None, residual: Tensor | None, eps: float,
                  offset: float, is_rms: bool, cast_before_weight: bool, round_stats: bool, quantize: str,
                  fp8_dtype: str, pow2_scale: bool) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    from wavefront.kernels import norm as kernels  # lazy: Triton-free import

    op = "rms_norm" if is_rms else "layer_norm"
    check_fp8_target(op, x.device)  # in the op body: torch.compile does not trace runtime.arch
    with op_scope(op):
        y, res_out, mean, rstd, q, q_scale = kernels.norm_fwd(x, weight, bias, residual, eps, offset, is_rms,
                                                              cast_before_weight,
                                                              quant_spec(fp8_dtype, quantize, pow2_scale),
                                                              round_stats=round_stats)
    empty = x.new_empty(0)
    return (y, empty if res_out is None else res_out, x.new_empty(0, dtype=rstd.dtype) if mean is None else mean,
            rstd, q, q_scale)


@_norm_fwd_fp8.register_fake
def _(x, weight, bias, residual, eps, offset, is_rms, cast_before_weight, round_stats, quantize, fp8_dtype,
      pow2_scale):
    return (*_norm_fwd_fake(x, weight, bias, residual, eps, offset, is_rms, cast_before_weight, round_stats),
            *fake_fp8_out(x, quantize, fp8_dtype))


register_fp8_autograd(_norm_fwd_fp8, _setup_context, _backward)


def _check_norm_args(op: str, x, weight, bias=None, residual=None) -> None:
    check_tensor(op, "x", x)
    n_cols = x.shape[-1]
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None:
            check_tensor(op, name, t, ndim=1)
            check_shape(op, name, t, (n_cols,), "the last dim of 'x'")
    if residual is not None:
        check_tensor(op, "residual", residual)
        check_shape(op, "residual", residual, tuple(x.shape), "the shape of 'x'")
        check_same_dtype(op, x=x, residual=residual)
    check_same_device(op, x=x, weight=weight, bias=bias, residual=residual)


def _run_norm(x: Tensor, weight, bias, residual, eps, offset, is_rms, cast: str | None,
              quant: tuple[str, str, bool] | None = None):
    """(y, new residual or None) or, with quant = (quantize, fp8_dtype, pow2_scale), (y, new residual, q, scale)."""
    args = (as_rows(x), weight, bias, as_rows(residual) if residual is not None else None, float(eps),
            float(offset), is_rms, cast in ("llama", "input"), cast == "input")
    if quant is None:
        y, res_out, _, _ = torch.ops.wavefront.norm_fwd(*args)
        return y.view(x.shape), res_out.view(x.shape) if residual is not None else None
    y, res_out, _, _, q, q_scale = torch.ops.wavefront.norm_fwd_fp8(*args, *quant)
    return (y.view(x.shape), res_out.view(x.shape) if residual is not None else None,
            *shape_fp8_out(q, q_scale, tuple(x.shape), quant[0]))


_QUANTIZE_DOC = """
    quantize="rowwise" | "block1x128" | "block1x32" (ops.quantize's scalings; "block1x32" with pow2_scale=True is
    MXFP8) also returns the output's FP8 quantization ``(q, scale)``, computed in the same pass and
    bit-identical to ``ops.quantize(out, dtype=fp8_dtype, scaling=quantize, pow2_scale=pow2_scale)`` (same
    layout): the operand of an FP8 linear without a second read of the output. The output itself is
    unchanged (the residual stream and the backward use it). q and scale carry no gradient (they are a
    function of the forward value); the backward is the norm's, unchanged. "tensorwise" and "block128x128"
    are refused (the error says why).
"""


def rms_norm(x: Tensor, weight: Tensor | None, eps: float = 1e-6, offset: float = 0.0, *,
             cast: str = "llama", quantize: str | None = None, fp8_dtype: str = "e4m3",
             pow2_scale: bool = False) -> Tensor | tuple[Tensor, Tensor, Tensor]:
    """RMSNorm over the last dim: ``x / rms(x) * (weight + offset)``, output in x's dtype.

    offset=1.0 with zero-initialized weights is Gemma's convention. cast="llama" rounds the normalized
    value to x's dtype before the weight multiply (Hugging Face Llama); cast="gemma" multiplies in fp32;
    cast="input" computes in x's dtype, rounding where eager PyTorch without an upcast does (mean square,
    + eps, rsqrt, xhat, weight + offset; sums accumulate in fp32): for loops that expect no upcast. The
    backward is computed in fp32 from the saved (rounded) rstd in every mode.
    With quantize: ``(y, q, scale)``.
    """
    _check_norm_args("rms_norm", x, weight)
    check_choice("rms_norm", "cast", cast, CASTS)
    check_quantize("rms_norm", quantize, fp8_dtype, x)
    quant = None if quantize is None else (quantize, fp8_dtype, bool(pow2_scale))
    if x.numel() == 0 or not runtime.uses_triton(x.device):
        out = reference.rms_norm(x, weight, eps, offset, cast)
        return out if quant is None else with_quantized(out, *quant)
    out = _run_norm(x, weight, None, None, eps, offset, True, cast, quant)
    return out[0] if quant is None else (out[0], *out[2:])


def add_rms_norm(x: Tensor, residual: Tensor, weight: Tensor | None, eps: float = 1e-6, offset: float = 0.0,
                 *, cast: str = "llama", quantize: str | None = None, fp8_dtype: str = "e4m3",
                 pow2_scale: bool = False) -> tuple[Tensor, ...]:
    """``(rms_norm(x + residual), x + residual)`` in one pass; the sum is rounded to x's dtype first, so
    the first output equals rms_norm applied to the second. With quantize: ``(y, x + residual, q, scale)``,
    q the quantization of y."""
    _check_norm_args("add_rms_norm", x, weight, residual=residual)
    check_choice("add_rms_norm", "cast", cast, CASTS)
    check_quantize("add_rms_norm", quantize, fp8_dtype, x)
    quant = None if quantize is None else (quantize, fp8_dtype, bool(pow2_scale))
    if x.numel() == 0 or not runtime.uses_triton(x.device):
        out = reference.add_rms_norm(x, residual, weight, eps, offset, cast)
        return out if quant is None else with_quantized(out, *quant)
    return _run_norm(x, weight, None, residual, eps, offset, True, cast, quant)


def layer_norm(x: Tensor, weight: Tensor | None = None, bias: Tensor | None = None, eps: float = 1e-5, *,
               quantize: str | None = None, fp8_dtype: str = "e4m3",
               pow2_scale: bool = False) -> Tensor | tuple[Tensor, Tensor, Tensor]:
    """LayerNorm over the last dim with optional weight and bias, output in x's dtype. With quantize:
    ``(y, q, scale)``."""
    _check_norm_args("layer_norm", x, weight, bias)
    check_quantize("layer_norm", quantize, fp8_dtype, x)
    quant = None if quantize is None else (quantize, fp8_dtype, bool(pow2_scale))
    if x.numel() == 0 or not runtime.uses_triton(x.device):
        out = reference.layer_norm(x, weight, bias, eps)
        return out if quant is None else with_quantized(out, *quant)
    out = _run_norm(x, weight, bias, None, eps, 0.0, False, None, quant)
    return out[0] if quant is None else (out[0], *out[2:])


for _fn in (rms_norm, add_rms_norm, layer_norm):
    _fn.__doc__ += _QUANTIZE_DOC


# ---------------------------------------------------------------------------------------------------
# Registry entries.
# FLOPs per element (fwd / bwd): RMSNorm 4 / 8 (square, sum, scale, weight; backward two row sums and
# the dx expression), LayerNorm 7 / 10 (centring and bias on top), add adds 1 / 1.
# Minimal bytes: every tensor read once, every output written once, per-row statistics in fp32.


def _norm_bytes(case: Case, dtype: torch.dtype, mode: Mode, *, n_vectors: int, reads_fwd: int,
                writes_fwd: int, reads_bwd: int, writes_bwd: int, stats: int) -> int:
    """n_vectors: weight/bias vectors read forward and (as gradients) written backward."""
    e = itemsize(dtype)
    n_rows, n_cols = case.dims["n_rows"], case.dims["n_cols"]
    rows = n_rows * n_cols * e
    vec = n_cols * e * n_vectors
    if mode == "fwd":
        return (reads_fwd + writes_fwd) * rows + vec + stats * n_rows * 4 + fp8_out_bytes(case, mode)
    return (reads_bwd + writes_bwd) * rows + 2 * vec + stats * n_rows * 4


def _fp8_cases(op_cases: tuple[Case, ...], *variants: tuple[str, str, dict]) -> tuple[Case, ...]:
    """Copies of bench cases (by name) with the quantize option: (case name, suffix, options)."""
    by_name = {c.name: c for c in op_cases}
    return tuple(Case(f"{name}_{suffix}", f"{by_name[name].reason}, FP8 {opts['quantize']} fused",
                      by_name[name].dims, {**by_name[name].options, **opts}, targets=compiles_fp8_e4m3)
                 for name, suffix, opts in variants)


_FP8_BENCH = (
    ("llama3-8b_hidden", "fp8_rowwise", {"quantize": "rowwise"}),
    ("llama3-8b_hidden", "fp8_block1x128", {"quantize": "block1x128"}),
    ("llama3-8b_hidden", "fp8_mx", {"quantize": "block1x32", "pow2_scale": True}),
    ("wide_65536", "fp8_rowwise", {"quantize": "rowwise"}),  # the looped path's third pass
)


def _fp8_case(name: str, reason: str, n_rows: int, n_cols: int, **options) -> Case:
    return Case(name, reason, {"n_rows": n_rows, "n_cols": n_cols}, options, targets=compiles_fp8_e4m3)


def _input_dtype_bench() -> tuple[Case, ...]:
    """cast="input" at the first bench shape: the same bytes, a few conversions more per element."""
    base = bench_row_cases()[0]
    return (Case(f"{base.name}_input_dtype", f"{base.reason}, cast='input' (no upcast)", base.dims,
                 {**base.options, "cast": "input"}),)


_rms_reference, _rms_eager = registry_fns(reference.rms_norm)
_add_rms_reference, _add_rms_eager = registry_fns(reference.add_rms_norm)
_ln_reference, _ln_eager = registry_fns(reference.layer_norm)


def _rms_inputs(case: Case, dtype, device, gen) -> OpInputs:
    x = row_tensor(case, dtype, device, gen)
    offset = case.options.get("offset", 0.0) != 0.0  # Gemma's stored w - 1 is small
    w = randn((case.dims["n_cols"],), dtype, device, gen, scale=0.1 if offset else 1.0)
    return OpInputs((x, w), dict(case.options), (0, 1))


def _add_rms_inputs(case: Case, dtype, device, gen) -> OpInputs:
    x = row_tensor(case, dtype, device, gen)
    r = row_tensor(case, dtype, device, gen)
    w = randn((case.dims["n_cols"],), dtype, device, gen)
    return OpInputs((x, r, w), dict(case.options), (0, 1, 2))


def _ln_inputs(case: Case, dtype, device, gen) -> OpInputs:
    opts = dict(case.options)
    affine = opts.pop("affine", True)
    x = row_tensor(case, dtype, device, gen, shift=opts.pop("shift", 0.0))
    if not affine:
        return OpInputs((x, None, None), opts, (0,))
    w = randn((case.dims["n_cols"],), dtype, device, gen)
    b = randn((case.dims["n_cols"],), dtype, device, gen)
    return OpInputs((x, w, b), opts, (0, 1, 2))


SPECS = (
    OpSpec(
        name="rms_norm",
        fn=rms_norm,
        reference=_rms_reference,
        eager=_rms_eager,
        make_inputs=_rms_inputs,
        cases=row_cases(extra=(
            Case("gemma_offset", "Gemma: weight + 1 offset, multiply in fp32 then cast", {"n_rows": 8, "n_cols": 768},
                 {"offset": 1.0, "cast": "gemma"}),
            Case("input_dtype", "cast='input': computed in the input dtype, no upcast (eager without .float())",
                 {"n_rows": 8, "n_cols": 768}, {"cast": "input"}),
            Case("input_dtype_offset_wide", "cast='input' with Gemma's offset on the looped (wide-row) path",
                 {"n_rows": 2, "n_cols": 20000}, {"cast": "input", "offset": 1.0}),
            _fp8_case("fp8_block1x128", "FP8 1x128 quantization fused: y unchanged, ragged last block", 5, 300,
                      quantize="block1x128"),
        )),
        bench_cases=bench_row_cases() + _fp8_cases(bench_row_cases(), *_FP8_BENCH) + _input_dtype_bench(),
        flops=lambda c, mode: (4 if mode == "fwd" else 8) * numel(c),
        min_bytes=lambda c, dt, mode: _norm_bytes(c, dt, mode, n_vectors=1, reads_fwd=1, writes_fwd=1,
                                                  reads_bwd=2, writes_bwd=1, stats=1),
        description="RMSNorm over the last dim (Llama/Gemma/input-dtype casting)",
    ),
    OpSpec(
        name="add_rms_norm",
        fn=add_rms_norm,
        reference=_add_rms_reference,
        eager=_add_rms_eager,
        make_inputs=_add_rms_inputs,
        cases=row_cases(include=("npow2", "batched", "strided", "wide", "one_row"), extra=(
            _fp8_case("fp8_rowwise", "FP8 rowwise quantization of the normed output fused", 5, 300,
                      quantize="rowwise"),
        )),
        bench_cases=bench_row_cases() + _fp8_cases(bench_row_cases(), _FP8_BENCH[1]),
        flops=lambda c, mode: (5 if mode == "fwd" else 9) * numel(c),
        # fwd: read x, residual; write y, new residual. bwd: read dy, d(new residual), s; write dx.
        min_bytes=lambda c, dt, mode: _norm_bytes(c, dt, mode, n_vectors=1, reads_fwd=2, writes_fwd=2,
                                                  reads_bwd=3, writes_bwd=1, stats=1),
        description="residual add fused with RMSNorm; returns (normed, new residual)",
    ),
    OpSpec(
        name="layer_norm",
        fn=layer_norm,
        reference=_ln_reference,
        eager=_ln_eager,
        make_inputs=_ln_inputs,
        cases=row_cases(extra=(
            Case("no_affine", "no weight and no bias", {"n_rows": 6, "n_cols": 640}, {"affine": False}),
            Case("shifted_mean", "mean 50x the spread: variance must not cancel", {"n_rows": 4, "n_cols": 3000},
                 {"shift": 50.0}),
            Case("shifted_wide", "large mean across blocks: Chan's merge in the looped path",
                 {"n_rows": 2, "n_cols": 20000}, {"shift": 50.0}),
            _fp8_case("fp8_mx", "FP8 MX (1x32, power-of-two scales) quantization fused", 5, 300,
                      quantize="block1x32", pow2_scale=True),
        )),
        bench_cases=bench_row_cases() + _fp8_cases(bench_row_cases(), _FP8_BENCH[0]),
        flops=lambda c, mode: (7 if mode == "fwd" else 10) * numel(c),
        min_bytes=lambda c, dt, mode: _norm_bytes(c, dt, mode, n_vectors=2, reads_fwd=1, writes_fwd=1,
                                                  reads_bwd=2, writes_bwd=1, stats=2),
        description="LayerNorm over the last dim, optional weight and bias",
    ),
)
