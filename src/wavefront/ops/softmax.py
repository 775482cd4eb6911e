"""Softmax over the last dim: validation, custom ops with fake kernels, autograd (saves the output)."""

from __future__ import annotations

import torch
from torch import Tensor

from wavefront import reference, runtime
from wavefront.kernels._scope import op_scope
from wavefront.ops._rows import bench_row_cases, numel, row_cases, row_tensor
from wavefront.ops._spec import Case, Mode, OpInputs, OpSpec, itemsize
from wavefront.ops._validate import as_rows, check_tensor


@torch.library.custom_op("wavefront::softmax_fwd", mutates_args=())
def _softmax_fwd(x: Tensor) -> Tensor:
    from wavefront.kernels import softmax as kernels  # lazy: Triton-free import

    with op_scope("softmax"):
        return kernels.softmax_fwd(x)


@_softmax_fwd.register_fake
def _(x):
    return torch.empty_like(x)


@torch.library.custom_op("wavefront::softmax_bwd", mutates_args=())
def _softmax_bwd(dy: Tensor, y: Tensor) -> Tensor:
    from wavefront.kernels import softmax as kernels  # lazy: Triton-free import

    with op_scope("softmax"):
        return kernels.softmax_bwd(dy, y)


@_softmax_bwd.register_fake
def _(dy, y):
    return torch.empty_like(y)


def _setup_context(ctx, inputs, output):
    ctx.save_for_backward(output)


def _backward(ctx, dy):
    (y,) = ctx.saved_tensors
    return torch.ops.wavefront.softmax_bwd(as_rows(dy), y)


_softmax_fwd.register_autograd(_backward, setup_context=_setup_context)


def softmax(x: Tensor) -> Tensor:
    """Softmax over the last dim, fp32 accumulation, output in x's dtype."""
    check_tensor("softmax", "x", x)
    if x.numel() == 0 or not runtime.uses_triton(x.device):
        return reference.softmax(x)
    return torch.ops.wavefront.softmax_fwd(as_rows(x)).view(x.shape)


def _inputs(case: Case, dtype, device, gen) -> OpInputs:
    return OpInputs((row_tensor(case, dtype, device, gen, scale=case.options.get("scale", 1.0)),), {}, (0,))


def _bytes(case: Case, dtype: torch.dtype, mode: Mode) -> int:
    # fwd: read x, write y. bwd: read y and dy, write dx.
    return (2 if mode == "fwd" else 3) * numel(case) * itemsize(dtype)


SPECS = (
    OpSpec(
        name="softmax",
        fn=softmax,
        reference=reference.softmax,
        make_inputs=_inputs,
        cases=row_cases(extra=(
            Case("large_logits", "logits scaled by 30: exp overflows without max subtraction",
                 {"n_rows": 4, "n_cols": 2048}, {"scale": 30.0}),
            Case("large_logits_wide", "scaled logits across blocks: online max rescaling",
                 {"n_rows": 2, "n_cols": 40000}, {"scale": 30.0}),
        )),
        bench_cases=bench_row_cases({"attn_scores_4k": 4096, "attn_scores_32k": 32768, "vocab_128k": 131072,
                                     "vocab_262k": 262144}),
        # max, subtract, exp, sum, divide per element forward; multiply, sum, subtract, multiply backward.
        flops=lambda c, mode: 4 * numel(c),
        min_bytes=_bytes,
        description="softmax over the last dim",
    ),
)
