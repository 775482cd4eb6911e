"""Grouped linear (the experts of a mixture-of-experts MLP): validation, torch.library custom ops with fake
kernels, autograd, registry entry.

``grouped_linear(x, weight, offsets, *, activation=None)``: x [T, K] holds tokens in expert-contiguous order,
weight [E, N, K] the experts' nn.Linear weights (Hugging Face's ``gate_up_proj`` [E, 2I, H] or ``down_proj``
[E, H, I]), offsets (E,) int32/int64 on x's device the cumulative end of each group (``torch._grouped_mm``'s
``offs``). Group e is rows [offsets[e-1], offsets[e]) (group 0 from row 0); rows past offsets[-1] are
padding and get zero output. activation None -> [T, N] = x_g W_e^T per group; "swiglu" -> [T, N/2] =
silu(gate) * up with (gate, up) = the product's two halves, fused in the GEMM epilogue.

Nothing reads offsets on the host: the kernels build their tile schedule on the device. Offsets are not
validated by value for that reason (a check would synchronize); they are taken as their running maximum
clamped to [0, T] (two E-element device ops, no sync): a negative or decreasing offset is an empty group,
groups never overlap, and malformed offsets give wrong numbers, never out-of-bounds accesses or two writers
of one row. The kernels clamp to [0, T] again on their own (any caller of the launchers).

fp64 inputs, empty problems and CPU runs without the Triton interpreter use the PyTorch reference.
"""

from __future__ import annotations

import torch
from torch import Tensor

from wavefront import reference, runtime
from wavefront.kernels._scope import op_scope
from wavefront.ops._linear_autograd import input_grads, save_operands, saved_operands
from wavefront.ops._rows import randn
from wavefront.ops._spec import Case, Mode, OpInputs, OpSpec, itemsize
from wavefront.ops._validate import check_same_device, check_same_dtype, check_tensor

OP = "grouped_linear"
ACTIVATIONS = reference.GROUPED_ACTIVATIONS
OFFSET_DTYPES = (torch.int32, torch.int64)


@torch.library.custom_op("wavefront::grouped_linear_fwd", mutates_args=())
def _grouped_linear_fwd(x: Tensor, weight: Tensor, offsets: Tensor, swiglu: bool, save_z: bool
                        ) -> tuple[Tensor, Tensor]:
    from wavefront.kernels import grouped_linear as kernels  # lazy: Triton-free import

    with op_scope(OP):
        y, z = kernels.grouped_linear_fwd(x, weight, offsets, swiglu, save_z)
    return y, x.new_empty(0) if z is None else z


@_grouped_linear_fwd.register_fake
def _(x, weight, offsets, swiglu, save_z):
    N = weight.shape[1]
    y = x.new_empty((x.shape[0], N // 2 if swiglu else N))
    return y, x.new_empty((x.shape[0], N)) if save_z else x.new_empty(0)


@torch.library.custom_op("wavefront::grouped_linear_bwd", mutates_args=())
def _grouped_linear_bwd(dy: Tensor, x: Tensor, weight: Tensor, offsets: Tensor, z: Tensor, swiglu: bool,
                        needs_dx: bool, needs_dw: bool) -> tuple[Tensor, Tensor]:
    from wavefront.kernels import grouped_linear as kernels  # lazy: Triton-free import

    with op_scope(OP):
        dz = kernels.swiglu_bwd(dy, z) if swiglu else dy
        dx, dw = kernels.grouped_linear_bwd(dz, x, weight, offsets, needs_dx, needs_dw)
    # Absent outputs are distinct 0-element tensors: custom-op outputs may not alias each other.
    return (x.new_empty(0) if dx is None else dx, x.new_empty(0) if dw is None else dw)


@_grouped_linear_bwd.register_fake
def _(dy, x, weight, offsets, z, swiglu, needs_dx, needs_dw):
    return (torch.empty_like(x) if needs_dx else x.new_empty(0),
            weight.new_empty(weight.shape) if needs_dw else x.new_empty(0))


def _setup_context(ctx, inputs, output):
    x, weight, offsets, swiglu, save_z = inputs
    _, z = output
    save_operands(ctx, x, weight, offsets, z, swiglu=swiglu)


def _backward(ctx, dy, dz_unused):
    x, weight, offsets, z = saved_operands(ctx, OP, ctx.swiglu, "the saved pre-activation")
    needs_x, needs_w = ctx.needs_input_grad[:2]
    dx = dw = None
    if needs_x or needs_w:
        dx, dw = torch.ops.wavefront.grouped_linear_bwd(dy.contiguous(), x, weight, offsets, z, ctx.swiglu,
                                                        needs_x, needs_w)
    return input_grads(ctx, dx, dw)


_grouped_linear_fwd.register_autograd(_backward, setup_context=_setup_context)


def _check(x, weight, offsets, activation) -> None:
    check_tensor(OP, "x", x, ndim=2)
    check_tensor(OP, "weight", weight, ndim=3)
    E, N, K = weight.shape
    if x.shape[1] != K:
        raise ValueError(f"{OP}: x.shape[1] ({x.shape[1]}) must equal weight.shape[2] (in_features, {K}); weight is "
                         "[experts, out_features, in_features]")
    check_tensor(OP, "offsets", offsets, dtypes=OFFSET_DTYPES, ndim=1)
    if offsets.shape[0] != E:
        raise ValueError(f"{OP}: argument 'offsets' must have shape ({E},) (one cumulative end per expert, "
                         f"weight.shape[0]), got {tuple(offsets.shape)}")
    if E == 0:
        raise ValueError(f"{OP}: argument 'weight' must hold at least one expert, got shape {tuple(weight.shape)}")
    check_same_dtype(OP, x=x, weight=weight)
    check_same_device(OP, x=x, weight=weight, offsets=offsets)
    if activation not in ACTIVATIONS:
        raise ValueError(f"{OP}: argument 'activation' must be one of {ACTIVATIONS}, got {activation!r}")
    if activation == "swiglu" and N % 2:
        raise ValueError(f"{OP}: activation='swiglu' needs an even weight.shape[1] (gate and up halves), got {N}")


def _sanitized(offsets: Tensor, n_rows: int) -> Tensor:
    """Non-decreasing ends in [0, T] (the running maximum of the clamped offsets), same dtype, on the device."""
    return torch.cummax(offsets.clamp(0, n_rows), 0).values


def grouped_linear(x: Tensor, weight: Tensor, offsets: Tensor, *, activation: str | None = None) -> Tensor:
    """Per expert group ``x_g @ weight[e].T`` in one launch, with ``silu(gate) * up`` fused for "swiglu".

    See the module docstring for the layout of x, weight and offsets. Differentiable in x and weight.
    """
    _check(x, weight, offsets, activation)
    offsets = _sanitized(offsets, x.shape[0])
    if x.numel() == 0 or weight.numel() == 0 or x.dtype == torch.float64 or not runtime.uses_triton(x.device):
        return reference.grouped_linear(x, weight, offsets, activation)
    swiglu = activation == "swiglu"
    needs_grad = torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)
    x = x if x.stride(1) == 1 else x.contiguous()
    y, _ = torch.ops.wavefront.grouped_linear_fwd(x, weight, offsets, swiglu, swiglu and needs_grad)
    return y


# ---------------------------------------------------------------------------------------------------
# Registry entry. dims: T (rows of x, padding included), K (in_features), N (out_features, gate and up
# together for swiglu), E (experts), pad (padding rows past offsets[-1]), int64 (offsets dtype), weight_t
# (weight a transposed view); options: activation; layout: how
# the routed rows split into groups ("uneven": random cuts; "empty": random cuts with the first, a middle
# and the last group empty; "balanced": equal groups, as top-k routing with a capacity would give).


def _offsets(case: Case, gen: torch.Generator) -> torch.Tensor:
    E, routed = case.dims["E"], case.dims["T"] - case.dims.get("pad", 0)
    if case.layout == "balanced":
        ends = [(routed * (e + 1)) // E for e in range(E)]
    else:
        ends = sorted(torch.randint(0, routed + 1, (E - 1,), generator=gen).tolist()) + [routed]
        if case.layout == "empty" and E >= 3:
            ends[0] = 0
            ends[E // 2] = ends[E // 2 - 1]
            ends[E - 2] = routed
    return torch.tensor(ends, dtype=torch.int64 if case.dims.get("int64") else torch.int32)


def _inputs(case: Case, dtype, device, gen) -> OpInputs:
    T, K, N, E = case.dims["T"], case.dims["K"], case.dims["N"], case.dims["E"]
    x = randn((T, K), dtype, device, gen)
    if case.dims.get("weight_t"):
        # Stored [E, K, N] (in x out, as some MoE code keeps it), passed as the [E, N, K] view: read in place.
        weight = randn((E, K, N), dtype, device, gen, K ** -0.5).transpose(1, 2)
    else:
        weight = randn((E, N, K), dtype, device, gen, K ** -0.5)
    return OpInputs((x, weight, _offsets(case, gen).to(device)), dict(case.options), (0, 1))


def _routed(case: Case) -> int:
    return case.dims["T"] - case.dims.get("pad", 0)


def _flops(case: Case, mode: Mode) -> float:
    # Products over the routed rows only; the SwiGLU epilogue's elementwise work is negligible beside them.
    return (2 if mode == "fwd" else 4) * _routed(case) * case.dims["N"] * case.dims["K"]


def _bytes(case: Case, dtype: torch.dtype, mode: Mode) -> int:
    T, K, N, E = case.dims["T"], case.dims["K"], case.dims["N"], case.dims["E"]
    e = itemsize(dtype)
    swiglu = case.options.get("activation") == "swiglu"
    n_out = N // 2 if swiglu else N
    z = T * N * e if swiglu else 0
    offsets = E * 8
    if mode == "fwd":
        # read x, W, offsets; write y (and the pre-activation z saved for backward with SwiGLU).
        return (T * K + E * N * K + T * n_out) * e + z + offsets
    # read dy, x, W (and z); write dx, dW.
    return (T * n_out + 2 * T * K + 2 * E * N * K) * e + z + offsets


def _case(name, reason, T, K, N, E, layout="uneven", slow=False, pad=0, int64=False, weight_t=False, **options):
    dims = {"T": T, "K": K, "N": N, "E": E, "pad": pad, "int64": int(int64), "weight_t": int(weight_t)}
    return Case(name, reason, dims, options, layout=layout, slow=slow)


CASES = (
    _case("uneven", "random group sizes: groups straddle row tiles, several tiles in every dim", 52, 32, 64, 4),
    _case("empty_groups", "the first, a middle and the last expert get no rows: no tiles, zero dW", 40, 32, 48, 6,
          layout="empty"),
    _case("padding", "offsets[-1] < T: trailing padding rows must come out zero (and get zero dx); int64 offsets "
          "(torch._grouped_mm takes int32, routers often produce int64)", 48, 32, 32, 3, pad=13, int64=True),
    _case("one_expert", "E = 1: a single group over all rows (the dense linear)", 40, 48, 32, 1),
    _case("unaligned", "K = 20, N = 37: rows not 16-byte aligned, so the pointer kernels run; K tail masked", 36,
          20, 37, 3),
    _case("weight_t", "weight a transposed view of [E, K, N] storage (SwiGLU): the pointer kernels read it in place",
          36, 32, 48, 3, weight_t=True, activation="swiglu"),
    _case("many_experts", "17 experts over 34 rows, many groups empty or of one row: the group search's 32-entry "
          "table", 34, 16, 16, 17),
    _case("swiglu", "SwiGLU epilogue (gate and up halves, HF layout), uneven groups and padding rows", 48, 32, 64, 4,
          pad=7, activation="swiglu"),
    _case("swiglu_empty", "SwiGLU with empty groups", 40, 32, 48, 5, layout="empty", activation="swiglu"),
    _case("large", "256 rows, 8 experts, 192 x 160: many tiles per group", 256, 160, 192, 8, slow=True, pad=9,
          activation="swiglu"),
)


def _bench_cases() -> tuple[Case, ...]:
    tokens = 8192
    # (name, hidden, expert intermediate, experts, top-k): Hugging Face config.json of each model.
    models = (("mixtral-8x7b", 4096, 14336, 8, 2), ("qwen3-30b-a3b", 2048, 768, 128, 8))
    cases = []
    for name, hidden, inter, experts, top_k in models:
        rows = tokens * top_k
        cases.append(_case(f"{name}_gate_up", f"{name} experts' gate/up projection with SwiGLU, {tokens} tokens "
                           f"top-{top_k}", rows, hidden, 2 * inter, experts, layout="balanced", activation="swiglu"))
        cases.append(_case(f"{name}_down", f"{name} experts' down projection, {tokens} tokens top-{top_k}", rows,
                           inter, hidden, experts, layout="balanced"))
    return tuple(cases)


SPECS = (
    OpSpec(
        name=OP,
        fn=grouped_linear,
        reference=reference.grouped_linear,
        eager=reference.grouped_linear_eager,
        make_inputs=_inputs,
        cases=CASES,
        bench_cases=_bench_cases(),
        flops=_flops,
        min_bytes=_bytes,
        description="mixture-of-experts grouped GEMM over ragged groups (device offsets), SwiGLU epilogue; fwd + "
                    "bwd",
    ),
)
