"""The ``quantize=`` option of the ops that produce linear inputs (the norms, the gated activations):
validation, the fake shapes, the autograd, the reference, and the reasons some scalings are refused.

``quantize`` takes ops.quantize's scaling names, ``fp8_dtype`` and ``pow2_scale`` its ``dtype`` and
``pow2_scale``; the op then also returns ``(q, scale)`` in exactly the layout ``ops.quantize(out,
dtype=fp8_dtype, scaling=quantize, pow2_scale=pow2_scale)`` returns, bit-identical to it (the producer
quantizes its rounded output in registers: kernels/_quantize_epilogue.py).
"""

from __future__ import annotations

import torch
from torch import Tensor

from wavefront import reference
from wavefront.ops._validate import check_choice
from wavefront.ops.quantize import FORMATS, SCALINGS, _scale_shape
from wavefront.ops.quantize import quantize as quantize_op

#: Scalings a row-producing kernel can fuse: the scale groups lie inside one program's row or row block.
ROW_SCALINGS = ("rowwise", "block1x128", "block1x32")
_INPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

_WHY_NOT = {
    "tensorwise": "its one scale needs the amax of the whole output before any element is quantized: fused, "
                  "that is a grid-wide atomic amax and a second pass over the output, the same bytes as the "
                  "separate ops.quantize(out, scaling='tensorwise'); use that",
    "block128x128": "its 128 x 128 blocks (the weights' scaling) span 128 rows while each program of this op "
                    "owns one row; use ops.quantize(out, scaling='block128x128')",
}


def check_quantize(op: str, quantize: str | None, fp8_dtype: str, x: Tensor,
                   supported: tuple[str, ...] = ROW_SCALINGS, why_not: dict[str, str] | None = None) -> None:
    """Clear errors for the quantize option; a no-op when quantize is None."""
    if quantize is None:
        return
    check_choice(op, "quantize", quantize, SCALINGS)
    if quantize not in supported:
        reason = {**_WHY_NOT, **(why_not or {})}[quantize]
        raise ValueError(f"{op}: quantize={quantize!r} is not fused into this op: {reason}. Fused here: "
                         f"{list(supported)}")
    check_choice(op, "fp8_dtype", fp8_dtype, FORMATS)
    if x.dtype not in _INPUT_DTYPES:
        raise ValueError(f"{op}: quantize needs a float32, bfloat16 or float16 output, got {x.dtype}")


def quant_spec(fp8_dtype: str, quantize: str, pow2_scale: bool) -> tuple[torch.dtype, str, bool]:
    """The kernels' (torch fp8 dtype, scaling, pow2) triple."""
    return reference.FP8_FORMATS[fp8_dtype], quantize, bool(pow2_scale)


def fake_fp8_out(y: Tensor, quantize: str, fp8_dtype: str) -> tuple[Tensor, Tensor]:
    """Empty (q, scale) of a 2-D [n_rows, n_cols] output, for register_fake."""
    return (y.new_empty(y.shape, dtype=reference.FP8_FORMATS[fp8_dtype]),
            y.new_empty(_scale_shape(tuple(y.shape), quantize), dtype=torch.float32))


def shape_fp8_out(q2: Tensor, s2: Tensor, shape: tuple[int, ...], quantize: str) -> tuple[Tensor, Tensor]:
    """(q, scale) of a [rows, n] kernel result viewed as ops.quantize lays them out for an output of `shape`
    (1-D outputs: scale 1-D too, as ops.quantize does)."""
    if len(shape) == 1:
        return q2.view(-1), s2.view(-1)
    return q2.view(shape), s2.view(_scale_shape(shape, quantize))


def register_fp8_autograd(fp8_op, setup_context, backward) -> None:
    """The autograd of a producer's FP8 custom op, whose inputs are the plain op's then (quantize, fp8_dtype,
    pow2_scale) and whose outputs are the plain op's then (q, scale): the plain op's `setup_context` and
    `backward`; q and scale carry no gradient (a function of the forward value), nor do the three options."""

    def setup(ctx, inputs, output):
        plain = output[:-2]
        setup_context(ctx, inputs[:-3], plain[0] if len(plain) == 1 else plain)
        ctx.mark_non_differentiable(*output[-2:])

    def fp8_backward(ctx, *grads):
        return (*backward(ctx, *grads[:-2]), None, None, None)

    fp8_op.register_autograd(fp8_backward, setup_context=setup)


def with_quantized(out: Tensor | tuple, quantize: str, fp8_dtype: str, pow2_scale: bool) -> tuple:
    """The reference path's result (CPU without the interpreter, empty input): the op's output(s) `out`, then
    ops.quantize of the first, as the fused kernel returns them."""
    outs = out if isinstance(out, tuple) else (out,)
    return (*outs, *quantize_op(outs[0], dtype=fp8_dtype, scaling=quantize, pow2_scale=pow2_scale))


def reference_fp8_out(y: Tensor, quantize: str, fp8_dtype: str, pow2_scale: bool) -> tuple[Tensor, Tensor]:
    """reference.fp8_quantize of the output. q is widened to fp32 (fp64 for fp64 y) for the accuracy harness."""
    q, s = reference.fp8_quantize(y, dtype=fp8_dtype, scaling=quantize, pow2_scale=pow2_scale)
    return q.to(torch.float64 if y.dtype == torch.float64 else torch.float32), s


# ---------------------------------------------------------------------------------------------------
# Registry: the producers' reference and eager functions with the option, and the FP8 outputs' bytes.


def registry_fns(fn):
    """(reference, eager) for an op's registry entry: `fn` (the op's plain reference) with the quantize
    option. The reference returns None for q and scale, so the accuracy harness compares the op's own
    outputs only: a float64 reference quantizes a differently rounded output, where an FP8 code may flip at
    a rounding boundary, so no max-error rule holds for q; its bit-identity with ops.quantize of our output
    is tested instead (tests/ops/test_fused_quantize.py). The eager function returns the unfused quantize
    PyTorch users run after the op (reference.fp8_quantize_eager), the traffic tool's baseline."""

    def split(args, kwargs):
        quant = (kwargs.pop("quantize", None), kwargs.pop("fp8_dtype", "e4m3"), kwargs.pop("pow2_scale", False))
        out = fn(*args, **kwargs)
        return out if isinstance(out, tuple) else (out,), quant

    def ref(*args, **kwargs):
        outs, (quantize, _, _) = split(args, kwargs)
        if quantize is None:
            return outs if len(outs) > 1 else outs[0]
        return (*outs, None, None)

    def eager(*args, **kwargs):
        outs, (quantize, fp8_dtype, pow2_scale) = split(args, kwargs)
        if quantize is None:
            return outs if len(outs) > 1 else outs[0]
        return (*outs, *reference.fp8_quantize_eager(outs[0], dtype=fp8_dtype, scaling=quantize,
                                                     pow2_scale=pow2_scale))

    ref.__doc__ = eager.__doc__ = fn.__doc__
    return ref, eager


def fp8_out_bytes(case, mode: str) -> int:
    """Bytes of the FP8 outputs a case with the quantize option writes (forward): 1 per element, 4 per scale."""
    quantize = case.options.get("quantize")
    if quantize is None or mode != "fwd":
        return 0
    n_rows, n_cols = case.dims["n_rows"], case.dims["n_cols"]
    n_scales = 1
    for d in _scale_shape((n_rows, n_cols), quantize):
        n_scales *= d
    return n_rows * n_cols + 4 * n_scales
