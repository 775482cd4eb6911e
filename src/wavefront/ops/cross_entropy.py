"""Cross-entropy over the vocabulary: validation, custom ops with fake kernels, autograd, registry entry.

Two custom ops carry the default path: ``wavefront::cross_entropy_fwd`` (per-row loss and softmax statistics,
one read of the logits) and ``wavefront::cross_entropy_bwd`` (reads the logits once more with the saved
statistics and writes the gradient). The reduction is plain tensor arithmetic on the per-row losses, so its
gradient reaches the backward kernel as a per-row scale and the mean's denominator (the count, or class
weight, of the non-ignored targets) stays on the device: no ``.item()``, CUDA-graph safe.

``grad_in_forward=True`` (opt-in) uses ``wavefront::cross_entropy_fwd_with_grad``: the forward launch also
writes the gradient for the upstream scale the reduction gives when the returned loss is differentiated
directly; the backward (``rescale_rows_``) rescales only rows whose upstream scale differs, compared on the
device. ``inplace_backward=True`` does the same into the logits buffer (``wavefront::cross_entropy_fwd_grad_``),
so the backward allocates nothing of size [tokens x vocab]; the caller's logits are overwritten (see
docs/kernels-loss-pointwise.md).

Why the default does not compute the gradient in the forward: the gradient buffer would be held from the
forward to the backward (the default holds nothing beyond the logits the caller keeps), and when the
caller scales the loss the rescale moves as many bytes as the default backward: forward read + write,
then read + write again (4 passes over [N, V]) against the default's 3. When the loss is differentiated
as returned, the opt-in moves 2 passes (the logits read once, the gradient written once) against 3.
"""

from __future__ import annotations

import numbers
from typing import NamedTuple

import torch
from torch import Tensor
from torch.utils._python_dispatch import is_in_torch_dispatch_mode

from wavefront import reference, runtime
from wavefront.kernels._heuristics import stat_dtype
from wavefront.kernels._scope import op_scope
from wavefront.ops._rows import bench_row_cases, numel, randn, row_cases, row_tensor
from wavefront.ops._spec import Case, Mode, OpInputs, OpSpec, itemsize
from wavefront.ops._validate import as_rows, check_choice, check_same_device, check_shape, check_tensor

INDEX_DTYPES = (torch.int64, torch.int32)


class LossOutput(NamedTuple):
    """What the fused losses return when more than the loss is asked for (``return_z_loss``,
    ``return_predicted_tokens``, ``return_token_accuracy``); a field not asked for is None. Only ``loss``
    carries a gradient; the others are measurements of the same forward (no extra pass over the logits).

    - ``z_loss``: the z-loss term z * lse^2 reduced like the loss (its share of ``loss``; zeros for z = 0).
    - ``predicted_tokens``: int64, the target's shape: the first index of the largest raw logit (before any
      softcap), ``ignore_index`` where the target is ignored (those logits are never read).
    - ``token_accuracy``: 0-d fp32, the fraction of non-ignored positions whose predicted token is the
      target (0 when every position is ignored).
    """

    loss: Tensor
    z_loss: Tensor | None = None
    predicted_tokens: Tensor | None = None
    token_accuracy: Tensor | None = None


def _stat(logits: Tensor) -> torch.dtype:
    return stat_dtype(logits.dtype)


def _argmax_out(logits: Tensor, want: bool) -> Tensor:
    """The predicted-token output: [n_rows] int64 when asked for, else an empty placeholder."""
    return logits.new_empty(logits.shape[0] if want else 0, dtype=torch.int64)


@torch.library.custom_op("wavefront::cross_entropy_fwd", mutates_args=())
def _ce_fwd(logits: Tensor, target: Tensor, weight: Tensor | None, ignore_index: int, label_smoothing: float,
            z_loss: float, softcap: float | None, want_argmax: bool) -> tuple[Tensor, Tensor, Tensor]:
    from wavefront.kernels import cross_entropy as kernels  # lazy: Triton-free import

    argmax = _argmax_out(logits, want_argmax)
    with op_scope("cross_entropy"):
        loss, stats = kernels.cross_entropy_rows(logits, target, weight, ignore_index=ignore_index,
                                                 label_smoothing=label_smoothing, z_loss=z_loss, softcap=softcap,
                                                 argmax=argmax if want_argmax else None)
    return loss, stats, argmax


@_ce_fwd.register_fake
def _(logits, target, weight, ignore_index, label_smoothing, z_loss, softcap, want_argmax):
    n_rows = logits.shape[0]
    return (logits.new_empty(n_rows, dtype=_stat(logits)), logits.new_empty((n_rows, 2), dtype=_stat(logits)),
            _argmax_out(logits, want_argmax))


@torch.library.custom_op("wavefront::cross_entropy_bwd", mutates_args=())
def _ce_bwd(dloss: Tensor, logits: Tensor, target: Tensor, weight: Tensor | None, stats: Tensor, ignore_index: int,
            label_smoothing: float, z_loss: float, softcap: float | None) -> Tensor:
    from wavefront.kernels import cross_entropy as kernels  # lazy: Triton-free import

    grad = torch.empty_like(logits)
    with op_scope("cross_entropy"):
        kernels.cross_entropy_rows(logits, target, weight, ignore_index=ignore_index, label_smoothing=label_smoothing,
                                   z_loss=z_loss, softcap=softcap, stats=stats, grad=grad, scale=dloss)
    return grad


@_ce_bwd.register_fake
def _(dloss, logits, target, weight, stats, ignore_index, label_smoothing, z_loss, softcap):
    return torch.empty_like(logits)


def _setup_context(ctx, inputs, output):
    logits, target, weight, ignore_index, label_smoothing, z_loss, softcap, _ = inputs
    ctx.save_for_backward(logits, target, weight, output[1])
    ctx.options = (ignore_index, label_smoothing, z_loss, softcap)
    ctx.mark_non_differentiable(output[1], output[2])
    ctx.set_materialize_grads(False)  # no zero "gradient" for the statistics


def _backward(ctx, dloss, dstats, dargmax):
    logits, target, weight, stats = ctx.saved_tensors
    dlogits = torch.ops.wavefront.cross_entropy_bwd(dloss, logits, target, weight, stats, *ctx.options)
    return dlogits, None, None, None, None, None, None, None


_ce_fwd.register_autograd(_backward, setup_context=_setup_context)


def _fwd_with_grad(logits: Tensor, grad: Tensor, target: Tensor, weight: Tensor | None, ignore_index: int,
                   label_smoothing: float, z_loss: float, softcap: float | None, assumed: Tensor,
                   want_argmax: bool) -> tuple[Tensor, Tensor, Tensor]:
    from wavefront.kernels import cross_entropy as kernels  # lazy: Triton-free import

    argmax = _argmax_out(logits, want_argmax)
    with op_scope("cross_entropy"):
        loss, stats = kernels.cross_entropy_rows(logits, target, weight, ignore_index=ignore_index,
                                                 label_smoothing=label_smoothing, z_loss=z_loss, softcap=softcap,
                                                 grad=grad, scale=assumed, argmax=argmax if want_argmax else None)
    return loss, stats, argmax


@torch.library.custom_op("wavefront::cross_entropy_fwd_grad_", mutates_args=("logits",))
def _ce_fwd_grad_(logits: Tensor, target: Tensor, weight: Tensor | None, ignore_index: int, label_smoothing: float,
                  z_loss: float, softcap: float | None, assumed: Tensor,
                  want_argmax: bool) -> tuple[Tensor, Tensor, Tensor]:
    return _fwd_with_grad(logits, logits, target, weight, ignore_index, label_smoothing, z_loss, softcap, assumed,
                          want_argmax)


@_ce_fwd_grad_.register_fake
def _(logits, target, weight, ignore_index, label_smoothing, z_loss, softcap, assumed, want_argmax):
    n_rows = logits.shape[0]
    return (logits.new_empty(n_rows, dtype=_stat(logits)), logits.new_empty((n_rows, 2), dtype=_stat(logits)),
            _argmax_out(logits, want_argmax))


@torch.library.custom_op("wavefront::cross_entropy_fwd_with_grad", mutates_args=())
def _ce_fwd_with_grad(logits: Tensor, target: Tensor, weight: Tensor | None, ignore_index: int,
                      label_smoothing: float, z_loss: float, softcap: float | None, assumed: Tensor,
                      want_argmax: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    grad = torch.empty_like(logits)
    loss, stats, argmax = _fwd_with_grad(logits, grad, target, weight, ignore_index, label_smoothing, z_loss,
                                         softcap, assumed, want_argmax)
    return loss, stats, argmax, grad


@_ce_fwd_with_grad.register_fake
def _(logits, target, weight, ignore_index, label_smoothing, z_loss, softcap, assumed, want_argmax):
    n_rows = logits.shape[0]
    return (logits.new_empty(n_rows, dtype=_stat(logits)), logits.new_empty((n_rows, 2), dtype=_stat(logits)),
            _argmax_out(logits, want_argmax), torch.empty_like(logits))


class _GradInForward(torch.autograd.Function):
    """Forward writes d(loss)/d(logits) for the assumed upstream scale per row (``assumed``: what the
    reduction hands each row when the returned loss is differentiated directly), into the logits rows
    (``inplace``) or a new buffer; backward rescales in place only the rows whose upstream scale differs
    (kernels/cross_entropy.py, ``rescale_rows_``: no host synchronization).

    ``state`` carries the gradient (and, in place, the rows' version counter after the forward, see
    :func:`_grad_in_forward_loss`): a change to the rows after the loss would corrupt the gradient, so the
    backward refuses it; it runs once (it rescales in place).
    """

    @staticmethod
    def forward(ctx, rows, target, weight, ignore_index, label_smoothing, z_loss, softcap, assumed, want_argmax,
                inplace, state):
        args = (rows, target, weight, ignore_index, label_smoothing, z_loss, softcap, assumed, want_argmax)
        if inplace:
            loss_rows, stats, argmax = torch.ops.wavefront.cross_entropy_fwd_grad_(*args)
            grad = rows
        else:
            loss_rows, stats, argmax, grad = torch.ops.wavefront.cross_entropy_fwd_with_grad(*args)
        ctx.state, ctx.inplace, ctx.assumed = state, inplace, assumed
        state["grad"] = grad
        ctx.mark_non_differentiable(stats, argmax)
        return loss_rows, stats, argmax

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dloss, dstats, dargmax):
        from wavefront.kernels import cross_entropy as kernels  # lazy: Triton-free import

        flag = "inplace_backward" if ctx.inplace else "grad_in_forward"
        grad = ctx.state.pop("grad", None)
        if grad is None:
            raise RuntimeError(f"cross_entropy: with {flag}=True the backward can run only once")
        if ctx.inplace and grad._version != ctx.state["version"]:
            raise RuntimeError("cross_entropy: the logits were modified in place after the loss with "
                               "inplace_backward=True, where they hold the gradient; pass inplace_backward=False")
        grad = kernels.rescale_rows_(grad, dloss, ctx.assumed)
        return grad, None, None, None, None, None, None, None, None, None, None


class _Overwritten(torch.autograd.Function):
    """Marks the rows as overwritten: the caller's logits now carry this node, so an op that uses them after
    the loss with autograd sends a gradient here, which is refused (it would have read the gradient as if
    it were the logits)."""

    @staticmethod
    def forward(ctx, rows):
        ctx.mark_dirty(rows)
        return rows

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("cross_entropy: the logits were used by another op after the loss with "
                           "inplace_backward=True, which overwrote them with the gradient; pass "
                           "inplace_backward=False")


def _grad_in_forward_loss(rows: Tensor, *args, inplace: bool) -> tuple[Tensor, Tensor, Tensor]:
    state: dict = {}
    out = _GradInForward.apply(rows, *args, inplace, state)
    if inplace:
        _Overwritten.apply(rows)
        state["version"] = rows._version
    return out


def assumed_row_scale(reduction: str, denom: Tensor | None, divisor, dtype: torch.dtype, device) -> Tensor:
    """The upstream scale each row's loss receives when the reduced loss is differentiated with gradient 1:
    computed by the same tensor operations autograd's backward of reference.reduce_loss performs, so the two
    agree bit for bit in that case."""
    one = torch.ones((), dtype=dtype, device=device)
    if reduction == "mean":
        return one / torch.where(denom > 0, denom, torch.ones_like(denom))
    if reduction == "sum" and divisor is not None:
        return one / divisor
    return one


def check_inplace_backward(op: str, logits: Tensor) -> None:
    """Refuse in-place gradients into a tensor whose values autograd or the caller will still need."""
    if logits.is_leaf:
        raise ValueError(f"{op}: inplace_backward=True would overwrite 'logits', a leaf tensor that requires "
                         f"grad (a parameter or an input); pass inplace_backward=False")


def check_loss_options(op: str, *, n_classes: int, ignore_index, label_smoothing, z_loss, softcap, reduction,
                       divisor, class_weight, class_weight_name: str, device) -> None:
    """Checks shared by cross_entropy and linear_cross_entropy; messages name the argument."""
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, numbers.Integral):
        raise TypeError(f"{op}: argument 'ignore_index' must be an int, got {type(ignore_index).__name__}")
    for name, value in (("label_smoothing", label_smoothing), ("z_loss", z_loss)):
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"{op}: argument '{name}' must be a float, got {type(value).__name__}")
    if not 0.0 <= float(label_smoothing) < 1.0:
        raise ValueError(f"{op}: argument 'label_smoothing' must be in [0, 1), got {label_smoothing}")
    if not float(z_loss) >= 0.0:
        raise ValueError(f"{op}: argument 'z_loss' must be >= 0, got {z_loss}")
    if softcap is not None:
        if isinstance(softcap, bool) or not isinstance(softcap, numbers.Real):
            raise TypeError(f"{op}: argument 'softcap' must be a float or None, got {type(softcap).__name__}")
        if not float(softcap) > 0.0:
            raise ValueError(f"{op}: argument 'softcap' must be > 0 (or None for no capping), got {softcap}")
    check_choice(op, "reduction", reduction, reference.REDUCTIONS)
    if divisor is not None:
        if reduction != "sum":
            raise ValueError(f"{op}: argument 'divisor' needs reduction='sum' (the sum is divided by it), got "
                             f"reduction={reduction!r}")
        if isinstance(divisor, torch.Tensor):
            if divisor.numel() != 1:
                raise ValueError(f"{op}: argument 'divisor' must be a number or a one-element tensor, got shape "
                                 f"{tuple(divisor.shape)}")
        elif isinstance(divisor, bool) or not isinstance(divisor, numbers.Real):
            raise TypeError(f"{op}: argument 'divisor' must be a number or a tensor, got {type(divisor).__name__}")
        elif divisor == 0:
            raise ValueError(f"{op}: argument 'divisor' must be non-zero")
    if class_weight is not None:
        check_tensor(op, class_weight_name, class_weight, ndim=1)
        check_shape(op, class_weight_name, class_weight, (n_classes,), "one weight per class")
        if class_weight.device != torch.device(device):
            raise ValueError(f"{op}: argument '{class_weight_name}' must be on {device}, got {class_weight.device}")


def check_output_options(op: str, *, z_loss_reduction, loss_dtype, input_dtype: torch.dtype, **flags) -> None:
    """Checks of the options that choose what the fused losses return; messages name the argument."""
    check_choice(op, "z_loss_reduction", z_loss_reduction, reference.Z_LOSS_REDUCTIONS)
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise TypeError(f"{op}: argument '{name}' must be a bool, got {type(value).__name__}")
    if loss_dtype is not None:
        allowed = (stat_dtype(input_dtype), input_dtype)
        if not isinstance(loss_dtype, torch.dtype) or loss_dtype not in allowed:
            names = " or ".join(dict.fromkeys(str(d) for d in allowed))
            raise ValueError(f"{op}: argument 'loss_dtype' must be None (the default, {allowed[0]}) or {names} "
                             f"(the input's dtype), got {loss_dtype!r}")


def mean_class_weight(target: Tensor, ignore_index: int, class_weight: Tensor | None, z_loss: float,
                      reduction: str, z_loss_reduction: str) -> tuple[Tensor | None, bool]:
    """(the class weights the kernels see, whether the mean divides by the token count).

    The cross-entropy term of a weighted mean is divided by W, the total class weight of the non-ignored
    targets; PaLM's z-loss term by their count n (``z_loss_reduction="token"``). Both in one kernel pass: the
    loss is linear in the class weights, so weights scaled by n / W and a mean over the n tokens give
    sum(ce) / W + z sum(lse^2) / n, and the gradient follows from the same per-row scale 1 / n. A [V] vector
    scaled on the device, no host sync; an all-zero-weight batch (W = 0) divides by 1 as before."""
    if class_weight is None or reduction != "mean" or not z_loss or z_loss_reduction == "weighted":
        return class_weight, False
    # In float64, rounded once to the kernels' dtype: the scaled weights carry half an ulp of error, not the
    # two roundings of an fp32 n / W and product (which cost the weighted mean ~2 ulps against float64).
    acc = torch.float64 if class_weight.dtype == torch.float64 else torch.float32
    n = reference.cross_entropy_denominator(target, ignore_index, None, torch.float64)
    total = reference.cross_entropy_denominator(target, ignore_index, class_weight, torch.float64)
    scale = n / torch.where(total > 0, total, torch.ones_like(total))
    return (class_weight.to(torch.float64) * scale).to(acc), True


def loss_result(loss: Tensor, stats: Tensor | None, predicted: Tensor | None, target: Tensor, *, ignore_index: int,
                z_loss: float, class_weight: Tensor | None, reduction: str, divisor, z_loss_reduction: str,
                return_z_loss: bool, return_predicted_tokens: bool, return_token_accuracy: bool,
                loss_dtype: torch.dtype | None) -> Tensor | LossOutput:
    """What a fused loss returns, from its reduced ``loss``, the rows' statistics ``stats`` [N, 2] = (m, log s)
    (lse = m + log s; zeros for ignored rows) and predicted tokens [N] (ignore_index where ignored): the loss
    alone, or a :class:`LossOutput` when more is asked for. O(N) arithmetic on per-row values, nothing of
    the vocabulary's size."""
    if loss_dtype is not None:
        loss = loss.to(loss_dtype)
    if not (return_z_loss or return_predicted_tokens or return_token_accuracy):
        return loss
    flat = target.reshape(-1)
    valid = flat != ignore_index
    z_out = tokens = accuracy = None
    if return_z_loss:
        lse = stats[:, 0] + stats[:, 1]
        z_rows = torch.where(valid, z_loss * lse * lse, torch.zeros_like(lse)) if z_loss else torch.zeros_like(lse)
        by = class_weight if z_loss_reduction == "weighted" else None
        denom = (reference.cross_entropy_denominator(flat, ignore_index, by, lse.dtype) if reduction == "mean"
                 else None)
        z_out = reference.reduce_loss(z_rows, denom, reduction, divisor)
        z_out = z_out.view(target.shape) if reduction == "none" else z_out
        z_out = z_out if loss_dtype is None else z_out.to(loss_dtype)
    if return_predicted_tokens:
        tokens = predicted.view(target.shape)
    if return_token_accuracy:
        count = valid.sum().to(torch.float32)
        hits = ((predicted == flat) & valid).sum().to(torch.float32)
        accuracy = hits / torch.where(count > 0, count, torch.ones_like(count))
    return LossOutput(loss, z_out, tokens, accuracy)


def reference_rows(logits: Tensor, target: Tensor, ignore_index: int, softcap: float | None) -> tuple[Tensor, Tensor]:
    """(statistics [N, 2] = (lse, 0), predicted tokens [N]) of logits [N, V] in plain PyTorch, for the
    cpu-reference fallback of :func:`loss_result` (zeros and ignore_index where the target is ignored)."""
    valid = target != ignore_index
    x = logits.to(stat_dtype(logits.dtype))
    if softcap is not None:
        x = softcap * torch.tanh(x / softcap)
    lse = torch.where(valid, torch.logsumexp(x, dim=-1), torch.zeros((), dtype=x.dtype, device=x.device))
    predicted = torch.where(valid, logits.argmax(-1), torch.full_like(target, ignore_index, dtype=torch.int64))
    return torch.stack([lse, torch.zeros_like(lse)], dim=1), predicted


def values_checkable(t: Tensor) -> bool:
    """Whether reading t's values on the host is free and meaningful: a CPU tensor (no device sync),
    outside torch.compile tracing and outside any dispatch mode (shape-only captures such as inspect's,
    fake tensors, memory meters), where the values may not exist."""
    return t.device.type == "cpu" and not torch.compiler.is_compiling() and not is_in_torch_dispatch_mode()


def check_target(op: str, target, batch_shape: tuple[int, ...], n_classes: int, ignore_index: int, device,
                 what: str) -> None:
    check_tensor(op, "target", target, dtypes=INDEX_DTYPES, min_dim=0)
    check_shape(op, "target", target, batch_shape, what)
    if target.device != torch.device(device):
        raise ValueError(f"{op}: argument 'target' must be on {device}, got {target.device}")
    # Range check only where it costs no device synchronization (CPU tensors, outside compilation). On a
    # GPU an out-of-range target never reads out of bounds: its row's loss is NaN (kernels/cross_entropy.py).
    if values_checkable(target) and target.numel():
        bad = (target != ignore_index) & ((target < 0) | (target >= n_classes))
        if bool(bad.any()):
            first = int(bad.reshape(-1).nonzero()[0])
            raise ValueError(f"{op}: argument 'target' has values outside [0, {n_classes}) that are not "
                             f"ignore_index ({ignore_index}): {int(target.reshape(-1)[first])} at flat index {first}")


def cross_entropy(logits: Tensor, target: Tensor, *, ignore_index: int = -100, label_smoothing: float = 0.0,
                  z_loss: float = 0.0, softcap: float | None = None, weight: Tensor | None = None,
                  reduction: str = "mean", divisor: Tensor | float | None = None,
                  inplace_backward: bool = False, grad_in_forward: bool = False, z_loss_reduction: str = "token",
                  loss_dtype: torch.dtype | None = None, return_z_loss: bool = False,
                  return_predicted_tokens: bool = False, return_token_accuracy: bool = False) -> Tensor | LossOutput:
    """Cross-entropy over the last dim of ``logits [..., V]`` with integer ``target [...]``.

    Same definition as ``F.cross_entropy`` (class ``weight``, ``label_smoothing``, ``ignore_index``,
    reductions ``"mean" | "sum" | "none"``), computed in fp32 and returned in fp32 (fp64 for fp64 logits),
    plus ``softcap`` (logits -> softcap * tanh(logits / softcap) first, Gemma 2), ``z_loss`` (adds
    z_loss * lse^2 per non-ignored row, PaLM) and ``divisor`` (with reduction="sum": the sum divided by
    it, e.g. Hugging Face's ``num_items_in_batch`` for gradient accumulation; a tensor stays on device).

    ``mean`` divides by the count (or total class weight) of non-ignored targets without a host sync; an
    all-ignored batch gives 0 with zero gradient (F.cross_entropy gives NaN). The z-loss term is averaged
    over the non-ignored targets even with class weights (PaLM; class weights do not scale it);
    ``z_loss_reduction="weighted"`` divides it by the total class weight like the rest instead.

    ``loss_dtype``: the dtype of the returned loss (and z-loss): None is fp32 (fp64 for fp64 logits);
    ``logits.dtype`` rounds the fp32 result once to the input's dtype.

    ``return_z_loss``, ``return_predicted_tokens``, ``return_token_accuracy``: return a :class:`LossOutput`
    (loss, z_loss, predicted_tokens, token_accuracy) with the fields asked for, computed in the same read of
    the logits (the argmax in the kernel's online pass, the z-loss from the saved statistics).

    ``inplace_backward=True`` overwrites ``logits`` with the gradient during the forward to save one
    [..., V] buffer in the backward: only when nothing else reads the logits after the loss (one backward
    pass). Refused (ValueError) for leaf logits; a backward through another op that used the logits after
    the loss, or after an in-place change to them, raises RuntimeError. A read without autograd (``argmax``
    under no_grad) cannot be detected and sees the gradient. Under torch.compile the option is ignored
    (the compiler plans the buffers). It implies ``grad_in_forward``'s backward (below).

    ``grad_in_forward=True`` (opt-in, when the loss is the last op: ``loss.backward()``) computes the gradient
    in the forward launch, so the logits are read once (rows up to the single-pass width) instead of once in
    the forward and once more in the backward. The forward assumes the upstream gradient of the returned
    loss is 1: each row's gradient is scaled by what the reduction then gives it (1 / the mean's
    denominator, 1 / ``divisor``, or 1). The backward compares the upstream gradient that arrives with
    that, per row, on the device: equal, it returns the stored gradient untouched (8 bytes read per row);
    different (the caller scaled the loss: ``loss * 0.5``, a gradient-accumulation divisor, a GradScaler's
    scale, or used it twice), it multiplies the stored rows by the ratio in place (one read and one write of
    the gradient): still the exact gradient up to one extra rounding to the logits' dtype (none for a
    power-of-two ratio). The backward runs once (a second backward through the same graph raises
    RuntimeError); the gradient buffer ([..., V] in the logits' dtype) is held from the forward to the
    backward, where the default path holds nothing extra. Ignored under torch.compile, like
    ``inplace_backward``.
    """
    op = "cross_entropy"
    check_tensor(op, "logits", logits)
    n_classes = logits.shape[-1]
    check_target(op, target, tuple(logits.shape[:-1]), n_classes, ignore_index, logits.device,
                 "the shape of 'logits' without its last (class) dim")
    check_loss_options(op, n_classes=n_classes, ignore_index=ignore_index, label_smoothing=label_smoothing,
                       z_loss=z_loss, softcap=softcap, reduction=reduction, divisor=divisor, class_weight=weight,
                       class_weight_name="weight", device=logits.device)
    check_same_device(op, logits=logits, target=target, weight=weight)
    check_output_options(op, z_loss_reduction=z_loss_reduction, loss_dtype=loss_dtype, input_dtype=logits.dtype,
                         return_z_loss=return_z_loss, return_predicted_tokens=return_predicted_tokens,
                         return_token_accuracy=return_token_accuracy)
    options = (int(ignore_index), float(label_smoothing), float(z_loss), None if softcap is None else float(softcap))
    want_argmax = return_predicted_tokens or return_token_accuracy
    result = dict(ignore_index=options[0], z_loss=options[2], class_weight=weight, reduction=reduction,
                  divisor=divisor, z_loss_reduction=z_loss_reduction, return_z_loss=return_z_loss,
                  return_predicted_tokens=return_predicted_tokens, return_token_accuracy=return_token_accuracy,
                  loss_dtype=loss_dtype)
    if logits.numel() == 0 or not runtime.uses_triton(logits.device):
        loss = reference.cross_entropy(logits, target, ignore_index=ignore_index, label_smoothing=label_smoothing,
                                       z_loss=z_loss, softcap=softcap, weight=weight, reduction=reduction,
                                       divisor=divisor, z_loss_reduction=z_loss_reduction)
        stats = predicted = None
        if return_z_loss or want_argmax:
            flat_target = target.reshape(-1)
            stats, predicted = reference_rows(logits.detach().reshape(flat_target.shape[0], n_classes), flat_target,
                                              options[0], options[3])
        return loss_result(loss, stats, predicted, target, **result)
    rows = as_rows(logits)
    flat_target = target.reshape(-1)
    w, by_tokens = mean_class_weight(flat_target, options[0], weight, options[2], reduction, z_loss_reduction)
    w = w.contiguous() if w is not None else None
    denom = (reference.cross_entropy_denominator(flat_target, ignore_index, None if by_tokens else w,
                                                 _stat(logits)) if reduction == "mean" else None)
    if ((inplace_backward or grad_in_forward) and torch.is_grad_enabled() and logits.requires_grad
            and not torch.compiler.is_compiling()):
        if inplace_backward:
            check_inplace_backward(op, logits)
        assumed = assumed_row_scale(reduction, denom, divisor, _stat(logits), logits.device)
        loss_rows, stats, predicted = _grad_in_forward_loss(rows, flat_target, w, *options, assumed, want_argmax,
                                                            inplace=inplace_backward)
    else:
        loss_rows, stats, predicted = torch.ops.wavefront.cross_entropy_fwd(rows, flat_target, w, *options,
                                                                            want_argmax)
    out = reference.reduce_loss(loss_rows, denom, reduction, divisor)
    out = out.view(target.shape) if reduction == "none" else out
    return loss_result(out, stats, predicted, target, **result)


# ---------------------------------------------------------------------------------------------------
# Registry entry. Targets are uniform over the vocabulary with about one in eight ignored (padding).


def _inputs(case: Case, dtype, device, gen) -> OpInputs:
    opts = dict(case.options)
    scale = opts.pop("scale", 2.0)
    ignore_frac = opts.pop("ignore_frac", 0.125)
    logits = row_tensor(case, dtype, device, gen, scale=scale)
    n_classes = case.dims["n_cols"]
    batch_shape = tuple(logits.shape[:-1])
    target = torch.randint(0, n_classes, batch_shape, generator=gen)
    ignored = torch.rand(batch_shape, generator=gen) < ignore_frac
    target = torch.where(ignored, torch.full_like(target, -100), target).to(device)
    if opts.pop("class_weight", False):
        opts["weight"] = randn((n_classes,), torch.float32, device, gen).abs() + 0.1
    return OpInputs((logits, target), opts, (0,))


#: Every value the fused losses can return beside the loss (registry cases, bench cases).
RETURN_ALL = {"return_z_loss": True, "return_predicted_tokens": True, "return_token_accuracy": True}


def predicted_bytes(case: Case, mode: Mode) -> int:
    """The predicted tokens' minimum: 8 B (int64) written per row in the forward, when asked for."""
    wants = case.options.get("return_predicted_tokens") or case.options.get("return_token_accuracy")
    return 8 * case.dims["n_rows"] if wants and mode == "fwd" else 0


def _bytes(case: Case, dtype: torch.dtype, mode: Mode) -> int:
    # fwd: read logits and targets (8 B), write the loss (4 B) and statistics (8 B). bwd: read logits,
    # targets, statistics and the upstream scale (4 B), write the gradient.
    return ((1 if mode == "fwd" else 2) * numel(case) * itemsize(dtype) + 20 * case.dims["n_rows"]
            + predicted_bytes(case, mode))


_VOCABS = {"mistral_32k": 32768, "llama3_128k": 128256, "qwen2.5_152k": 152064, "gemma3_262k": 262144}

SPECS = (
    OpSpec(
        name="cross_entropy",
        fn=cross_entropy,
        reference=reference.cross_entropy,
        make_inputs=_inputs,
        cases=row_cases(extra=(
            Case("smoothing", "label smoothing 0.1: every class receives gradient", {"n_rows": 6, "n_cols": 1000},
                 {"label_smoothing": 0.1}),
            Case("z_loss", "PaLM z-loss 1e-3: adds 2 z lse p to the gradient", {"n_rows": 6, "n_cols": 1000},
                 {"z_loss": 1e-3}),
            Case("softcap", "Gemma 2 softcap 30 with logits up to ~60: tanh saturates", {"n_rows": 6, "n_cols": 1000},
                 {"softcap": 30.0, "scale": 20.0}),
            Case("class_weight", "class weights with smoothing: weighted mean and smoothing term",
                 {"n_rows": 8, "n_cols": 700}, {"class_weight": True, "label_smoothing": 0.2}),
            Case("sum", "reduction sum", {"n_rows": 6, "n_cols": 1000}, {"reduction": "sum"}),
            Case("none", "reduction none: per-row upstream gradients", {"n_rows": 6, "n_cols": 1000},
                 {"reduction": "none"}),
            Case("all_ignored", "every target ignored: loss 0 and zero gradient, not NaN",
                 {"n_rows": 4, "n_cols": 512}, {"ignore_frac": 1.1}),
            Case("large_logits", "logits scaled by 30: exp overflows without max subtraction",
                 {"n_rows": 4, "n_cols": 2048}, {"scale": 30.0}),
            Case("large_logits_wide", "scaled logits across blocks: online max rescaling",
                 {"n_rows": 2, "n_cols": 20000}, {"scale": 30.0}),
            Case("all_options_wide", "softcap, smoothing, z-loss and weights across the blocks of a wide row",
                 {"n_rows": 2, "n_cols": 20000},
                 {"softcap": 30.0, "scale": 10.0, "label_smoothing": 0.1, "z_loss": 1e-4, "class_weight": True}),
            Case("outputs", "z-loss term, predicted tokens, accuracy; PaLM z-loss under a weighted mean",
                 {"n_rows": 8, "n_cols": 1000}, {"z_loss": 1e-3, "class_weight": True, **RETURN_ALL}),
            Case("outputs_z_weighted", "the previous z-loss rule by name: divided by the total class weight",
                 {"n_rows": 8, "n_cols": 700},
                 {"z_loss": 1e-3, "class_weight": True, "z_loss_reduction": "weighted", "return_z_loss": True}),
            Case("outputs_wide", "argmax across blocks and split programs of wide rows, softcapped",
                 {"n_rows": 2, "n_cols": 20000}, {"softcap": 30.0, "scale": 10.0, "z_loss": 1e-4, **RETURN_ALL}),
        )),
        # No ignored targets at bench shapes: ignored rows are never read, which would flatter bytes/minimum.
        bench_cases=(bench_row_cases(_VOCABS, {"ignore_frac": 0.0})
                     + bench_row_cases({"llama3_128k_outputs": 128256}, {"ignore_frac": 0.0, "z_loss": 1e-4,
                                                                       **RETURN_ALL})),
        # fwd per element: softmax statistics (max, subtract, exp2, sum) and the smoothing sum; bwd: exp2,
        # multiply-add and the target correction.
        flops=lambda c, mode: (5 if mode == "fwd" else 4) * numel(c),
        min_bytes=_bytes,
        description="cross-entropy over the vocabulary (ignore_index, smoothing, z-loss, softcap, weights)",
    ),
)
