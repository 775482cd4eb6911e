"""The autograd glue the linear-like ops share (``linear``, ``grouped_linear``): what the forward saves, the
check that a backward finds the tensor it needs, and which forward input receives which gradient.

Every such op saves its operands (``x``, ``weight``, and e.g. ``offsets``) and last one optional tensor (an
activation's derivative, a pre-activation), which is 0-element when no input required a gradient in the
forward (custom ops return tensors only). Its backward returns one gradient per forward input, in order:
``x``, ``weight``, then a bias and a residual where the op takes them; the residual's gradient is ``dy``.
"""

from __future__ import annotations

from torch import Tensor


def save_operands(ctx, *tensors: Tensor, **flags) -> None:
    """Save the operands, the optional tensor last, for backward; `flags` become attributes of ctx."""
    ctx.save_for_backward(*tensors)
    for name, value in flags.items():
        setattr(ctx, name, value)


def saved_operands(ctx, op: str, needs_saved: bool, what: str) -> tuple[Tensor, ...]:
    """The saved tensors; a clear error when the backward needs the last (optional) one but the forward ran
    without a gradient."""
    tensors = ctx.saved_tensors
    if needs_saved and tensors[-1].numel() == 0:
        raise RuntimeError(f"{op}: backward needs {what}, which was not saved because no input required a "
                           "gradient when the forward ran")
    return tensors


def input_grads(ctx, dx: Tensor | None, dw: Tensor | None, db: Tensor | None = None,
                dresidual: Tensor | None = None) -> tuple[Tensor | None, ...]:
    """One entry per forward input: x, weight, bias, residual in that order, each only where autograd asks
    for it (an absent bias or residual never does), None for the inputs after them (flags, offsets)."""
    grads = (dx, dw, db, dresidual)
    needs = ctx.needs_input_grad
    return tuple(grads[i] if i < len(grads) and needs[i] else None for i in range(len(needs)))
