"""FP8 quantization with tensorwise, rowwise and block scales: validation, custom op with a fake kernel,
registry entries.

``quantize(x, *, dtype="e4m3", scaling="tensorwise", pow2_scale=False) -> (q, scale)`` with ``x ~ q / scale``
(the scale multiplies x into the FP8 range: ``scale = fp8_max / amax``). Formats: "e4m3" (OCP E4M3FN, max
448), "e5m2" (OCP E5M2, max 57344), "e4m3fnuz" (max 240) and "e5m2fnuz" (max 57344), the FNUZ formats of
AMD MI300 (gfx942), whose matrix units take only those. Scalings and the scale's shape for x [..., N]:
"tensorwise" (), "rowwise" [..., 1], "block1x128" [..., cdiv(N, 128)], "block1x32" [..., cdiv(N, 32)]
(MXFP8's block; use pow2_scale=True for its power-of-two E8M0 scales), "block128x128" (2-D x only)
[cdiv(M, 128), cdiv(N, 128)]. The rounding and the saturation are stated in kernels/quantize.py; the
result is bit-identical to ``reference.fp8_quantize``. No autograd: the FP8 linear defines its own.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from wavefront import reference, runtime
from wavefront.archs import compiles_fp8_e4m3
from wavefront.kernels._scope import op_scope
from wavefront.ops._rows import randn
from wavefront.ops._spec import Case, Mode, OpInputs, OpSpec, Tolerance, itemsize
from wavefront.ops._validate import check_choice, check_tensor
from wavefront.shapes import MODELS

OP = "quantize"
FORMATS = tuple(reference.FP8_FORMATS)
SCALINGS = tuple(reference.FP8_SCALINGS)
_INPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _scale_shape(shape: tuple[int, ...], scaling: str) -> tuple[int, ...]:
    n = shape[-1]
    if scaling == "tensorwise":
        return ()
    if scaling == "rowwise":
        return (*shape[:-1], 1)
    if scaling == "block128x128":
        return (math.ceil(shape[0] / 128), math.ceil(n / 128))
    return (*shape[:-1], math.ceil(n / reference.FP8_SCALINGS[scaling][1]))


@torch.library.custom_op("wavefront::quantize_fp8", mutates_args=())
def _quantize_fp8(x: Tensor, dtype: str, scaling: str, pow2_scale: bool) -> tuple[Tensor, Tensor]:
    from wavefront.kernels import quantize as kernels  # lazy: Triton-free import

    check_fp8_target(OP, x.device)  # in the op body: torch.compile does not trace runtime.arch
    with op_scope(OP):
        return kernels.quantize(x, reference.FP8_FORMATS[dtype], scaling, pow2_scale)


@_quantize_fp8.register_fake
def _(x, dtype, scaling, pow2_scale):
    return (x.new_empty(x.shape, dtype=reference.FP8_FORMATS[dtype]),
            x.new_empty(_scale_shape(tuple(x.shape), scaling), dtype=torch.float32))


def check_fp8_target(op: str, device) -> None:
    """A clear error where Triton cannot compile FP8 (NVIDIA before sm_89) instead of a compiler trace."""
    arch = runtime.arch(device)
    if not compiles_fp8_e4m3(arch):
        raise ValueError(f"{op}: FP8 needs an NVIDIA GPU of sm_89 (Ada) or newer, or an AMD GPU; this device is "
                         f"{arch.name}")


def quantize_rows(x2: Tensor, dtype: str, scaling: str, pow2_scale: bool) -> tuple[Tensor, Tensor]:
    """The kernel on a 2-D [rows, n] tensor (any strides), no validation: for ops that quantize their
    operands (linear_fp8). The reference on CPU without the interpreter."""
    if x2.numel() == 0 or not runtime.uses_triton(x2.device):
        return reference.fp8_quantize(x2, dtype=dtype, scaling=scaling, pow2_scale=pow2_scale)
    return torch.ops.wavefront.quantize_fp8(x2, dtype, scaling, pow2_scale)


def quantize(x: Tensor, *, dtype: str = "e4m3", scaling: str = "tensorwise",
             pow2_scale: bool = False) -> tuple[Tensor, Tensor]:
    """(q, scale): x scaled into `dtype`'s range per `scaling` group and rounded to it (see module docstring)."""
    check_tensor(OP, "x", x, dtypes=_INPUT_DTYPES)
    check_choice(OP, "dtype", dtype, FORMATS)
    check_choice(OP, "scaling", scaling, SCALINGS)
    if scaling == "block128x128" and x.dim() != 2:
        raise ValueError(f"{OP}: scaling='block128x128' needs a 2-D 'x' (a weight), got shape {tuple(x.shape)}")
    if x.dim() == 1 and scaling != "tensorwise":
        x = x.unsqueeze(0)
        q, s = quantize_rows(x, dtype, scaling, pow2_scale)
        return q.view(-1), s.view(-1)
    x2 = x if x.dim() == 2 else x.reshape(-1, x.shape[-1])
    q, s = quantize_rows(x2, dtype, scaling, pow2_scale)
    return q.view(x.shape), s.view(_scale_shape(tuple(x.shape), scaling))


def _reference(x, *, dtype="e4m3", scaling="tensorwise", pow2_scale=False):
    """reference.fp8_quantize with q's values widened to x's dtype (the accuracy harness reduces over them)."""
    q, s = reference.fp8_quantize(x, dtype=dtype, scaling=scaling, pow2_scale=pow2_scale)
    return q.to(torch.float64 if x.dtype == torch.float64 else torch.float32), s


def _eager(x, *, dtype="e4m3", scaling="tensorwise", pow2_scale=False):
    q, s = reference.fp8_quantize_eager(x, dtype=dtype, scaling=scaling, pow2_scale=pow2_scale)
    return q.float(), s


# ---------------------------------------------------------------------------------------------------
# Registry entry. dims: n_rows, n_cols; options: dtype, scaling, pow2_scale; layout "transposed" (x a
# transposed view: strided columns, the weight-columnwise operand of the FP8 backward), "batched".


def _inputs(case: Case, dtype, device, gen) -> OpInputs:
    n_rows, n_cols = case.dims["n_rows"], case.dims["n_cols"]
    opts = dict(case.options)
    spread = opts.pop("spread", 0.0)
    zero_rows = opts.pop("zero_rows", False)
    if case.layout == "transposed":
        x = randn((n_cols, n_rows), dtype, device, gen).t()
    elif case.layout == "batched":
        x = randn((2, n_rows // 2, n_cols), dtype, device, gen)
    else:
        x = randn((n_rows, n_cols), dtype, device, gen)
    if spread:
        # Row magnitudes over 2 * spread decades: the scales differ per group, values reach the subnormals.
        mags = torch.logspace(-spread, spread, x.shape[-2], dtype=torch.float64).to(device=device, dtype=dtype)
        x = x * mags[:, None]
    if zero_rows:
        x = x.clone()
        x[..., ::3, :] = 0
    return OpInputs((x,), opts, ())


def _bytes(case: Case, dtype: torch.dtype, mode: Mode) -> int:
    n = case.dims["n_rows"] * case.dims["n_cols"]
    n_scales = max(1, math.prod(_scale_shape((case.dims["n_rows"], case.dims["n_cols"]),
                                             case.options.get("scaling", "tensorwise"))))
    return n * itemsize(dtype) + n + 4 * n_scales


def _case(name, reason, n_rows, n_cols, layout="contiguous", slow=False, **options):
    return Case(name, reason, {"n_rows": n_rows, "n_cols": n_cols}, options, layout=layout, slow=slow)


CASES = (
    _case("tensorwise", "one scale: the two-launch amax (atomic max) then quantize", 37, 300),
    _case("tensorwise_e5m2", "e5m2 (the gradient format): 2 mantissa bits", 16, 96, slow=True, dtype="e5m2"),
    _case("rowwise_pow2", "per-row scales rounded down to powers of two (torchao rowwise)", 9, 200,
          scaling="rowwise", pow2_scale=True, spread=3.0),
    _case("rowwise_wide", "rows wider than one block: the two-pass wide-row kernel", 3, 9000, scaling="rowwise"),
    _case("rowwise_zero_rows", "all-zero rows: EPS keeps the scale finite and q zero", 12, 64, scaling="rowwise",
          zero_rows=True),
    _case("block1x128", "DeepSeek-V3 activation tiles, ragged last tile", 20, 300, scaling="block1x128",
          spread=2.0),
    _case("block1x32_mx", "MXFP8 blocks with power-of-two scales", 8, 96, scaling="block1x32", pow2_scale=True),
    _case("block128x128", "DeepSeek-V3 weight blocks, ragged in both dims", 150, 200, scaling="block128x128",
          spread=2.0),
    _case("transposed_rowwise", "a transposed view (weight columns): strided rows", 48, 40, layout="transposed",
          scaling="rowwise"),
    _case("batched_block", "leading batch dims flatten into rows", 16, 256, layout="batched", slow=True,
          scaling="block1x128"),
    _case("e4m3fnuz", "AMD MI300's FNUZ e4m3 (max 240, bias 8)", 24, 128, dtype="e4m3fnuz", scaling="rowwise",
          spread=2.0),
    _case("e5m2fnuz", "AMD MI300's FNUZ e5m2", 24, 128, slow=True, dtype="e5m2fnuz", scaling="block1x128"),
)


def _bench_cases() -> tuple[Case, ...]:
    m = MODELS["llama3-8b"]
    tokens = 8192
    return (
        _case("llama3-8b_act_rowwise", f"activation [{tokens}, hidden] rowwise", tokens, m.hidden, scaling="rowwise"),
        _case("llama3-8b_act_block", f"activation [{tokens}, hidden] 1x128 tiles", tokens, m.hidden,
              scaling="block1x128"),
        _case("llama3-8b_w_block", "MLP weight [ffn, hidden] 128x128 blocks", m.ffn_hidden, m.hidden,
              scaling="block128x128"),
        _case("llama3-8b_grad_tensorwise", f"gradient [{tokens}, ffn] tensorwise e5m2", tokens, m.ffn_hidden,
              dtype="e5m2"),
    )


SPECS = (
    OpSpec(
        name=OP,
        targets=compiles_fp8_e4m3,  # no FP8 on Ampere: sm_80 is not inspected
        fn=quantize,
        reference=_reference,
        eager=_eager,
        make_inputs=_inputs,
        cases=CASES,
        bench_cases=_bench_cases(),
        # |x|, max, x * s, clamp: ~4 per element.
        flops=lambda c, mode: 4 * c.dims["n_rows"] * c.dims["n_cols"],
        min_bytes=_bytes,
        # Bit-exact: the quantization is a function of the inputs (the amax is order-free, the scale one
        # correctly rounded division, the product one fp32 rounding), so any error fails.
        tolerance=Tolerance(factor=2.0, floor_ulps=0.0),
        has_backward=False,
        # fp16 inputs take bf16's path (a 16-bit load widened to fp32): tests/ops/test_quantize.py checks them.
        dtypes=(torch.float32, torch.bfloat16),
        description="x -> (fp8 q, fp32 scale), amax in the same pass, saturating RNE cast",
    ),
)
