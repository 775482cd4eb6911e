"""Linear with a fused epilogue: validation, torch.library custom ops with fake kernels, autograd, registry.

``linear(x, weight, bias=None, *, activation=None, residual=None)`` is
``activation(F.linear(x, weight, bias)) + residual`` in one GEMM pass: x [..., K], weight [N, K] (any
strides: a transposed view is read in place), bias [N], residual [..., N]; activation one of None,
"relu", "gelu", "gelu_tanh", "silu". The activation's derivative at the pre-activation is saved for
backward (in the input dtype) only when an activation is set and a gradient is required.

Each GEMM product (the forward, dx, dW) is computed by our kernel or by the vendor BLAS through torch.mm /
torch.addmm (cuBLAS/cuBLASLt, hipBLASLt): ``provider="auto"`` follows the rule in
``kernels/matmul_config.gemm_provider`` (the vendor where our kernel would fuse nothing, ours where fusion
saves a pass over HBM); ``"wavefront"`` and ``"vendor"`` force one side for every product (benchmarking;
the vendor side then runs the epilogue and the dz prologue as separate PyTorch ops).

fp64 inputs, empty problems and CPU runs without the Triton interpreter use the PyTorch reference.
"""

from __future__ import annotations

import torch
from torch import Tensor

from wavefront import reference, runtime
from wavefront.kernels._scope import op_scope
from wavefront.kernels.matmul_config import gemm_provider
from wavefront.ops._linear_autograd import input_grads, save_operands, saved_operands
from wavefront.ops._rows import randn
from wavefront.ops._spec import Case, Mode, OpInputs, OpSpec, itemsize
from wavefront.ops._validate import as_rows, check_same_device, check_same_dtype, check_tensor
from wavefront.shapes import MODELS

OP = "linear"
ACTIVATIONS = (None, *reference.ACTIVATIONS)
PROVIDERS = ("auto", "wavefront", "vendor")


def _choose(provider: str, product: str, device, **flags) -> str:
    """"wavefront" or "vendor" for one product: the forced provider, or the rule of the config table."""
    if provider != "auto":
        return provider

    return gemm_provider(product, runtime.arch(device), **flags).provider


def _activation_grad(z: Tensor, activation: str) -> Tensor:
    """act'(z) in z's dtype, the formulas of kernels/linear_epilogue.py (the vendor path's saved derivative)."""
    if activation == "relu":
        return (z > 0).to(z.dtype)
    if activation == "gelu":
        return 0.5 * (1.0 + torch.erf(z * 0.7071067811865476)) + z * 0.3989422804014327 * torch.exp(-0.5 * z * z)
    if activation == "gelu_tanh":
        t = torch.tanh(0.7978845608028654 * (z + 0.044715 * z ** 3))
        return 0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * 0.7978845608028654 * (1.0 + 3 * 0.044715 * z * z)
    s = torch.sigmoid(z)
    return s * (1.0 + z * (1.0 - s))


def _vendor_fwd(x: Tensor, weight: Tensor, bias: Tensor | None, residual: Tensor | None, activation: str,
                save_grad: bool) -> tuple[Tensor, Tensor | None]:
    """torch.addmm (the bias in cuBLASLt's / hipBLASLt's epilogue) or torch.mm, then any further epilogue as
    PyTorch ops on z rounded to the input dtype (what an unfused model computes)."""
    z = torch.addmm(bias, x, weight.t()) if bias is not None else torch.mm(x, weight.t())
    if not activation and residual is None:
        return z, None
    zf = z.float()
    y = reference.apply_activation(zf, activation or None)
    if residual is not None:
        y = y + residual.float()
    g = _activation_grad(zf, activation).to(x.dtype) if save_grad else None
    return y.to(x.dtype), g


@torch.library.custom_op("wavefront::linear_fwd", mutates_args=())
def _linear_fwd(x: Tensor, weight: Tensor, bias: Tensor | None, residual: Tensor | None, activation: str,
                save_grad: bool, provider: str) -> tuple[Tensor, Tensor]:
    from wavefront.kernels import linear as kernels  # lazy: Triton-free import

    who = _choose(provider, "fwd", x.device, activation=bool(activation), bias=bias is not None,
                  residual=residual is not None)
    if who == "vendor":
        y, g = _vendor_fwd(x, weight, bias, residual, activation, save_grad)
    else:
        with op_scope(OP):
            y, g = kernels.linear_fwd(x, weight, bias, residual, activation or None, save_grad)
    return y, x.new_empty(0) if g is None else g


@_linear_fwd.register_fake
def _(x, weight, bias, residual, activation, save_grad, provider):
    y = x.new_empty((x.shape[0], weight.shape[0]))
    return y, torch.empty_like(y) if save_grad else x.new_empty(0)


@torch.library.custom_op("wavefront::linear_bwd", mutates_args=())
def _linear_bwd(dy: Tensor, x: Tensor, weight: Tensor, g: Tensor | None, needs_dx: bool, needs_dw: bool,
                has_bias: bool, provider: str) -> tuple[Tensor, Tensor, Tensor]:
    from wavefront.kernels import linear as kernels  # lazy: Triton-free import

    act = g is not None
    ours_dx = needs_dx and _choose(provider, "dx", x.device, activation=act) == "wavefront"
    ours_dw = (needs_dw or has_bias) and _choose(provider, "dw", x.device, activation=act,
                                                 bias=has_bias) == "wavefront"
    dx = dw = db = None
    if ours_dx or ours_dw:
        with op_scope(OP):
            dx, dw, db = kernels.linear_bwd(dy, x, weight, g, ours_dx, ours_dw and needs_dw, ours_dw and has_bias)
    if (needs_dx and not ours_dx) or ((needs_dw or has_bias) and not ours_dw):
        # The vendor's products take dz materialized: one elementwise pass when there is an activation.
        dz = dy if g is None else (dy.float() * g.float()).to(dy.dtype)
        if needs_dx and not ours_dx:
            dx = torch.mm(dz, weight)
        if needs_dw and not ours_dw:
            dw = torch.mm(dz.t(), x)
        if has_bias and not ours_dw:
            db = dz.sum(0)
    # Absent outputs are distinct 0-element tensors: custom-op outputs may not alias each other.
    return tuple(x.new_empty(0) if t is None else t for t in (dx, dw, db))


@_linear_bwd.register_fake
def _(dy, x, weight, g, needs_dx, needs_dw, has_bias, provider):
    return (torch.empty_like(x) if needs_dx else x.new_empty(0),
            weight.new_empty(weight.shape) if needs_dw else x.new_empty(0),
            weight.new_empty(weight.shape[0]) if has_bias else x.new_empty(0))


def _setup_context(ctx, inputs, output):
    x, weight, bias, residual, activation, save_grad, provider = inputs
    _, g = output
    save_operands(ctx, x, weight, g, activation=activation, has_bias=bias is not None, provider=provider)


def _backward(ctx, dy, dg_unused):
    x, weight, g = saved_operands(ctx, OP, bool(ctx.activation), "the activation's saved derivative")
    needs_x, needs_w, needs_b = ctx.needs_input_grad[:3]
    dy = as_rows(dy)
    dx = dw = db = None
    if needs_x or needs_w or needs_b:
        dx, dw, db = torch.ops.wavefront.linear_bwd(dy, x, weight, g if ctx.activation else None, needs_x,
                                                    needs_w, ctx.has_bias and needs_b, ctx.provider)
    return input_grads(ctx, dx, dw, db, dy)


_linear_fwd.register_autograd(_backward, setup_context=_setup_context)


def _check(x, weight, bias, activation, residual, provider) -> None:
    check_tensor(OP, "x", x)
    check_tensor(OP, "weight", weight, ndim=2)
    N, K = weight.shape
    if x.shape[-1] != K:
        raise ValueError(f"{OP}: the last dim of 'x' ({x.shape[-1]}) must equal weight.shape[1] (in_features, {K}); "
                         f"weight is [out_features, in_features]")
    if bias is not None:
        check_tensor(OP, "bias", bias, ndim=1)
        if bias.shape[0] != N:
            raise ValueError(f"{OP}: 'bias' must have shape ({N},) (weight.shape[0]), got {tuple(bias.shape)}")
    if residual is not None:
        check_tensor(OP, "residual", residual)
        want = (*x.shape[:-1], N)
        if tuple(residual.shape) != want:
            raise ValueError(f"{OP}: 'residual' must have the output's shape {want}, got {tuple(residual.shape)}")
    check_same_dtype(OP, x=x, weight=weight, bias=bias, residual=residual)
    check_same_device(OP, x=x, weight=weight, bias=bias, residual=residual)
    if activation not in ACTIVATIONS:
        raise ValueError(f"{OP}: 'activation' must be one of {ACTIVATIONS}, got {activation!r}")
    if provider not in PROVIDERS:
        raise ValueError(f"{OP}: 'provider' must be one of {PROVIDERS}, got {provider!r}")


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None, *, activation: str | None = None,
           residual: Tensor | None = None, provider: str = "auto") -> Tensor:
    """``activation(x @ weight.T + bias) + residual`` with the epilogue fused into the GEMM.

    provider: "auto" (the config table's rule per product), "wavefront" or "vendor" (see module docstring).
    """
    _check(x, weight, bias, activation, residual, provider)
    if (x.numel() == 0 or weight.numel() == 0 or x.dtype == torch.float64
            or not runtime.uses_triton(x.device)):
        return reference.linear(x, weight, bias, activation, residual)
    out_shape = (*x.shape[:-1], weight.shape[0])
    needs_grad = torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (x, weight, bias))
    bias = bias if bias is None or bias.stride(0) == 1 else bias.contiguous()
    y, _ = torch.ops.wavefront.linear_fwd(as_rows(x), weight, bias,
                                          None if residual is None else as_rows(residual), activation or "",
                                          bool(activation) and needs_grad, provider)
    return y.view(out_shape)


# ---------------------------------------------------------------------------------------------------
# Registry entry. dims: M (rows of x after flattening), N (out_features), K (in_features); options:
# activation, bias (bool), residual (bool); layouts: "contiguous", "batched" (x [2, M/2, K]),
# "weight_t" (weight a transposed view of a [K, N] tensor).


def _inputs(case: Case, dtype, device, gen) -> OpInputs:
    M, N, K = case.dims["M"], case.dims["N"], case.dims["K"]
    opts = dict(case.options)
    has_bias = opts.pop("bias", False)
    has_res = opts.pop("residual", False)
    x_shape = (2, M // 2, K) if case.layout == "batched" else (M, K)
    x = randn(x_shape, dtype, device, gen)
    w_scale = K ** -0.5
    weight = (randn((K, N), dtype, device, gen, w_scale).t() if case.layout == "weight_t"
              else randn((N, K), dtype, device, gen, w_scale))
    args = [x, weight]
    grads = [0, 1]
    if has_bias:
        args.append(randn((N,), dtype, device, gen, 0.5))
        grads.append(2)
    else:
        args.append(None)
    if has_res:
        opts["residual"] = randn((*x_shape[:-1], N), dtype, device, gen)
    return OpInputs(tuple(args), opts, tuple(grads))


def _flops(case: Case, mode: Mode) -> float:
    M, N, K = case.dims["M"], case.dims["N"], case.dims["K"]
    return (2 if mode == "fwd" else 4) * M * N * K


def _bytes(case: Case, dtype: torch.dtype, mode: Mode) -> int:
    M, N, K = case.dims["M"], case.dims["N"], case.dims["K"]
    e = itemsize(dtype)
    bias = N * e if case.options.get("bias") else 0
    res = M * N * e if case.options.get("residual") else 0
    g = M * N * e if case.options.get("activation") else 0
    if mode == "fwd":
        # read x, W, b, r; write y (and g = act'(z) when an activation needs it for backward).
        return (M * K + N * K + M * N) * e + bias + res + g
    # read dy, x, W (and g); write dx, dW (and db). The residual's gradient is dy itself.
    return (M * N + 2 * M * K + 2 * N * K) * e + g + bias


def _case(name, reason, M, N, K, layout="contiguous", slow=False, **options):
    return Case(name, reason, {"M": M, "N": N, "K": K}, options, layout=layout, slow=slow)


# Every activation x bias x residual combination is checked in tests/ops/test_linear.py (bf16); the
# registry keeps the regimes, in all three dtypes.
CASES = (
    _case("plain", "no epilogue, sizes multiples of the interpreter tiles", 64, 64, 64),
    _case("ragged", "M, N, K all ragged against the tiles (and K < one tile)", 37, 50, 11),
    _case("bias", "bias in the epilogue; dbias from the dW pass", 40, 48, 72, bias=True),
    _case("gelu_tanh_res", "gelu_tanh with bias and residual", 32, 48, 40, activation="gelu_tanh", bias=True,
          residual=True),
    _case("gelu", "gelu (erf) without bias", 48, 33, 40, activation="gelu"),
    _case("silu_res", "silu with a residual, no bias", 40, 32, 56, activation="silu", residual=True),
    _case("relu_bias", "relu, with bias: dz is masked where z <= 0", 33, 40, 24, activation="relu", bias=True),
    _case("batched", "x with a leading batch dim [2, M/2, K]", 48, 40, 32, layout="batched", activation="gelu_tanh",
          bias=True),
    _case("weight_t", "weight a transposed view (unit stride along N): read in place", 32, 48, 40,
          layout="weight_t", bias=True),
    _case("one_row", "a single row (decode)", 1, 64, 48, bias=True, activation="silu"),
    _case("large", "256 x 320 x 384: many tiles in every dim", 256, 320, 384, slow=True, activation="gelu",
          bias=True, residual=True),
)


def _bench_cases() -> tuple[Case, ...]:
    m = MODELS["llama3-8b"]
    tokens = 8192
    kv = m.n_kv_heads * m.head_dim
    return (
        _case("llama3-8b_qkv", f"fused QKV projection at {tokens} tokens", tokens, m.hidden + 2 * kv, m.hidden),
        _case("llama3-8b_o", f"attention output projection + residual at {tokens} tokens", tokens, m.hidden,
              m.hidden, residual=True),
        _case("llama3-8b_up_silu", f"MLP up projection with silu at {tokens} tokens", tokens, m.ffn_hidden,
              m.hidden, activation="silu"),
        _case("llama3-8b_down_res", f"MLP down projection + residual at {tokens} tokens", tokens, m.hidden,
              m.ffn_hidden, residual=True),
        _case("gpt3-175b_fc1_gelu", "GPT-3 MLP fc1 with bias and gelu at 8192 tokens", tokens,
              MODELS["gpt3-175b"].ffn_hidden, MODELS["gpt3-175b"].hidden, activation="gelu", bias=True),
    )


SPECS = (
    OpSpec(
        name=OP,
        fn=linear,
        reference=reference.linear,
        eager=reference.linear_eager,
        make_inputs=_inputs,
        cases=CASES,
        bench_cases=_bench_cases(),
        flops=_flops,
        min_bytes=_bytes,
        description="GEMM (F.linear) with bias, activation and residual fused into the epilogue; fwd + bwd",
    ),
)
