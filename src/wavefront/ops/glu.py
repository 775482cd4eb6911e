"""SwiGLU and GeGLU: validation, custom ops with fake kernels, autograd (saves the inputs, recomputes the
activation in the backward), registry entries."""

from __future__ import annotations

import torch
from torch import Tensor

from wavefront import reference, runtime
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

# Activation codes shared with kernels/_math.py (kept here so importing the op does not import Triton).
ACTS = {"silu": 0, "gelu_tanh": 1, "gelu_none": 2}
APPROXIMATIONS = ("tanh", "none")


@torch.library.custom_op("wavefront::glu_fwd", mutates_args=())
def _glu_fwd(gate: Tensor, up: Tensor, act: int) -> Tensor:
    from wavefront.kernels import glu as kernels
    from wavefront.kernels._launch import op_scope

    with op_scope("swiglu" if act == 0 else "geglu"):
        return kernels.glu_fwd(gate, up, act)


@_glu_fwd.register_fake
def _(gate, up, act):
    return gate.new_empty(gate.shape)


@torch.library.custom_op("wavefront::glu_bwd", mutates_args=())
def _glu_bwd(dy: Tensor, gate: Tensor, up: Tensor, act: int) -> tuple[Tensor, Tensor]:
    from wavefront.kernels import glu as kernels
    from wavefront.kernels._launch import op_scope

    with op_scope("swiglu" if act == 0 else "geglu"):
        return kernels.glu_bwd(dy, gate, up, act)


@_glu_bwd.register_fake
def _(dy, gate, up, act):
    return gate.new_empty(gate.shape), gate.new_empty(gate.shape)


def _setup_context(ctx, inputs, output):
    gate, up, act = inputs
    ctx.save_for_backward(gate, up)
    ctx.act = act


def _backward(ctx, dy):
    gate, up = ctx.saved_tensors
    dgate, dup = torch.ops.wavefront.glu_bwd(as_rows(dy), gate, up, ctx.act)
    return dgate, dup, None


_glu_fwd.register_autograd(_backward, setup_context=_setup_context)


def _run(op: str, gate: Tensor, up: Tensor, act: int, ref) -> Tensor:
    check_tensor(op, "gate", gate)
    check_tensor(op, "up", up)
    check_shape(op, "up", up, tuple(gate.shape), "the shape of 'gate'")
    check_same_dtype(op, gate=gate, up=up)
    check_same_device(op, gate=gate, up=up)
    if gate.numel() == 0 or not runtime.uses_triton(gate.device):
        return ref()
    return torch.ops.wavefront.glu_fwd(as_rows(gate), as_rows(up), act).view(gate.shape)


def swiglu(gate: Tensor, up: Tensor) -> Tensor:
    """``silu(gate) * up`` with Hugging Face's rounding (silu rounded to the dtype, then the product).

    gate and up may be column slices of one fused projection output (no copy); the backward recomputes
    silu from the saved inputs.
    """
    return _run("swiglu", gate, up, ACTS["silu"], lambda: reference.swiglu(gate, up))


def geglu(gate: Tensor, up: Tensor, approximate: str = "tanh") -> Tensor:
    """``gelu(gate, approximate) * up`` (Gemma's MLP uses the tanh form) with Hugging Face's rounding."""
    check_choice("geglu", "approximate", approximate, APPROXIMATIONS)
    return _run("geglu", gate, up, ACTS[f"gelu_{approximate}"], lambda: reference.geglu(gate, up, approximate))


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


def _bytes(case: Case, dtype: torch.dtype, mode: Mode) -> int:
    # fwd: read gate and up, write y. bwd: read dy, gate and up, write dgate and dup.
    return (3 if mode == "fwd" else 5) * numel(case) * itemsize(dtype)


_EXTRA = (
    Case("multi_block", "rows of 9000: two whole 4096-element blocks and a masked tail", {"n_rows": 2, "n_cols": 9000}),
    Case("fused_gate_up", "gate and up are column halves of one fused projection (row stride 2x width)",
         {"n_rows": 12, "n_cols": 704}, layout="fused"),
    Case("saturated", "gates up to ~24: the activation saturates, its derivative underflows",
         {"n_rows": 8, "n_cols": 512}, {"scale": 8.0}),
    Case("small_gates", "gates near 0: tanh's series branch and silu's linear regime",
         {"n_rows": 8, "n_cols": 512}, {"scale": 0.01}),
)


def _bench_cases():
    from wavefront.shapes import MODELS

    widths = {f"{m}_ffn": MODELS[m].ffn_hidden for m in ("llama3-8b", "llama3-70b", "qwen2.5-7b", "gemma2-9b")}
    return bench_row_cases(widths)


SPECS = (
    OpSpec(
        name="swiglu",
        fn=swiglu,
        reference=reference.swiglu,
        eager=reference.swiglu_eager,
        make_inputs=_inputs,
        # Elementwise: wide rows only add blocks, so the row regimes stop at one multi-block case.
        cases=row_cases(include=("one_row", "npow2", "width_one", "rows_pow2", "batched", "strided", "transposed"),
                        extra=_EXTRA),
        bench_cases=_bench_cases(),
        # silu: exp2, add, divide, multiply; times up. bwd adds the derivative's 4 and two products.
        flops=lambda c, mode: (5 if mode == "fwd" else 11) * numel(c),
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
        flops=lambda c, mode: (10 if mode == "fwd" else 20) * numel(c),
        min_bytes=_bytes,
        description="gelu(gate) * up (tanh or erf form), Hugging Face rounding",
    ),
)
