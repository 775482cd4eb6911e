"""SwiGLU and GeGLU: validation, custom ops with fake kernels, autograd (saves the inputs, recomputes the
activation in the backward), registry entries.

``quantize="block1x128" | "block1x32"`` (with ``fp8_dtype``, ``pow2_scale``) runs ``wavefront::glu_fwd_fp8``: the
same kernel also writes the output's FP8 quantization, bit-identical to ``ops.quantize`` of the output
(ops/_fused_quantize.py); its autograd is the plain op's, the FP8 outputs marked non-differentiable.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from wavefront import reference, runtime
from wavefront.archs import compiles_fp8_e4m3
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
from wavefront.ops._rows import bench_row_cases, numel, row_cases, row_tensor
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
from wavefront.shapes import MODELS

# Activation codes shared with kernels/_math.py (kept here so importing the op does not import Triton).
ACTS = {"silu": 0, "gelu_tanh": 1, "gelu_none": 2}
APPROXIMATIONS = ("tanh", "none")
#: The FP8 scalings fused here: a program owns a power-of-two block of a row (kernels/glu.py).
FP8_SCALINGS = ("block1x128", "block1x32")
_WHY_NOT_ROWWISE = {"rowwise": "each program owns a block of up to 4096 columns of a row, so a row's scale "
                               "needs a cross-program amax and a second pass over the output, the same bytes as "
                               "the separate ops.quantize(out, scaling='rowwise'); use that, or 'block1x128'"}


@torch.library.custom_op("wavefront::glu_fwd", mutates_args=())
def _glu_fwd(gate: Tensor, up: Tensor, act: int, gate_mult: float, out_mult: float) -> Tensor:
    from wavefront.kernels import glu as kernels  # lazy: Triton-free import

    with op_scope("swiglu" if act == 0 else "geglu"):
        return kernels.glu_fwd(gate, up, act, gate_mult=gate_mult, out_mult=out_mult)


@_glu_fwd.register_fake
def _(gate, up, act, gate_mult, out_mult):
    return gate.new_empty(gate.shape)


@torch.library.custom_op("wavefront::glu_bwd", mutates_args=())
def _glu_bwd(dy: Tensor, gate: Tensor, up: Tensor, act: int, gate_mult: float,
             out_mult: float) -> tuple[Tensor, Tensor]:
    from wavefront.kernels import glu as kernels  # lazy: Triton-free import

    with op_scope("swiglu" if act == 0 else "geglu"):
        return kernels.glu_bwd(dy, gate, up, act, gate_mult, out_mult)


@_glu_bwd.register_fake
def _(dy, gate, up, act, gate_mult, out_mult):
    return gate.new_empty(gate.shape), gate.new_empty(gate.shape)


def _setup_context(ctx, inputs, output):
    gate, up, act, gate_mult, out_mult = inputs[:5]
    ctx.save_for_backward(gate, up)
    ctx.act, ctx.gate_mult, ctx.out_mult = act, gate_mult, out_mult


def _backward(ctx, dy):
    gate, up = ctx.saved_tensors
    dgate, dup = torch.ops.wavefront.glu_bwd(as_rows(dy), gate, up, ctx.act, ctx.gate_mult, ctx.out_mult)
    return dgate, dup, None, None, None


_glu_fwd.register_autograd(_backward, setup_context=_setup_context)


@torch.library.custom_op("wavefront::glu_fwd_fp8", mutates_args=())
def _glu_fwd_fp8(gate: Tensor, up: Tensor, act: int, gate_mult: float, out_mult: float, quantize: str,
                 fp8_dtype: str, pow2_scale: bool) -> tuple[Tensor, Tensor, Tensor]:
    from wavefront.kernels import glu as kernels  # lazy: Triton-free import

    op = "swiglu" if act == 0 else "geglu"
    check_fp8_target(op, gate.device)  # in the op body: torch.compile does not trace runtime.arch
    with op_scope(op):
        return kernels.glu_fwd(gate, up, act, quant_spec(fp8_dtype, quantize, pow2_scale), gate_mult, out_mult)


@_glu_fwd_fp8.register_fake
def _(gate, up, act, gate_mult, out_mult, quantize, fp8_dtype, pow2_scale):
    return (gate.new_empty(gate.shape), *fake_fp8_out(gate, quantize, fp8_dtype))


register_fp8_autograd(_glu_fwd_fp8, _setup_context, _backward)


def _run(op: str, gate: Tensor, up: Tensor, act: int, ref, quantize: str | None = None, fp8_dtype: str = "e4m3",
         pow2_scale: bool = False, gate_multiplier: float = 1.0, output_multiplier: float = 1.0):
    check_tensor(op, "gate", gate)
    check_tensor(op, "up", up)
    check_shape(op, "up", up, tuple(gate.shape), "the shape of 'gate'")
    check_same_dtype(op, gate=gate, up=up)
    check_same_device(op, gate=gate, up=up)
    check_quantize(op, quantize, fp8_dtype, gate, FP8_SCALINGS, _WHY_NOT_ROWWISE)
    mults = (_check_multiplier(op, "gate_multiplier", gate_multiplier),
             _check_multiplier(op, "output_multiplier", output_multiplier))
    if gate.numel() == 0 or not runtime.uses_triton(gate.device):
        return ref() if quantize is None else with_quantized(ref(), quantize, fp8_dtype, pow2_scale)
    if quantize is None:
        return torch.ops.wavefront.glu_fwd(as_rows(gate), as_rows(up), act, *mults).view(gate.shape)
    y, q, q_scale = torch.ops.wavefront.glu_fwd_fp8(as_rows(gate), as_rows(up), act, *mults, quantize, fp8_dtype,
                                                     bool(pow2_scale))
    return (y.view(gate.shape), *shape_fp8_out(q, q_scale, tuple(gate.shape), quantize))


def _check_multiplier(op: str, name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{op}: argument '{name}' must be a finite number, got {value!r}")
    return float(value)


_MULTIPLIER_DOC = """
    gate_multiplier, output_multiplier (muP, Falcon-H1's ``mlp_multipliers``): ``act(round(gate * m_g)) * up
    * m_o``; the gate product is rounded to the dtype as Hugging Face's ``gate_proj(x) * m_g`` is, the output
    rounded once. m_o stands for a multiplier after the down projection (``down(y) * m_o == down(y * m_o)``),
    fused here instead of a pass over the down projection's output. Both 1.0 (default): the kernel without
    them.
"""

_QUANTIZE_DOC = """
    quantize="block1x128" | "block1x32" (ops.quantize's scalings; "block1x32" with pow2_scale=True is MXFP8)
    returns ``(y, q, scale)``: y's FP8 quantization computed in the same pass, bit-identical to
    ``ops.quantize(y, dtype=fp8_dtype, scaling=quantize, pow2_scale=pow2_scale)`` (same layout), the down
    projection's FP8 operand without a second read of y. y is unchanged; q and scale carry no gradient
    (they are a function of the forward value) and the backward is unchanged. "rowwise", "tensorwise" and
    "block128x128" are refused (the error says why).
"""


def swiglu(gate: Tensor, up: Tensor, *, gate_multiplier: float = 1.0, output_multiplier: float = 1.0,
           quantize: str | None = None, fp8_dtype: str = "e4m3",
           pow2_scale: bool = False) -> Tensor | tuple[Tensor, Tensor, Tensor]:
    """``silu(gate) * up`` with Hugging Face's rounding (silu rounded to the dtype, then the product).

    gate and up may be column slices of one fused projection output (no copy); the backward recomputes
    silu from the saved inputs.
    """
    mults = {"gate_multiplier": gate_multiplier, "output_multiplier": output_multiplier}
    return _run("swiglu", gate, up, ACTS["silu"], lambda: reference.swiglu(gate, up, **mults), quantize, fp8_dtype,
                pow2_scale, **mults)


def geglu(gate: Tensor, up: Tensor, approximate: str = "tanh", *, gate_multiplier: float = 1.0,
          output_multiplier: float = 1.0, quantize: str | None = None, fp8_dtype: str = "e4m3",
          pow2_scale: bool = False) -> Tensor | tuple[Tensor, Tensor, Tensor]:
    """``gelu(gate, approximate) * up`` (Gemma's MLP uses the tanh form) with Hugging Face's rounding."""
    check_choice("geglu", "approximate", approximate, APPROXIMATIONS)
    mults = {"gate_multiplier": gate_multiplier, "output_multiplier": output_multiplier}
    return _run("geglu", gate, up, ACTS[f"gelu_{approximate}"],
                lambda: reference.geglu(gate, up, approximate, **mults), quantize, fp8_dtype, pow2_scale, **mults)


for _fn in (swiglu, geglu):
    _fn.__doc__ += _MULTIPLIER_DOC + _QUANTIZE_DOC


# ---------------------------------------------------------------------------------------------------
# Registry entries: rows are tokens, columns the MLP's intermediate size.


def _inputs(case: Case, dtype, device, gen) -> OpInputs:
    opts = dict(case.options)
    scale = opts.pop("scale", 2.0)
    if case.layout == "fused":
        # gate and up as the two halves of one [rows, 2 x n_cols] projection output, like a fused gate_up_proj.
        n_rows, n_cols = case.dims["n_rows"], case.dims["n_cols"]
        both = (torch.randn(n_rows, 2 * n_cols, generator=gen) * scale).to(device=device, dtype=dtype)
        return OpInputs((both[:, :n_cols], both[:, n_cols:]), opts, (0, 1))
    gate = row_tensor(case, dtype, device, gen, scale=scale)
    up = row_tensor(case, dtype, device, gen)
    return OpInputs((gate, up), opts, (0, 1))


def _mult_flops(case: Case, mode: Mode) -> int:
    """Per element: gate * m_g and the output's * m_o (backward: those two and act' * m_g)."""
    scaled = any(case.options.get(k, 1.0) != 1.0 for k in ("gate_multiplier", "output_multiplier"))
    return (2 if mode == "fwd" else 3) if scaled else 0


def _bytes(case: Case, dtype: torch.dtype, mode: Mode) -> int:
    # fwd: read gate and up, write y (and q, scales). bwd: read dy, gate and up, write dgate and dup.
    return (3 if mode == "fwd" else 5) * numel(case) * itemsize(dtype) + fp8_out_bytes(case, mode)


_EXTRA = (
    Case("multi_block", "rows of 9000: two whole 4096-element blocks and a masked tail", {"n_rows": 2, "n_cols": 9000}),
    Case("fused_gate_up", "gate and up are column halves of one fused projection (row stride 2x width)",
         {"n_rows": 12, "n_cols": 704}, layout="fused"),
    Case("saturated", "gates up to ~24: the activation saturates, its derivative underflows",
         {"n_rows": 8, "n_cols": 512}, {"scale": 8.0}),
    Case("small_gates", "gates near 0: tanh's series branch and silu's linear regime",
         {"n_rows": 8, "n_cols": 512}, {"scale": 0.01}),
    Case("mup_multipliers", "muP gate and output multipliers (Falcon-H1-style values)", {"n_rows": 8, "n_cols": 704},
         {"gate_multiplier": 0.4, "output_multiplier": 1.7}),
)


def _bench_cases(fp8: bool = False):
    widths = {f"{m}_ffn": MODELS[m].ffn_hidden for m in ("llama3-8b", "llama3-70b", "qwen2.5-7b", "gemma2-9b")}
    cases = bench_row_cases(widths)
    # muP multipliers (Falcon-H1): the same bytes, two multiplies more per element (three in the backward).
    base = cases[0]
    cases += (Case(f"{base.name}_mup", f"{base.reason}, muP gate and output multipliers fused", base.dims,
                   {"gate_multiplier": 0.5, "output_multiplier": 1.5}),)
    if not fp8:
        return cases
    # The down projection's FP8 operand: DeepSeek-V3's 1x128 tiles and MXFP8's 1x32 power-of-two blocks.
    base = cases[0]
    return cases + tuple(
        Case(f"{base.name}_{suffix}", f"{base.reason}, FP8 {opts['quantize']} fused", base.dims, opts,
             targets=compiles_fp8_e4m3)
        for suffix, opts in (("fp8_block1x128", {"quantize": "block1x128"}),
                             ("fp8_mx", {"quantize": "block1x32", "pow2_scale": True})))


_FP8_CASE = Case("fp8_block1x128", "FP8 1x128 quantization fused: y unchanged, a ragged last tile",
                 {"n_rows": 4, "n_cols": 300}, {"quantize": "block1x128"}, targets=compiles_fp8_e4m3)
_swiglu_reference = registry_fns(reference.swiglu)[0]
_swiglu_eager = registry_fns(reference.swiglu_eager)[1]


SPECS = (
    OpSpec(
        name="swiglu",
        fn=swiglu,
        reference=_swiglu_reference,
        eager=_swiglu_eager,
        make_inputs=_inputs,
        # Elementwise: wide rows only add blocks, so the row regimes stop at one multi-block case.
        cases=row_cases(include=("one_row", "npow2", "width_one", "rows_pow2", "batched", "strided", "transposed"),
                        extra=(*_EXTRA, _FP8_CASE)),
        bench_cases=_bench_cases(fp8=True),
        # silu: exp2, add, divide, multiply; times up. bwd adds the derivative's 4 and two products.
        flops=lambda c, mode: ((5 if mode == "fwd" else 11) + _mult_flops(c, mode)) * numel(c),
        min_bytes=_bytes,
        description="silu(gate) * up, Hugging Face rounding, backward recomputes silu",
    ),
    OpSpec(
        name="geglu",
        fn=geglu,
        reference=reference.geglu,
        eager=reference.geglu_eager,
        make_inputs=_inputs,
        cases=row_cases(include=("npow2", "batched", "strided", "one_row"), extra=(
            *_EXTRA,
            Case("erf", "the exact (erf) gelu", {"n_rows": 8, "n_cols": 1000}, {"approximate": "none"}),
            Case("erf_saturated", "erf gelu at large |gate|", {"n_rows": 8, "n_cols": 512},
                 {"approximate": "none", "scale": 8.0}),
        )),
        bench_cases=_bench_cases(),
        # gelu (tanh form): cube, fma, tanh via exp2 and a divide, 3 multiplies; bwd roughly doubles it.
        flops=lambda c, mode: ((10 if mode == "fwd" else 20) + _mult_flops(c, mode)) * numel(c),
        min_bytes=_bytes,
        description="gelu(gate) * up (tanh or erf form), Hugging Face rounding",
    ),
)
