"""Cross-entropy over a vocabulary-sharded LM head (Megatron-style), forward and backward, without the logits.

Rank r of a tensor-parallel group of size P holds the logits (or the LM-head weight rows) of classes
[r V_r, (r + 1) V_r) of V = P V_r (contiguous, equal shards: pad the vocabulary as Megatron does); targets,
class weights (the whole [V] vector, 4 V bytes) and, for the fused variant, the hidden states are the same on
every rank. Per row, with x' the (softcapped) logits:

    local:     (m_r, s_r, xt_r, wx_r)   kernels/vocab_parallel.py: shard max, sum exp(x' - m_r), the target
                                        logit where this shard owns it (else 0), sum_j w_j x'_j (smoothing)
    all-reduce MAX:  m = max_r m_r
    all-reduce SUM:  s = sum_r s_r exp(m_r - m),  x'_t = sum_r xt_r,  sum_j w_j x'_j = sum_r wx_r
               (one collective on an [N, 3] tensor)
    loss     = (1 - eps) w_t (m + log s - x'_t) + eps (W lse - sum_j w_j x'_j) / V + z lse^2,  lse = m + log s

the definition of wavefront.ops.cross_entropy (same options, same values). Two collectives per call on
4 N bytes and 12 N bytes (fp32): nothing of size N x V ever crosses the network or exists on a rank.

Predicted tokens (``return_predicted_tokens`` / ``return_token_accuracy``): each shard's kernel also writes its
raw logit maximum b_r and the global column a_r of its first occurrence; b = max_r b_r rides in the MAX
all-reduce above ([N, 2] instead of [N]), and one more all-reduce MIN over where(b_r == b, a_r, int64 max)
gives the first column of the maximum over the whole vocabulary (8 N bytes). The z-loss term comes from the
global statistics (no collective).

Backward: the gradient of a shard's logits is the cross-entropy kernel's backward on a column slice
(kernels/cross_entropy.py, ``col_offset = r V_r``, ``n_classes = V``) given the global (m, log s) saved by
the forward: p_j = exp(x'_j - m - log s) needs no other column, so the logits' gradient needs no
collective. The loss is replicated, so every rank's autograd sees the same per-row upstream gradient.

vocab_parallel_linear_cross_entropy (hidden [N, H], weight shard [V_r, H]) never holds the shard's
[N, V_r] logits either: the forward runs chunks of C rows (logits_c = hidden_c weight_r^T into one reused
[C, V_r] buffer, then the statistics kernel; the chunk iterator is the unsharded op's,
ops.linear_cross_entropy.logits_chunks), all-reduces the statistics of all rows once, and the backward
recomputes each chunk's logits, overwrites them with their gradient (the CE backward above, in place) and
accumulates

    dhidden_c  = g_c weight_r     (a partial sum over this rank's classes: all-reduced SUM in fp32, N H)
    dweight_r += g_c^T hidden_c   (fp32 accumulator for 16-bit weights; this rank's rows only)
    dbias_r   += sum_rows g_c

FLOPs per rank: 2 N V_r H forward, 6 N V_r H backward (the logits are recomputed once: the price of
collecting the statistics of every row in one collective before any gradient exists, and of a backward that
works for every reduction and a retained graph). Unlike wavefront.ops.linear_cross_entropy, the gradients
are not computed in the forward: that would need the global statistics per chunk (two collectives per chunk
inside the forward) and the [V_r, H] gradient held from forward to backward.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from wavefront import reference, runtime
from wavefront.kernels._scope import op_scope
from wavefront.ops import LossOutput
from wavefront.ops._validate import as_rows, check_same_device, check_same_dtype, check_shape, check_tensor
from wavefront.ops.cross_entropy import (
    check_loss_options,
    check_output_options,
    check_target,
    loss_result,
    mean_class_weight,
)
from wavefront.ops.linear_cross_entropy import chunk_tokens, logits_chunks
from wavefront.parallel._agree import check_agreement, fingerprint

__all__ = ["vocab_parallel_cross_entropy", "vocab_parallel_linear_cross_entropy"]


def _stat(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def check_group(op: str, group) -> tuple[int, int]:
    """(rank in group, group size); a clear error when torch.distributed is not set up."""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(f"{op}: torch.distributed is not initialized; call torch.distributed.init_process_group "
                           f"first (one process per shard)")
    if group is not None and not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"{op}: argument 'group' must be a torch.distributed ProcessGroup or None (the default "
                        f"group), got {type(group).__name__}")
    rank = dist.get_rank(group)
    if rank < 0:
        raise ValueError(f"{op}: this process is not a member of argument 'group'")
    return rank, dist.get_world_size(group)


def _shard_stats(logits: Tensor, target: Tensor, class_weight: Tensor | None, options, col_offset: int,
                 n_classes: int, argmax: tuple[Tensor, Tensor] | None = None) -> Tensor:
    ignore_index, label_smoothing, _, softcap = options
    kw = dict(ignore_index=ignore_index, label_smoothing=label_smoothing, softcap=softcap, col_offset=col_offset,
              n_classes=n_classes, argmax=argmax)
    if runtime.uses_triton(logits.device) and logits.dtype != torch.float64:
        from wavefront.kernels import vocab_parallel as kernels  # lazy: Triton-free import

        with op_scope("vocab_parallel_cross_entropy"):
            return kernels.vocab_shard_stats(logits, target, class_weight, **kw)
    return reference.vocab_shard_stats(logits, target, class_weight, **kw)


def _shard_grad_(logits: Tensor, target: Tensor, class_weight: Tensor | None, options, stats: Tensor, scale: Tensor,
                 col_offset: int, n_classes: int, grad: Tensor) -> None:
    """grad <- d(loss rows . scale)/d(logits) for this shard's columns, given the global statistics."""
    ignore_index, label_smoothing, z_loss, softcap = options
    kw = dict(ignore_index=ignore_index, label_smoothing=label_smoothing, z_loss=z_loss, softcap=softcap,
              stats=stats, grad=grad, scale=scale, col_offset=col_offset, n_classes=n_classes)
    if runtime.uses_triton(logits.device) and logits.dtype != torch.float64:
        from wavefront.kernels import cross_entropy as kernels  # lazy: Triton-free import

        with op_scope("vocab_parallel_cross_entropy"):
            kernels.cross_entropy_rows(logits, target, class_weight, **kw)
    else:
        reference.cross_entropy_rows(logits, target, class_weight, **kw)


def _argmax_buffers(rows: Tensor, want: bool) -> tuple[Tensor, Tensor] | None:
    """The shard's (raw maximum, its global column) per row, written by the statistics kernel when asked for."""
    if not want:
        return None
    n = rows.shape[0]
    return (torch.empty(n, dtype=_stat(rows.dtype), device=rows.device),
            torch.empty(n, dtype=torch.int64, device=rows.device))


def _global_loss(local: Tensor, target: Tensor, class_weight: Tensor | None, options, n_classes: int, group,
                 argmax: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor, Tensor | None]:
    """All-reduce the shards' statistics [N, 4]; return the per-row loss [N], the global (m, log s) [N, 2]
    and, given the shards' ``argmax`` (best, column), the predicted tokens [N] (module docstring)."""
    ignore_index, label_smoothing, z_loss, _ = options
    m_local = local[:, 0].contiguous()
    if argmax is None:
        m = m_local.clone()
        dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
    else:
        both = torch.stack([m_local, argmax[0].to(m_local.dtype)], dim=1)
        dist.all_reduce(both, op=dist.ReduceOp.MAX, group=group)
        m, top = both[:, 0], both[:, 1]
        # Ignored rows: every shard wrote (-inf, ignore_index), so the MIN is ignore_index.
        predicted = torch.where(argmax[0] == top, argmax[1], torch.full_like(argmax[1], torch.iinfo(torch.int64).max))
        dist.all_reduce(predicted, op=dist.ReduceOp.MIN, group=group)
    # A shard whose logits are all -inf (masked padding classes) has m_r = -inf and s_r = 0: exp(-inf) = 0.
    rescale = torch.exp(torch.where(m_local == m, torch.zeros_like(m), m_local - m))
    sums = torch.stack([local[:, 1] * rescale, local[:, 2], local[:, 3]], dim=1)
    dist.all_reduce(sums, op=dist.ReduceOp.SUM, group=group)
    log_s = torch.log(sums[:, 0])
    x_t, wx = sums[:, 1], sums[:, 2]
    valid = target != ignore_index
    safe = torch.where(valid, target, torch.zeros_like(target)).clamp(0, n_classes - 1)
    w_t = class_weight.to(m.dtype)[safe] if class_weight is not None else torch.ones_like(m)
    lse = m + log_s
    loss = (1.0 - label_smoothing) * w_t * ((m - x_t) + log_s)
    if label_smoothing:
        w_sum = class_weight.to(m.dtype).sum() if class_weight is not None else float(n_classes)
        loss = loss + label_smoothing * (lse * (w_sum / n_classes) - wx / n_classes)
    if z_loss:
        loss = loss + z_loss * lse * lse
    loss = torch.where(valid, loss, torch.zeros_like(loss))
    return loss, torch.stack([m, log_s], dim=1), None if argmax is None else predicted


class _VocabParallelCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, rows, target, class_weight, options, col_offset, n_classes, group, want_argmax):
        argmax = _argmax_buffers(rows, want_argmax)
        local = _shard_stats(rows, target, class_weight, options, col_offset, n_classes, argmax)
        loss, stats, predicted = _global_loss(local, target, class_weight, options, n_classes, group, argmax)
        ctx.save_for_backward(rows, target, class_weight, stats)
        ctx.args = (options, col_offset, n_classes)
        ctx.mark_non_differentiable(stats)
        if predicted is None:
            return loss, stats
        ctx.mark_non_differentiable(stats, predicted)
        return loss, stats, predicted

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dloss, *_):
        rows, target, class_weight, stats = ctx.saved_tensors
        options, col_offset, n_classes = ctx.args
        grad = torch.empty_like(rows)
        _shard_grad_(rows, target, class_weight, options, stats, dloss.contiguous(), col_offset, n_classes, grad)
        return grad, None, None, None, None, None, None, None


def _options(ignore_index, label_smoothing, z_loss, softcap) -> tuple:
    return int(ignore_index), float(label_smoothing), float(z_loss), None if softcap is None else float(softcap)


def _reduce(loss_rows: Tensor, target: Tensor, ignore_index: int, class_weight, reduction: str, divisor) -> Tensor:
    """The reduction of the per-row losses; a mean by the token count passes class_weight None."""
    denom = (reference.cross_entropy_denominator(target, ignore_index, class_weight, loss_rows.dtype)
             if reduction == "mean" else loss_rows.new_ones(()))  # read by the mean only
    return reference.reduce_loss(loss_rows, denom, reduction, divisor)


def vocab_parallel_cross_entropy(logits: Tensor, target: Tensor, group: dist.ProcessGroup | None = None, *,
                                 ignore_index: int = -100, label_smoothing: float = 0.0, z_loss: float = 0.0,
                                 softcap: float | None = None, weight: Tensor | None = None, reduction: str = "mean",
                                 divisor: Tensor | float | None = None, z_loss_reduction: str = "token",
                                 loss_dtype: torch.dtype | None = None, return_z_loss: bool = False,
                                 return_predicted_tokens: bool = False,
                                 return_token_accuracy: bool = False) -> Tensor | LossOutput:
    """Cross-entropy of the whole vocabulary from this rank's shard ``logits [..., V / P]`` (classes
    ``rank * V / P`` onwards) and the global ``target [...]``, the same on every rank of ``group``.

    Options and result exactly as :func:`wavefront.ops.cross_entropy` over the gathered logits
    (``weight``: the class weights of all V classes); the loss is the same on every rank and the gradient
    reaches only this rank's shard. Two small all-reduces per call (a third, MIN of [N] int64, for the
    predicted tokens and the token accuracy, which are the whole vocabulary's argmax); see the module
    docstring. ``z_loss_reduction``, ``loss_dtype`` and ``return_*``: as :func:`wavefront.ops.cross_entropy`.
    """
    op = "vocab_parallel_cross_entropy"
    check_tensor(op, "logits", logits)
    rank, world = check_group(op, group)
    # Before any check that could fail on some ranks only: every rank raises, or none.
    check_agreement(op, group, logits.device, {
        "rows (logits without its last dim)": logits.numel() // max(logits.shape[-1], 1),
        "shard width (logits.shape[-1])": logits.shape[-1], "target elements": target.numel(),
        "options fingerprint (dtype, ignore_index, label_smoothing, z_loss, softcap, weight, reduction)": fingerprint(
            logits.dtype, ignore_index, label_smoothing, z_loss, softcap, weight is None, reduction)})
    n_local = logits.shape[-1]
    if n_local == 0:
        raise ValueError(f"{op}: argument 'logits' has an empty vocabulary shard (last dim 0)")
    n_classes = n_local * world
    check_target(op, target, tuple(logits.shape[:-1]), n_classes, ignore_index, logits.device,
                 "the shape of 'logits' without its last (vocabulary shard) dim")
    check_loss_options(op, n_classes=n_classes, ignore_index=ignore_index, label_smoothing=label_smoothing,
                       z_loss=z_loss, softcap=softcap, reduction=reduction, divisor=divisor, class_weight=weight,
                       class_weight_name="weight", device=logits.device)
    check_same_device(op, logits=logits, target=target, weight=weight)
    check_output_options(op, z_loss_reduction=z_loss_reduction, loss_dtype=loss_dtype, input_dtype=logits.dtype,
                         return_z_loss=return_z_loss, return_predicted_tokens=return_predicted_tokens,
                         return_token_accuracy=return_token_accuracy)
    options = _options(ignore_index, label_smoothing, z_loss, softcap)
    rows = as_rows(logits)
    flat_target = target.reshape(-1)
    w, by_tokens = mean_class_weight(flat_target, options[0], weight, options[2], reduction, z_loss_reduction)
    w = w.contiguous() if w is not None else None
    want_argmax = return_predicted_tokens or return_token_accuracy
    loss_rows, stats, *predicted = _VocabParallelCE.apply(rows, flat_target, w, options, rank * n_local, n_classes,
                                                          group, want_argmax)
    out = _reduce(loss_rows, flat_target, options[0], None if by_tokens else w, reduction, divisor)
    out = out.view(target.shape) if reduction == "none" else out
    return _result(out, stats, predicted, target, options, weight, reduction, divisor, z_loss_reduction, loss_dtype,
                   return_z_loss, return_predicted_tokens, return_token_accuracy)


def _result(out, stats, predicted, target, options, class_weight, reduction, divisor, z_loss_reduction, loss_dtype,
            return_z_loss, return_predicted_tokens, return_token_accuracy) -> Tensor | LossOutput:
    return loss_result(out, stats, predicted[0] if predicted else None, target, ignore_index=options[0],
                       z_loss=options[2], class_weight=class_weight, reduction=reduction, divisor=divisor,
                       z_loss_reduction=z_loss_reduction, return_z_loss=return_z_loss,
                       return_predicted_tokens=return_predicted_tokens,
                       return_token_accuracy=return_token_accuracy, loss_dtype=loss_dtype)


class _VocabParallelLCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, target, bias, class_weight, options, chunk, col_offset, n_classes, group,
                want_argmax):
        n_tokens = hidden.shape[0]
        local = torch.empty((n_tokens, 4), dtype=_stat(hidden.dtype), device=hidden.device)
        argmax = _argmax_buffers(hidden, want_argmax)
        for start, end, logits in logits_chunks(hidden, weight, bias, chunk):
            part = None if argmax is None else (argmax[0][start:end], argmax[1][start:end])
            local[start:end] = _shard_stats(logits, target[start:end], class_weight, options, col_offset, n_classes,
                                            part)
        del logits  # the chunk buffer, before the collectives
        loss, stats, predicted = _global_loss(local, target, class_weight, options, n_classes, group, argmax)
        ctx.save_for_backward(hidden, weight, target, bias, class_weight, stats)
        ctx.args = (options, chunk, col_offset, n_classes, group)
        ctx.mark_non_differentiable(stats)
        if predicted is None:
            return loss, stats
        ctx.mark_non_differentiable(stats, predicted)
        return loss, stats, predicted

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dloss, *_):
        hidden, weight, target, bias, class_weight, stats = ctx.saved_tensors
        options, chunk, col_offset, n_classes, group = ctx.args
        need_dh, need_dw, _, need_db = ctx.needs_input_grad[:4]
        acc = _stat(hidden.dtype)
        dloss = dloss.to(acc).contiguous()
        # dhidden is a partial sum over this rank's classes: kept in fp32 until the all-reduce has added the
        # ranks' parts, then rounded once.
        dh = torch.empty(hidden.shape, dtype=acc, device=hidden.device) if need_dh else None
        dw = torch.zeros(weight.shape, dtype=acc, device=weight.device) if need_dw else None
        db = torch.zeros(weight.shape[0], dtype=acc, device=weight.device) if need_db else None
        g = None
        for start, end, g in logits_chunks(hidden, weight, bias, chunk):
            h = hidden[start:end]
            _shard_grad_(g, target[start:end], class_weight, options, stats[start:end], dloss[start:end],
                         col_offset, n_classes, g)
            if need_dh:
                dh[start:end] = torch.mm(g, weight)
            if need_dw:
                if g.dtype == acc:
                    dw.addmm_(g.t(), h)
                else:
                    dw.add_(torch.mm(g.t(), h))
            if need_db:
                db.add_(g.sum(0, dtype=acc))
        del g  # the chunk buffer, before the all-reduce
        if need_dh:
            dist.all_reduce(dh, op=dist.ReduceOp.SUM, group=group)
        return (dh.to(hidden.dtype) if need_dh else None, dw.to(weight.dtype) if need_dw else None, None,
                db.to(bias.dtype) if need_db else None, None, None, None, None, None, None, None)


def vocab_parallel_linear_cross_entropy(hidden: Tensor, weight: Tensor, target: Tensor,
                                        group: dist.ProcessGroup | None = None, *, bias: Tensor | None = None,
                                        ignore_index: int = -100, label_smoothing: float = 0.0, z_loss: float = 0.0,
                                        softcap: float | None = None, class_weight: Tensor | None = None,
                                        reduction: str = "mean", divisor: Tensor | float | None = None,
                                        chunk_size: int | None = None, z_loss_reduction: str = "token",
                                        loss_dtype: torch.dtype | None = None, return_z_loss: bool = False,
                                        return_predicted_tokens: bool = False,
                                        return_token_accuracy: bool = False) -> Tensor | LossOutput:
    """``vocab_parallel_cross_entropy(hidden @ weight.T + bias, target, group, ...)`` without the logits.

    hidden [..., H] (the same on every rank of ``group``), weight [V / P, H] (this rank's rows of the LM
    head: classes ``rank * V / P`` onwards), bias [V / P] (its shard), target [...] global class ids.
    Options as :func:`wavefront.ops.linear_cross_entropy` (``class_weight``: all V classes). The hidden
    gradient is all-reduced over ``group`` (each rank's part covers its classes); the weight and bias
    gradients are this rank's shard. ``chunk_size``: rows per chunk (default
    :func:`wavefront.ops.linear_cross_entropy.chunk_tokens` for the shard's width). ``z_loss_reduction``,
    ``loss_dtype`` and ``return_*`` as :func:`vocab_parallel_cross_entropy`.
    """
    op = "vocab_parallel_linear_cross_entropy"
    check_tensor(op, "hidden", hidden)
    rank, world = check_group(op, group)
    n_hidden = hidden.shape[-1]
    check_tensor(op, "weight", weight, ndim=2)
    check_agreement(op, group, hidden.device, {
        "rows (hidden without its last dim)": hidden.numel() // max(n_hidden, 1), "hidden width": n_hidden,
        "shard rows (weight.shape[0])": weight.shape[0], "target elements": target.numel(),
        "options fingerprint (dtypes, bias, ignore_index, label_smoothing, z_loss, softcap, class_weight, "
        "reduction, chunk_size)": fingerprint(hidden.dtype, weight.dtype, bias is None, ignore_index,
                                              label_smoothing, z_loss, softcap, class_weight is None, reduction,
                                              chunk_size)})
    if weight.shape[0] == 0 or weight.shape[1] != n_hidden:
        raise ValueError(f"{op}: argument 'weight' must have shape [vocab / {world}, {n_hidden}] (this rank's rows "
                         f"of the LM head; the last dim of 'hidden'), got {tuple(weight.shape)}")
    if torch.is_autocast_enabled(hidden.device.type):
        cast = torch.get_autocast_dtype(hidden.device.type)
        hidden, weight = hidden.to(cast), weight.to(cast)
        bias = bias.to(cast) if bias is not None else None
    check_same_dtype(op, hidden=hidden, weight=weight)
    n_local = weight.shape[0]
    n_classes = n_local * world
    if bias is not None:
        check_tensor(op, "bias", bias, ndim=1)
        check_shape(op, "bias", bias, (n_local,), "the first dim of 'weight': this rank's bias shard")
        check_same_dtype(op, hidden=hidden, bias=bias)
    check_same_device(op, hidden=hidden, weight=weight, bias=bias)
    check_target(op, target, tuple(hidden.shape[:-1]), n_classes, ignore_index, hidden.device,
                 "the shape of 'hidden' without its last dim")
    check_loss_options(op, n_classes=n_classes, ignore_index=ignore_index, label_smoothing=label_smoothing,
                       z_loss=z_loss, softcap=softcap, reduction=reduction, divisor=divisor,
                       class_weight=class_weight, class_weight_name="class_weight", device=hidden.device)
    if chunk_size is not None and (isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1):
        raise ValueError(f"{op}: argument 'chunk_size' must be a positive int or None, got {chunk_size!r}")
    check_output_options(op, z_loss_reduction=z_loss_reduction, loss_dtype=loss_dtype, input_dtype=hidden.dtype,
                         return_z_loss=return_z_loss, return_predicted_tokens=return_predicted_tokens,
                         return_token_accuracy=return_token_accuracy)
    options = _options(ignore_index, label_smoothing, z_loss, softcap)
    rows = hidden.reshape(-1, n_hidden)
    flat_target = target.reshape(-1)
    n_tokens = rows.shape[0]
    free = torch.cuda.mem_get_info(hidden.device)[0] if hidden.device.type == "cuda" else None
    chunk = chunk_size or chunk_tokens(max(n_tokens, 1), n_local, hidden.element_size(), free)
    w, by_tokens = mean_class_weight(flat_target, options[0], class_weight, options[2], reduction, z_loss_reduction)
    w = w.contiguous() if w is not None else None
    want_argmax = return_predicted_tokens or return_token_accuracy
    if n_tokens == 0:
        loss_rows = rows.sum(-1, dtype=_stat(rows.dtype)) + weight.sum() * 0  # an empty, differentiable [0]
        stats = rows.new_zeros((0, 2), dtype=loss_rows.dtype)
        predicted = [flat_target.new_zeros(0, dtype=torch.int64)] if want_argmax else []
    else:
        loss_rows, stats, *predicted = _VocabParallelLCE.apply(rows, weight, flat_target, bias, w, options, chunk,
                                                               rank * n_local, n_classes, group, want_argmax)
    out = _reduce(loss_rows, flat_target, options[0], None if by_tokens else w, reduction, divisor)
    out = out.view(target.shape) if reduction == "none" else out
    return _result(out, stats, predicted, target, options, class_weight, reduction, divisor, z_loss_reduction,
                   loss_dtype, return_z_loss, return_predicted_tokens, return_token_accuracy)
