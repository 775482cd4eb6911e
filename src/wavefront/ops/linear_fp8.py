"""FP8 linear: ``x @ weight.T + bias`` with both operands quantized to FP8 and scaled back in the GEMM;
validation, custom ops with fake kernels, autograd, registry.

``linear_fp8(x, weight, bias=None, *, recipe="rowwise", fnuz=None, provider="auto")``. Every product
quantizes its two operands along its reduction dim (kernels/quantize.py), then multiplies them in FP8 with
fp32 accumulation (kernels/linear_fp8.py):

    recipe      x, dY (and x^T, dY^T)   W (and W^T)        gradient format   scales
    tensorwise  one scale               one scale          e5m2              fp32      torchao default
    rowwise     per row                 per row            e4m3              2^k       torchao rowwise
    blockwise   1 x 128 tiles           128 x 128 blocks   e4m3              fp32      DeepSeek-V3
    mxfp8       1 x 32 blocks           1 x 32 blocks      e4m3              2^k       OCP MX

    forward  y  = Qa(x) Qw(W)^T + b
    backward dx = Qg(dY) Qw(W^T)^T,  dW = Qg(dY^T) Qa(x^T)^T,  db = sum_rows dY (not quantized)

Saved for backward: x and W in their own dtype (each backward product re-quantizes its operands along its
own reduction dim, which differs from the forward's for rowwise and block scales). fnuz: the FNUZ formats
(default: on gfx942, whose matrix units take only those). provider: "auto" (the rule of
``kernels.linear_fp8.fp8_gemm_provider``: torch._scaled_mm where it computes the same product), "wavefront"
or "vendor" (tensorwise and rowwise only). fp64 inputs, empty problems and CPU runs without the
interpreter use ``reference.linear_fp8``.

Pre-quantized operands (``x_fp8=``, ``weight_fp8=``: a :class:`Quantized`, exported as
``wavefront.ops.Quantized``): an operand already quantized for the forward product, e.g. by the norm or the
activation that produced it, or gathered in FP8 by FSDP2 (wavefront.parallel.fp8_fsdp). Its ``data`` and
``scale`` are exactly what ``ops.quantize`` returns for that operand in the recipe (format, scaling and
power-of-two rounding of ``reference.fp8_recipe_operand(recipe, "act" | "weight")``); the forward then skips
quantizing that operand, and the output is bit-identical to letting the op quantize it. The rule for the
backward: a pre-quantized operand is a forward-only shortcut. ``x`` and ``weight`` are still passed in high
precision: they are the autograd inputs (gradients flow to them) and the backward quantizes them along its
own reduction dims (dx needs W^T scaled per column of W for the rowwise and MXFP8 recipes, dW needs x^T
scaled per column of x), which the forward's FP8 copy cannot give. The FSDP2 path, where no rank holds the
whole high-precision weight, passes the backward's FP8 copy too (:func:`forward_prequantized`,
:func:`backward_prequantized`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from wavefront import reference, runtime
from wavefront.archs import compiles_fp8_e4m3
from wavefront.kernels._scope import op_scope
from wavefront.ops._rows import randn
from wavefront.ops._spec import Case, Mode, OpInputs, OpSpec, itemsize
from wavefront.ops._validate import as_rows, check_choice, check_same_device, check_same_dtype, check_tensor
from wavefront.ops.quantize import _scale_shape as scale_shape
from wavefront.ops.quantize import check_fp8_target
from wavefront.shapes import MODELS

OP = "linear_fp8"
RECIPES = tuple(reference.FP8_RECIPES)
PROVIDERS = ("auto", "wavefront", "vendor")
_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


@dataclass(frozen=True)
class Quantized:
    """An FP8 operand quantized ahead of time: ``data`` (an FP8 tensor of the operand's shape) and ``scale``
    (fp32, ``x ~ data / scale``) in exactly the layout ``ops.quantize(x, dtype=..., scaling=scaling)`` returns."""

    data: Tensor
    scale: Tensor
    scaling: str


def _quantized(t: Tensor, recipe: str, role: str, fnuz: bool,
               given: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor, str]:
    fmt, scaling, pow2 = reference.fp8_recipe_operand(recipe, role, fnuz)
    if given is not None:
        return given[0], given[1], scaling
    from wavefront.kernels import quantize as kq  # lazy: Triton-free import

    q, s = kq.quantize(t, reference.FP8_FORMATS[fmt], scaling, pow2)
    return q, s, scaling


def _product(a: Tensor | None, b: Tensor | None, roles: tuple[str, str], recipe: str, fnuz: bool,
             bias: Tensor | None, out_dtype: torch.dtype, provider: str, residual: Tensor | None = None,
             given_a: tuple[Tensor, Tensor] | None = None, given_b: tuple[Tensor, Tensor] | None = None) -> Tensor:
    """dequant(Q(a)) dequant(Q(b))^T + bias + residual for a [M, R], b [N, R] quantized along R; given_a /
    given_b: the (q, s) of an operand quantized ahead of time (its high-precision tensor is then unused)."""
    from wavefront.kernels import linear_fp8 as kernels  # lazy: Triton-free import

    qa, sa, a_scaling = _quantized(a, recipe, roles[0], fnuz, given_a)
    qb, sb, b_scaling = _quantized(b, recipe, roles[1], fnuz, given_b)
    M, N, K = qa.shape[0], qb.shape[0], qa.shape[1]
    who = provider
    if provider == "auto":
        who = kernels.fp8_gemm_provider(a_scaling, runtime.arch(a.device), out_dtype, M, N, K).provider
    if who == "vendor" and a_scaling in ("tensorwise", "rowwise"):
        # _scaled_mm takes dequantization scales (x = q * scale) and a column-major second operand.
        inv_a = sa.reciprocal() if sa.dim() == 0 else sa.reciprocal().view(M, 1)
        inv_b = sb.reciprocal() if sb.dim() == 0 else sb.reciprocal().view(1, N)
        y = torch._scaled_mm(qa, qb.t(), scale_a=inv_a, scale_b=inv_b, bias=bias, out_dtype=out_dtype)
        return y if residual is None else y + residual
    group_k = reference.FP8_SCALINGS[a_scaling][1] if a_scaling.startswith("block") else 0
    b_rows = reference.FP8_SCALINGS[b_scaling][0] if group_k else 1
    return kernels.fp8_gemm(qa, qb, sa, sb, bias, out_dtype, group_k, b_rows, residual=residual)


def _resolve_fnuz(fnuz: int, device) -> bool:
    """fnuz as the custom ops take it: -1 = the device's default (resolved here, inside the op, because
    runtime.arch reads a context variable torch.compile cannot trace), 0 or 1."""
    return default_fnuz(device) if fnuz < 0 else bool(fnuz)


def _pair(q: Tensor | None, s: Tensor | None) -> tuple[Tensor, Tensor] | None:
    return None if q is None or s is None else (q, s)


@torch.library.custom_op("wavefront::linear_fp8_fwd", mutates_args=())
def _linear_fp8_fwd(x: Tensor, weight: Tensor, bias: Tensor | None, residual: Tensor | None, recipe: str, fnuz: int,
                    provider: str, x_q: Tensor | None = None, x_s: Tensor | None = None, w_q: Tensor | None = None,
                    w_s: Tensor | None = None) -> Tensor:
    check_fp8_target(OP, x.device)  # in the op body: torch.compile does not trace runtime.arch
    with op_scope(OP):
        return _product(x, weight, ("act", "weight"), recipe, _resolve_fnuz(fnuz, x.device), bias, x.dtype, provider,
                        residual, _pair(x_q, x_s), _pair(w_q, w_s))


@_linear_fp8_fwd.register_fake
def _(x, weight, bias, residual, recipe, fnuz, provider, x_q=None, x_s=None, w_q=None, w_s=None):
    return x.new_empty((x.shape[0], weight.shape[0]))


@torch.library.custom_op("wavefront::linear_fp8_bwd", mutates_args=())
def _linear_fp8_bwd(dy: Tensor, x: Tensor, weight: Tensor, recipe: str, fnuz: int, needs_dx: bool, needs_dw: bool,
                    needs_db: bool, provider: str, wt_q: Tensor | None = None,
                    wt_s: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    fnuz = _resolve_fnuz(fnuz, x.device)
    with op_scope(OP):
        dx = (_product(dy, weight.t(), ("grad", "weight"), recipe, fnuz, None, x.dtype, provider,
                       given_b=_pair(wt_q, wt_s)) if needs_dx else None)
        dw = (_product(dy.t(), x.t(), ("grad", "act"), recipe, fnuz, None, weight.dtype, provider)
              if needs_dw else None)
    db = dy.float().sum(0).to(weight.dtype) if needs_db else None
    # Absent outputs are distinct 0-element tensors: custom-op outputs may not alias each other.
    dx, dw, db = (x.new_empty(0) if t is None else t for t in (dx, dw, db))
    return dx, dw, db


@_linear_fp8_bwd.register_fake
def _(dy, x, weight, recipe, fnuz, needs_dx, needs_dw, needs_db, provider, wt_q=None, wt_s=None):
    return (torch.empty_like(x) if needs_dx else x.new_empty(0),
            weight.new_empty(weight.shape) if needs_dw else x.new_empty(0),
            weight.new_empty(weight.shape[0]) if needs_db else x.new_empty(0))


def _setup_context(ctx, inputs, output):
    x, weight, bias, residual, recipe, fnuz, provider = inputs[:7]  # the FP8 copies are the forward's only
    ctx.save_for_backward(x, weight)
    ctx.recipe, ctx.fnuz, ctx.provider, ctx.has_bias = recipe, fnuz, provider, bias is not None
    ctx.has_residual = residual is not None


def _backward(ctx, dy):
    x, weight = ctx.saved_tensors
    needs_x, needs_w, needs_b, needs_r = ctx.needs_input_grad[:4]
    needs_b = needs_b and ctx.has_bias
    dx = dw = db = None
    if needs_x or needs_w or needs_b:
        dx, dw, db = torch.ops.wavefront.linear_fp8_bwd(as_rows(dy), x, weight, ctx.recipe, ctx.fnuz, needs_x,
                                                        needs_w, needs_b, ctx.provider)
    return (dx if needs_x else None, dw if needs_w else None, db if needs_b else None,
            dy if needs_r and ctx.has_residual else None, None, None, None, None, None, None, None)


_linear_fp8_fwd.register_autograd(_backward, setup_context=_setup_context)


def default_fnuz(device) -> bool:
    """FNUZ formats where the matrix units take only those (AMD gfx942, MI300; also under
    runtime.assume_target("gfx942"), so inspect compiles what MI300 runs: with OCP e4m3 operands the
    compiler falls back to converting them and v_mfma_f32_32x32x8_f16)."""
    return runtime.arch(device).name == "gfx942"


def _check(x, weight, bias, residual, recipe, provider) -> None:
    check_tensor(OP, "x", x, dtypes=_DTYPES)
    check_tensor(OP, "weight", weight, dtypes=_DTYPES, ndim=2)
    N, K = weight.shape
    if x.shape[-1] != K:
        raise ValueError(f"{OP}: the last dim of 'x' ({x.shape[-1]}) must equal weight.shape[1] (in_features, {K}); "
                         f"weight is [out_features, in_features]")
    if bias is not None:
        check_tensor(OP, "bias", bias, dtypes=_DTYPES, ndim=1)
        if bias.shape[0] != N:
            raise ValueError(f"{OP}: 'bias' must have shape ({N},) (weight.shape[0]), got {tuple(bias.shape)}")
    if residual is not None:
        check_tensor(OP, "residual", residual, dtypes=_DTYPES)
        want = (*x.shape[:-1], N)
        if tuple(residual.shape) != want:
            raise ValueError(f"{OP}: 'residual' must have the output's shape {want}, got {tuple(residual.shape)}")
    check_same_dtype(OP, x=x, weight=weight, bias=bias, residual=residual)
    check_same_device(OP, x=x, weight=weight, bias=bias, residual=residual)
    check_choice(OP, "recipe", recipe, RECIPES)
    check_choice(OP, "provider", provider, PROVIDERS)
    if provider == "vendor" and recipe not in ("tensorwise", "rowwise"):
        raise ValueError(f"{OP}: provider='vendor' (torch._scaled_mm) takes tensorwise or rowwise scales, not "
                         f"recipe={recipe!r}")


def check_quantized(op: str, name: str, given, shape: tuple[int, ...], recipe: str, role: str,
                    fnuz: bool | None) -> None:
    """`given` is a :class:`Quantized` of `shape` in the layout ops.quantize returns for `role` in `recipe`
    (fnuz None: the OCP or the FNUZ format, the device's default being resolved inside the op)."""
    fmt, scaling, _ = reference.fp8_recipe_operand(recipe, role, bool(fnuz))
    formats = {reference.FP8_FORMATS[fmt]} if fnuz is not None else {reference.FP8_FORMATS[fmt],
                                                                      reference.FP8_FORMATS[fmt + "fnuz"]}
    want = f"a wavefront.ops.Quantized with {fmt} data of shape {shape} and {scaling} scales"
    if not isinstance(given, Quantized):
        raise TypeError(f"{op}: '{name}' must be {want}, got {type(given).__name__}")
    if given.scaling != scaling or given.data.dtype not in formats or tuple(given.data.shape) != shape:
        raise ValueError(f"{op}: '{name}' must be {want} (recipe={recipe!r}), got {given.data.dtype} data of shape "
                         f"{tuple(given.data.shape)} and {given.scaling} scales")
    if given.scale.dtype != torch.float32 or tuple(given.scale.shape) != scale_shape(shape, scaling):
        raise ValueError(f"{op}: '{name}.scale' must be float32 of shape {scale_shape(shape, scaling)} (what "
                         f"ops.quantize returns), got {given.scale.dtype} {tuple(given.scale.shape)}")


def _rows(given: Quantized | None) -> tuple[Tensor, Tensor] | None:
    """A pre-quantized operand as the 2-D (q, s) the GEMM takes."""
    if given is None:
        return None
    q = as_rows(given.data)
    s = given.scale if given.scale.dim() < 2 else given.scale.reshape(-1, given.scale.shape[-1])
    return q, s


def linear_fp8(x: Tensor, weight: Tensor, bias: Tensor | None = None, *, residual: Tensor | None = None,
               recipe: str = "rowwise", fnuz: bool | None = None, provider: str = "auto",
               x_fp8: Quantized | None = None, weight_fp8: Quantized | None = None) -> Tensor:
    """``x @ weight.T + bias + residual`` computed in FP8 per `recipe` (see module docstring); output in x's
    dtype. The bias and the residual are added in the GEMM's fp32 epilogue (not quantized). x_fp8 /
    weight_fp8: x / weight already quantized for the forward (forward-only shortcuts; x and weight are still
    the autograd inputs, see the module docstring)."""
    _check(x, weight, bias, residual, recipe, provider)
    if x_fp8 is not None:
        check_quantized(OP, "x_fp8", x_fp8, tuple(x.shape), recipe, "act", fnuz)
    if weight_fp8 is not None:
        check_quantized(OP, "weight_fp8", weight_fp8, tuple(weight.shape), recipe, "weight", fnuz)
    if (x.numel() == 0 or weight.numel() == 0 or x.dtype == torch.float64 or not runtime.uses_triton(x.device)):
        # CPU without the interpreter, fp64 or empty: the OCP formats unless fnuz says otherwise. The reference
        # quantizes x and weight itself: the same values the FP8 copies hold by their contract.
        return reference.linear_fp8(x, weight, bias, residual=residual, recipe=recipe, fnuz=bool(fnuz))
    bias = bias if bias is None or bias.stride(0) == 1 else bias.contiguous()
    res = None if residual is None else as_rows(residual)
    xq, wq = _rows(x_fp8), _rows(weight_fp8)
    y = torch.ops.wavefront.linear_fp8_fwd(as_rows(x), weight, bias, res, recipe, -1 if fnuz is None else int(fnuz),
                                           provider, *(xq or (None, None)), *(wq or (None, None)))
    return y.view(*x.shape[:-1], weight.shape[0])


# The FSDP2 FP8 all-gather path (wavefront.parallel.fp8_fsdp): no high-precision weight exists, the forward
# takes the gathered FP8 copy and the backward the copy its dx product needs (W^T quantized along N). x is
# 2-D here. Without Triton (CPU without the interpreter) the products are the reference's: the dequantized
# operands multiplied in fp32, like reference.linear_fp8.


def forward_prequantized(x2: Tensor, w: Quantized, bias: Tensor | None, residual: Tensor | None, recipe: str,
                         fnuz: bool, provider: str) -> Tensor:
    """y [M, N] = Qa(x2) w^T + bias + residual, the weight given quantized (no autograd)."""
    N = w.data.shape[0]
    # An empty batch (or K = 0) takes the reference's path: empty results, or bias + residual for K = 0.
    if runtime.uses_triton(x2.device) and x2.dtype != torch.float64 and x2.numel():
        placeholder = x2.new_empty(()).expand(N, x2.shape[1])  # unread: the weight is given quantized
        return torch.ops.wavefront.linear_fp8_fwd(x2, placeholder, bias, residual, recipe, int(fnuz), provider, None,
                                                  None, *_rows(w))
    acc = torch.float64 if x2.dtype == torch.float64 else torch.float32
    y = reference.fp8_gemm_operand(x2, recipe, "act", fnuz) @ reference.fp8_dequantize(w.data, w.scale, w.scaling,
                                                                                        acc).T
    y = y if bias is None else y + bias.to(acc)
    y = y if residual is None else y + residual.to(acc)
    return y.to(x2.dtype)


def backward_prequantized(dy: Tensor, x2: Tensor, w_t: Quantized | None, weight_shape: tuple[int, int],
                          weight_dtype: torch.dtype, recipe: str, fnuz: bool, provider: str,
                          needs: tuple[bool, bool, bool]) -> tuple[Tensor | None, ...]:
    """(dx, dw, db) of :func:`forward_prequantized`: dx = Qg(dy) w_t^T with w_t = W^T [K, N] given quantized
    along N (None when dx is not needed); dw = Qg(dy^T) Qa(x2^T)^T; db = sum of dy's rows; None where `needs`
    says no."""
    needs_dx, needs_dw, needs_db = needs
    if needs_dx and w_t is None:
        raise ValueError(f"{OP}: the dx product needs the weight's backward FP8 copy 'w_t'")
    N, K = weight_shape
    if runtime.uses_triton(x2.device) and x2.dtype != torch.float64 and x2.numel() and dy.numel():
        placeholder = x2.new_empty((), dtype=weight_dtype).expand(N, K)  # dW's shape and dtype; never read
        dx, dw, db = torch.ops.wavefront.linear_fp8_bwd(dy, x2, placeholder, recipe, int(fnuz), needs_dx, needs_dw,
                                                        needs_db, provider, *(_rows(w_t) or (None, None)))
        return (dx if needs_dx else None, dw if needs_dw else None, db if needs_db else None)
    acc = torch.float64 if x2.dtype == torch.float64 else torch.float32
    dx = dw = db = None
    if needs_dx:
        dx = (reference.fp8_gemm_operand(dy, recipe, "grad", fnuz)
              @ reference.fp8_dequantize(w_t.data, w_t.scale, w_t.scaling, acc).T).to(x2.dtype)
    if needs_dw:
        dw = (reference.fp8_gemm_operand(dy.t(), recipe, "grad", fnuz)
              @ reference.fp8_gemm_operand(x2.t(), recipe, "act", fnuz).T).to(weight_dtype)
    if needs_db:
        db = dy.to(acc).sum(0).to(dy.dtype)
    return dx, dw, db


# ---------------------------------------------------------------------------------------------------
# Registry entry. dims: M, N, K; options: recipe, bias (bool); layout "batched" (x [2, M/2, K]).
# The rule: against the float64 product of the dequantized operands (reference.linear_fp8 on float64),
# ours within 2x the error of the same quantized product dequantized to fp32 and multiplied by PyTorch
# in fp32, rounded to the input dtype (torchao's emulation mode), + 1 ulp: the fp32-accumulation level.


def _inputs(case: Case, dtype, device, gen) -> OpInputs:
    M, N, K = case.dims["M"], case.dims["N"], case.dims["K"]
    opts = dict(case.options)
    has_bias = opts.pop("bias", False)
    has_res = opts.pop("residual", False)
    x_shape = (2, M // 2, K) if case.layout == "batched" else (M, K)
    x = randn(x_shape, dtype, device, gen)
    weight = randn((N, K), dtype, device, gen, K ** -0.5)
    bias = randn((N,), dtype, device, gen, 0.5) if has_bias else None
    if has_res:
        opts["residual"] = randn((*x_shape[:-1], N), dtype, device, gen)
    return OpInputs((x, weight, bias), opts, (0, 1, 2) if has_bias else (0, 1))


def _reference(x, weight, bias=None, *, residual=None, recipe="rowwise", fnuz=None, provider="auto"):
    """reference.linear_fp8 with fnuz=None resolved as the op resolves it (the device's default: FNUZ on gfx942),
    so that ours and the reference quantize to the same format on every target."""
    fnuz = default_fnuz(x.device) if fnuz is None else bool(fnuz)
    return reference.linear_fp8(x, weight, bias, residual=residual, recipe=recipe, fnuz=fnuz)


def _flops(case: Case, mode: Mode) -> float:
    M, N, K = case.dims["M"], case.dims["N"], case.dims["K"]
    return (2 if mode == "fwd" else 4) * M * N * K


def _bytes(case: Case, dtype: torch.dtype, mode: Mode) -> int:
    # The op's interface: fwd reads x and W, writes y; bwd reads dY, x, W, writes dx and dW. The FP8 copies
    # are the implementation's (counted by the traffic tool, not the minimum).
    M, N, K = case.dims["M"], case.dims["N"], case.dims["K"]
    e = itemsize(dtype)
    return ((M * K + N * K + M * N) if mode == "fwd" else (M * N + 2 * M * K + 2 * N * K)) * e


def _case(name, reason, M, N, K, layout="contiguous", slow=False, **options):
    return Case(name, reason, {"M": M, "N": N, "K": K}, options, layout=layout, slow=slow)


CASES = (
    _case("rowwise", "per-row x per-column scales in the epilogue, ragged M, N, K", 37, 50, 72),
    _case("tensorwise_bias", "one scale each, e5m2 gradients, bias in the epilogue", 40, 48, 64, recipe="tensorwise",
          bias=True),
    _case("blockwise", "DeepSeek-V3 1x128 / 128x128 scales inside the K loop, K over two blocks, ragged", 33, 40,
          200, recipe="blockwise"),
    _case("mxfp8", "1x32 blocks with power-of-two scales, three K blocks, ragged N", 24, 40, 96, recipe="mxfp8"),
    _case("batched_rowwise", "x with a leading batch dim [2, M/2, K], bias and residual in the epilogue", 32, 24,
          48, layout="batched", bias=True, residual=True),
    _case("blockwise_large", "many tiles and K blocks", 160, 192, 384, recipe="blockwise", slow=True),
)


def _bench_cases() -> tuple[Case, ...]:
    m = MODELS["llama3-8b"]
    tokens = 8192
    return (
        _case("llama3-8b_up_rowwise", f"MLP up projection at {tokens} tokens, rowwise", tokens, m.ffn_hidden,
              m.hidden),
        _case("llama3-8b_down_blockwise", f"MLP down projection at {tokens} tokens, DeepSeek-V3 blocks", tokens,
              m.hidden, m.ffn_hidden, recipe="blockwise"),
        _case("llama3-8b_down_mxfp8", f"MLP down projection at {tokens} tokens, MXFP8 (tl.dot_scaled on sm_100)",
              tokens, m.hidden, m.ffn_hidden, recipe="mxfp8"),
        _case("llama3-8b_qkv_tensorwise", f"fused QKV at {tokens} tokens, tensorwise", tokens,
              m.hidden + 2 * m.n_kv_heads * m.head_dim, m.hidden, recipe="tensorwise"),
    )


SPECS = (
    OpSpec(
        name=OP,
        targets=compiles_fp8_e4m3,  # no FP8 on Ampere: sm_80 is not inspected
        fn=linear_fp8,
        reference=_reference,  # also the eager baseline: fp32 emulation at 16-bit inputs
        make_inputs=_inputs,
        cases=CASES,
        bench_cases=_bench_cases(),
        flops=_flops,
        min_bytes=_bytes,
        dtypes=(torch.bfloat16, torch.float32),
        description="FP8 linear (tensorwise, rowwise, DeepSeek-V3 blockwise, MXFP8 scales), fwd + bwd in FP8",
    ),
)
