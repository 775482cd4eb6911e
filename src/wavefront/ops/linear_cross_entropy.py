"""The LM-head loss without the [tokens x vocab] logits: chunked matmul + fused cross-entropy.

Per chunk of C tokens (rows a..b of hidden [N, H]; weight [V, H]):

    logits_c = hidden[a:b] @ weight^T (+ bias)                   one GEMM into a reused [C, V] buffer
    loss, stats, g_c = CE kernel (loss and gradient in one launch; g_c overwrites the buffer in place,
                       scaled by the reduction's 1/denominator)
    dhidden[a:b]  = g_c @ weight                                 one GEMM, no cross-chunk accumulation
    dweight      += g_c^T @ hidden[a:b]                          fp32 accumulator for 16-bit weights
    dbias        += sum_rows g_c                                 fp32

dweight by vocabulary slices: for 16-bit weights the cross-chunk accumulation needs an fp32 [V, H]
accumulator and a [V, H] product per chunk (6 V H bytes: 3 GiB at V = 128k, H = 4096, more than the
logits themselves). When that exceeds DWEIGHT_ACCUMULATOR_MAX_BYTES (:func:`dweight_by_slices`), the token
chunks compute only the loss, the statistics, dhidden and dbias, and a second loop over slices of S
vocabulary rows (:func:`slice_columns`, the same buffer budget) recomputes each slice's logits for all
tokens and writes its dweight rows once:

    logits_s = hidden @ weight[s]^T (+ bias[s])                  [N, S] buffer, reused
    g_s      = CE kernel, backward mode on a column slice (the saved statistics make every column's
               probability known without the rest of the row)
    dweight[s] = g_s^T @ hidden                                  one GEMM per slice, fp32 accumulation inside,
                                                                 rounded once to the weight's dtype (as eager)

FLOPs: 6 N V H, the same as eager matmul + cross-entropy + its backward; nothing is recomputed for the
mean and sum reductions, except that the dweight-by-slices path recomputes the logits once (8 N V H).
The forward leaves dhidden/dweight/dbias computed for an upstream gradient of 1; the backward multiplies
them in place by the actual (scalar) upstream gradient and hands them out, once: a second backward
through the same graph (retain_graph=True) raises. reduction="none" has a per-row upstream gradient, so its
forward computes only loss and statistics and its backward re-runs the chunks (one more logits GEMM:
8 N V H in total; 10 N V H with dweight by slices).

Chunk size (tokens), :func:`chunk_tokens`: the largest power of two whose logits buffer fits
``min(CHUNK_BUDGET_BYTES, free_device_bytes / FREE_MEMORY_DIVISOR)`` bytes, at least MIN_CHUNK_TOKENS and
at most the number of tokens. At vocab 128,256: 512 tokens in bf16 (125 MiB), 256 in fp32.

Peak extra memory (beyond inputs), mean/sum reductions: the chunk buffer C x V, the outputs dhidden
(N x H) and dweight (V x H; in fp32 for 16-bit weights only while 6 V H bytes stay under
DWEIGHT_ACCUMULATOR_MAX_BYTES, otherwise in the weight's dtype through the slices), per-row loss and
statistics (12 B per token). Eager holds the logits, their fp32 copy or log-softmax, and their gradient: several
N x V tensors. Measured numbers: docs/kernels-loss-pointwise.md.

Sharded weights (FSDP2, ZeRO-3): the op needs the whole [V, H] weight. Call it where the weight is
gathered (inside the FSDP2 root module's forward, or after ``module.unshard()``); a DTensor or an empty
(ZeRO-3 partitioned) weight is rejected with a message saying so. The returned dweight is the full
gradient; FSDP2's hooks reduce-scatter it like any other parameter gradient.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor

from wavefront import reference, runtime
from wavefront.kernels._heuristics import stat_dtype
from wavefront.kernels._scope import op_scope
from wavefront.ops._rows import randn
from wavefront.ops._spec import Case, Mode, OpInputs, OpSpec, itemsize
from wavefront.ops._validate import check_same_device, check_same_dtype, check_shape, check_tensor
from wavefront.ops.cross_entropy import (
    RETURN_ALL,
    LossOutput,
    check_loss_options,
    check_output_options,
    check_target,
    loss_result,
    mean_class_weight,
    predicted_bytes,
    reference_rows,
)
from wavefront.shapes import MODELS

#: Upper bound on the chunk's logits buffer. 128 MiB keeps it at 1/16 of the full bf16 logits at 8k tokens
#: and vocab 128k while each chunk's GEMM (512 x H x 128k) stays large enough to run at full rate.
CHUNK_BUDGET_BYTES = 128 * 2**20
#: The chunk buffer never takes more than this fraction of the device's free memory.
FREE_MEMORY_DIVISOR = 8
#: Below 16 rows a GEMM tile is mostly padding.
MIN_CHUNK_TOKENS = 16
#: 16-bit weights: above this many bytes of fp32 dweight accumulator + per-chunk product (6 V H), dweight is
#: computed by vocabulary slices (one more logits GEMM) instead of accumulated across token chunks.
DWEIGHT_ACCUMULATOR_MAX_BYTES = CHUNK_BUDGET_BYTES
#: Vocabulary rows per dweight slice: a multiple of this (GEMM-friendly), at least this many.
SLICE_ALIGN = 128


def chunk_tokens(n_tokens: int, vocab: int, itemsize: int, free_bytes: int | None = None) -> int:
    """Tokens per chunk (see the module docstring); a pure function of its arguments."""
    if n_tokens < 1 or vocab < 1 or itemsize < 1:
        raise ValueError(f"chunk_tokens: n_tokens, vocab and itemsize must be >= 1, got {n_tokens}, {vocab}, "
                         f"{itemsize}")
    budget = CHUNK_BUDGET_BYTES
    if free_bytes is not None:
        budget = min(budget, free_bytes // FREE_MEMORY_DIVISOR)
    fit = max(1, budget // (vocab * itemsize))
    return min(n_tokens, max(MIN_CHUNK_TOKENS, 1 << (fit.bit_length() - 1)))


def dweight_by_slices(vocab: int, hidden: int, dtype: torch.dtype) -> bool:
    """Whether dweight is computed by vocabulary slices (module docstring); a pure function."""
    if dtype in (torch.float32, torch.float64):
        return False  # the accumulator is the output itself: addmm_ in place, nothing extra
    return 6 * vocab * hidden > DWEIGHT_ACCUMULATOR_MAX_BYTES


def slice_columns(n_tokens: int, vocab: int, itemsize: int, free_bytes: int | None = None) -> int:
    """Vocabulary rows per dweight slice: the [n_tokens, S] logits buffer within the chunk budget."""
    budget = CHUNK_BUDGET_BYTES
    if free_bytes is not None:
        budget = min(budget, free_bytes // FREE_MEMORY_DIVISOR)
    fit = budget // max(1, n_tokens * itemsize) // SLICE_ALIGN * SLICE_ALIGN
    return min(vocab, max(SLICE_ALIGN, fit))


def logits_chunks(hidden: Tensor, weight: Tensor, bias: Tensor | None, chunk: int) -> Iterator[tuple[int, int, Tensor]]:
    """``(start, end, logits)`` for each chunk of `chunk` rows of hidden [N, H]: ``logits = hidden[start:end] @
    weight^T (+ bias)`` [end - start, V], written into one [min(chunk, N), V] buffer reused by every chunk (so a
    chunk's logits are valid until the next one is drawn; the caller may overwrite them, e.g. with their
    gradient). The buffer is freed when the iteration ends and the caller drops its last chunk. Shared by
    :func:`linear_cross_entropy` and ``wavefront.parallel.vocab_parallel_linear_cross_entropy``."""
    n_tokens = hidden.shape[0]
    buf = torch.empty((min(chunk, n_tokens), weight.shape[0]), dtype=hidden.dtype, device=hidden.device)
    for start in range(0, n_tokens, chunk):
        end = min(start + chunk, n_tokens)
        logits = buf[: end - start]
        if bias is None:
            torch.mm(hidden[start:end], weight.t(), out=logits)
        else:
            torch.addmm(bias, hidden[start:end], weight.t(), out=logits)
        yield start, end, logits


def _dw_dtype(weight: Tensor) -> torch.dtype:
    if dweight_by_slices(weight.shape[0], weight.shape[1], weight.dtype):
        return weight.dtype
    return _acc_dtype(weight.dtype)


def _free_bytes(device: torch.device) -> int | None:
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    return None


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return dtype if dtype in (torch.float32, torch.float64) else torch.float32


def _stat(dtype: torch.dtype) -> torch.dtype:
    return stat_dtype(dtype)


def _rows_ce(logits, target, class_weight, options, stats=None, grad=None, scale=None, col_offset=0,
             n_classes=None, argmax=None):
    """The per-chunk cross-entropy: the Triton kernel, or its row-wise PyTorch twin on cpu-reference."""
    ignore_index, label_smoothing, z_loss, softcap = options
    kw = dict(ignore_index=ignore_index, label_smoothing=label_smoothing, z_loss=z_loss, softcap=softcap,
              stats=stats, grad=grad, scale=scale, col_offset=col_offset, n_classes=n_classes, argmax=argmax)
    if runtime.uses_triton(logits.device):
        from wavefront.kernels import cross_entropy as kernels  # lazy: Triton-free import

        with op_scope("linear_cross_entropy"):
            return kernels.cross_entropy_rows(logits, target, class_weight, **kw)
    return reference.cross_entropy_rows(logits, target, class_weight, **kw)


def _addmm_acc_(acc: Tensor, a: Tensor, b: Tensor) -> None:
    """acc += a @ b with acc in fp32 (or the inputs' own dtype)."""
    if a.dtype == acc.dtype:
        acc.addmm_(a, b)
    else:
        # 16-bit inputs, fp32 accumulator: round each chunk's product once, sum in fp32.
        acc.add_(torch.mm(a, b))


def _chunked(hidden, weight, target, bias, class_weight, options, chunk, scale, stats_in,
             need_dh: bool, need_dw: bool, need_db: bool, argmax: Tensor | None = None):
    """Run the chunks. stats_in None: forward (loss and statistics, and gradients if any are needed; the
    predicted tokens into ``argmax`` [N] when given, in the same read of each chunk's logits); given:
    backward of reduction="none" (gradients only, scale per row)."""
    n_tokens, _ = hidden.shape
    vocab = weight.shape[0]
    slices = need_dw and dweight_by_slices(vocab, weight.shape[1], weight.dtype)
    chunk_dw = need_dw and not slices
    want_grad = need_dh or chunk_dw or need_db
    dh = torch.empty_like(hidden) if need_dh else None
    dw = torch.zeros(weight.shape, dtype=_acc_dtype(weight.dtype), device=weight.device) if chunk_dw else None
    db = torch.zeros(vocab, dtype=_stat(hidden.dtype), device=hidden.device) if need_db else None
    losses, stats = [], []
    logits = None
    for start, end, logits in logits_chunks(hidden, weight, bias, chunk):
        h = hidden[start:end]
        row_scale = scale if scale.dim() == 0 else scale[start:end]
        chunk_stats = None if stats_in is None else stats_in[start:end]
        loss_c, stats_c = _rows_ce(logits, target[start:end], class_weight, options, stats=chunk_stats,
                                   grad=logits if want_grad else None, scale=row_scale,
                                   argmax=None if argmax is None else argmax[start:end])
        losses.append(loss_c)
        stats.append(stats_c)
        if need_dh:
            torch.mm(logits, weight, out=dh[start:end])
        if chunk_dw:
            _addmm_acc_(dw, logits.t(), h)
        if need_db:
            db.add_(logits.sum(0, dtype=db.dtype))
    loss_rows = torch.cat(losses) if stats_in is None else None
    stats_all = torch.cat(stats) if stats_in is None else stats_in
    if slices:
        del logits  # the chunk buffer is not needed by the slices, which bring their own
        dw = _dweight_slices(hidden, weight, target, bias, class_weight, options, stats_all, scale)
    return loss_rows, stats_all, dh, dw, db


def _dweight_slices(hidden, weight, target, bias, class_weight, options, stats, scale) -> Tensor:
    """dweight by vocabulary slices (module docstring), in the weight's dtype."""
    n_tokens = hidden.shape[0]
    vocab = weight.shape[0]
    cols = slice_columns(n_tokens, vocab, hidden.element_size(), _free_bytes(hidden.device))
    dw = torch.empty_like(weight)
    flat = torch.empty(n_tokens * cols, dtype=hidden.dtype, device=hidden.device)
    for start in range(0, vocab, cols):
        end = min(start + cols, vocab)
        logits = flat[: n_tokens * (end - start)].view(n_tokens, end - start)
        if bias is None:
            torch.mm(hidden, weight[start:end].t(), out=logits)
        else:
            torch.addmm(bias[start:end], hidden, weight[start:end].t(), out=logits)
        _rows_ce(logits, target, class_weight, options, stats=stats, grad=logits, scale=scale, col_offset=start,
                 n_classes=vocab)
        torch.mm(logits.t(), hidden, out=dw[start:end])
    return dw


def _empty(t: Tensor, dtype=None) -> Tensor:
    return t.new_empty(0, dtype=dtype)


def _argmax_out(hidden: Tensor, want: bool) -> Tensor:
    """The predicted-token output: [N] int64 when asked for, else an empty placeholder."""
    return hidden.new_empty(hidden.shape[0] if want else 0, dtype=torch.int64)


def _denominator(target, class_weight, ignore_index, reduction, divisor, divisor_value, stat, device) -> Tensor:
    """What the summed loss is divided by (a 0-d device tensor, no host sync): the non-ignored count or
    class weight for mean (1 when it is 0: an all-ignored batch gives loss 0), the divisor for sum. A mean
    by the token count passes class_weight None."""
    if reduction == "mean":
        denom = reference.cross_entropy_denominator(target, ignore_index, class_weight, stat)
        return torch.where(denom > 0, denom, torch.ones_like(denom))
    if divisor is not None:
        return divisor.to(device=device, dtype=stat).reshape(())
    return torch.full((), divisor_value, dtype=stat, device=device)


@torch.library.custom_op("wavefront::linear_cross_entropy_fwd", mutates_args=())
def _lce_fwd(hidden: Tensor, weight: Tensor, target: Tensor, bias: Tensor | None, class_weight: Tensor | None,
             divisor: Tensor | None, divisor_value: float, ignore_index: int, label_smoothing: float, z_loss: float,
             softcap: float | None, reduction: str, chunk_size: int, need_dh: bool, need_dw: bool,
             need_db: bool, mean_by_tokens: bool, want_argmax: bool) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor,
                                                                              Tensor]:
    options = (ignore_index, label_smoothing, z_loss, softcap)
    chunk = chunk_size or chunk_tokens(hidden.shape[0], weight.shape[0], hidden.element_size(),
                                       _free_bytes(hidden.device))
    stat = _stat(hidden.dtype)
    grads = reduction != "none" and (need_dh or need_dw or need_db)
    denom = None
    if reduction != "none":
        # The reduction's denominator needs only the targets: the gradient's scale is known before the chunks.
        denom = _denominator(target, None if mean_by_tokens else class_weight, ignore_index, reduction, divisor,
                             divisor_value, stat, hidden.device)
    scale = 1.0 / denom if grads else torch.ones((), dtype=stat, device=hidden.device)
    argmax = _argmax_out(hidden, want_argmax)
    loss_rows, stats, dh, dw, db = _chunked(hidden, weight, target, bias, class_weight, options, chunk, scale, None,
                                            grads and need_dh, grads and need_dw, grads and need_db,
                                            argmax if want_argmax else None)
    loss = loss_rows if denom is None else loss_rows.sum() / denom
    return (loss, stats, _empty(hidden) if dh is None else dh, _empty(hidden, stat) if dw is None else dw,
            _empty(hidden, stat) if db is None else db, argmax)


@_lce_fwd.register_fake
def _(hidden, weight, target, bias, class_weight, divisor, divisor_value, ignore_index, label_smoothing, z_loss,
      softcap, reduction, chunk_size, need_dh, need_dw, need_db, mean_by_tokens, want_argmax):
    stat = _stat(hidden.dtype)
    n_tokens = hidden.shape[0]
    grads = reduction != "none"
    loss = hidden.new_empty(n_tokens, dtype=stat) if reduction == "none" else hidden.new_empty((), dtype=stat)
    dh = torch.empty_like(hidden) if grads and need_dh else _empty(hidden)
    dw = hidden.new_empty(weight.shape, dtype=_dw_dtype(weight)) if grads and need_dw else _empty(hidden, stat)
    db = hidden.new_empty(weight.shape[0], dtype=stat) if grads and need_db else _empty(hidden, stat)
    return loss, hidden.new_empty((n_tokens, 2), dtype=stat), dh, dw, db, _argmax_out(hidden, want_argmax)


@torch.library.custom_op("wavefront::linear_cross_entropy_bwd", mutates_args=())
def _lce_bwd(dloss: Tensor, hidden: Tensor, weight: Tensor, target: Tensor, bias: Tensor | None,
             class_weight: Tensor | None, stats: Tensor, ignore_index: int, label_smoothing: float, z_loss: float,
             softcap: float | None, chunk_size: int, need_dh: bool, need_dw: bool,
             need_db: bool) -> tuple[Tensor, Tensor, Tensor]:
    options = (ignore_index, label_smoothing, z_loss, softcap)
    chunk = chunk_size or chunk_tokens(hidden.shape[0], weight.shape[0], hidden.element_size(),
                                       _free_bytes(hidden.device))
    stat = _stat(hidden.dtype)
    _, _, dh, dw, db = _chunked(hidden, weight, target, bias, class_weight, options, chunk, dloss.to(stat), stats,
                                need_dh, need_dw, need_db)
    return (_empty(hidden) if dh is None else dh, _empty(hidden, stat) if dw is None else dw,
            _empty(hidden, stat) if db is None else db)


@_lce_bwd.register_fake
def _(dloss, hidden, weight, target, bias, class_weight, stats, ignore_index, label_smoothing, z_loss, softcap,
      chunk_size, need_dh, need_dw, need_db):
    stat = _stat(hidden.dtype)
    return (torch.empty_like(hidden) if need_dh else _empty(hidden),
            hidden.new_empty(weight.shape, dtype=_dw_dtype(weight)) if need_dw else _empty(hidden, stat),
            hidden.new_empty(weight.shape[0], dtype=stat) if need_db else _empty(hidden, stat))


def _setup_context(ctx, inputs, output):
    (hidden, weight, target, bias, class_weight, divisor, divisor_value, ignore_index, label_smoothing, z_loss,
     softcap, reduction, chunk_size, need_dh, need_dw, need_db, _, _) = inputs
    loss, stats, dh, dw, db, argmax = output
    ctx.reduction = reduction
    ctx.needs = (need_dh, need_dw, need_db)
    ctx.dtypes = (hidden.dtype, weight.dtype, None if bias is None else bias.dtype)
    ctx.options = (ignore_index, label_smoothing, z_loss, softcap)
    ctx.chunk_size = chunk_size
    ctx.grads_handed_out = False
    if reduction == "none":
        ctx.save_for_backward(hidden, weight, target, bias, class_weight, stats)
    else:
        ctx.save_for_backward(dh, dw, db)
    ctx.mark_non_differentiable(stats, dh, dw, db, argmax)
    # Without this, autograd would allocate zero "gradients" for the unused dh/dweight outputs in the
    # backward: an N x H and a V x H (fp32) tensor for nothing.
    ctx.set_materialize_grads(False)


def _backward(ctx, dloss, dstats, d_dh, d_dw, d_db, d_argmax):
    need_dh, need_dw, need_db = ctx.needs
    h_dtype, w_dtype, b_dtype = ctx.dtypes
    if ctx.reduction == "none":
        hidden, weight, target, bias, class_weight, stats = ctx.saved_tensors
        dh, dw, db = torch.ops.wavefront.linear_cross_entropy_bwd(dloss, hidden, weight, target, bias, class_weight,
                                                                 stats, *ctx.options, ctx.chunk_size, need_dh,
                                                                 need_dw, need_db)
    else:
        if ctx.grads_handed_out:
            raise RuntimeError("linear_cross_entropy: backward ran a second time through the same graph "
                               "(retain_graph=True): the mean/sum reductions compute their gradients in forward "
                               "and hand them out once. Recompute the loss, or use reduction='none', whose "
                               "backward recomputes them.")
        ctx.grads_handed_out = True
        dh, dw, db = ctx.saved_tensors
        # Scaled in place: a scaled copy would hold a second [V, H] dweight at the peak.
        for grad in (dh, dw, db):
            grad.mul_(dloss)
    return (dh.to(h_dtype) if need_dh else None, dw.to(w_dtype) if need_dw else None, None,
            db.to(b_dtype) if need_db else None, None, None, None, None, None, None, None, None, None, None, None,
            None, None, None)


_lce_fwd.register_autograd(_backward, setup_context=_setup_context)


def _check_weight_is_whole(op: str, weight, n_hidden: int) -> None:
    try:
        from torch.distributed.tensor import DTensor  # lazy: torch submodule on use
    except ImportError:  # a torch build without distributed support
        DTensor = ()
    if isinstance(weight, DTensor):
        raise TypeError(f"{op}: argument 'weight' is a DTensor (placements {tuple(weight.placements)}): the loss "
                        f"needs the whole [vocab, hidden] weight. Call it where the weight is gathered (inside the "
                        f"FSDP2 root module's forward, or after module.unshard()) or pass weight.full_tensor().")
    check_tensor(op, "weight", weight)
    if weight.dim() != 2 or weight.shape[0] == 0 or weight.shape[1] != n_hidden:
        raise ValueError(f"{op}: argument 'weight' must have shape [vocab, {n_hidden}] (the last dim of 'hidden'), "
                         f"got {tuple(weight.shape)}; an empty weight is a ZeRO-3/FSDP shard outside its gather "
                         f"context: gather the lm_head weight first")


def linear_cross_entropy(hidden: Tensor, weight: Tensor, target: Tensor, *, bias: Tensor | None = None,
                         ignore_index: int = -100, label_smoothing: float = 0.0, z_loss: float = 0.0,
                         softcap: float | None = None, class_weight: Tensor | None = None, reduction: str = "mean",
                         divisor: Tensor | float | None = None, chunk_size: int | None = None,
                         z_loss_reduction: str = "token", loss_dtype: torch.dtype | None = None,
                         return_z_loss: bool = False, return_predicted_tokens: bool = False,
                         return_token_accuracy: bool = False) -> Tensor | LossOutput:
    """``cross_entropy(hidden @ weight.T + bias, target, ...)`` without materializing the logits.

    hidden [..., H] (the final hidden states, already shifted for causal LM), weight [V, H] (the lm_head
    weight, whole), target [...] integers. Options as :func:`wavefront.ops.cross_entropy` (class weights are
    ``class_weight`` here); ``softcap`` is Gemma 2's final-logit softcapping. Gradient accumulation as in
    Hugging Face: ``reduction="sum", divisor=num_items_in_batch`` (a number or a device tensor).
    ``chunk_size`` overrides the tokens per chunk (default: :func:`chunk_tokens`).
    Under autocast the matmul operands are cast to the autocast dtype first, as F.linear's would be;
    otherwise hidden, weight and bias must share a dtype.
    Returns the fp32 loss (fp64 for fp64 inputs; ``loss_dtype=hidden.dtype`` rounds it to the input's
    dtype); shape ``target.shape`` for reduction="none". ``z_loss_reduction`` and the ``return_*`` options as
    :func:`wavefront.ops.cross_entropy`: a :class:`~wavefront.ops.LossOutput` with the z-loss term, the
    predicted token per position (argmax of each chunk's logits in the kernel's online pass, before the
    gradient overwrites them) and the token accuracy; none of them reads the weight or the logits again.
    """
    op = "linear_cross_entropy"
    check_tensor(op, "hidden", hidden)
    n_hidden = hidden.shape[-1]
    _check_weight_is_whole(op, weight, n_hidden)
    if torch.is_autocast_enabled(hidden.device.type):
        cast = torch.get_autocast_dtype(hidden.device.type)
        hidden, weight = hidden.to(cast), weight.to(cast)
        bias = bias.to(cast) if bias is not None else None
    check_same_dtype(op, hidden=hidden, weight=weight)
    vocab = weight.shape[0]
    if bias is not None:
        check_tensor(op, "bias", bias, ndim=1)
        check_shape(op, "bias", bias, (vocab,), "the first dim of 'weight'")
        check_same_dtype(op, hidden=hidden, bias=bias)
    check_same_device(op, hidden=hidden, weight=weight, bias=bias)
    check_target(op, target, tuple(hidden.shape[:-1]), vocab, ignore_index, hidden.device,
                 "the shape of 'hidden' without its last dim")
    check_loss_options(op, n_classes=vocab, ignore_index=ignore_index, label_smoothing=label_smoothing,
                       z_loss=z_loss, softcap=softcap, reduction=reduction, divisor=divisor,
                       class_weight=class_weight, class_weight_name="class_weight", device=hidden.device)
    if chunk_size is not None and (isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1):
        raise ValueError(f"{op}: argument 'chunk_size' must be a positive int or None, got {chunk_size!r}")
    check_output_options(op, z_loss_reduction=z_loss_reduction, loss_dtype=loss_dtype, input_dtype=hidden.dtype,
                         return_z_loss=return_z_loss, return_predicted_tokens=return_predicted_tokens,
                         return_token_accuracy=return_token_accuracy)
    result = dict(ignore_index=int(ignore_index), z_loss=float(z_loss), class_weight=class_weight, reduction=reduction,
                  divisor=divisor, z_loss_reduction=z_loss_reduction, return_z_loss=return_z_loss,
                  return_predicted_tokens=return_predicted_tokens, return_token_accuracy=return_token_accuracy,
                  loss_dtype=loss_dtype)
    flat_target = target.reshape(-1)
    if hidden.numel() == 0:
        loss = reference.linear_cross_entropy(hidden, weight, target, bias=bias, ignore_index=ignore_index,
                                              label_smoothing=label_smoothing, z_loss=z_loss, softcap=softcap,
                                              class_weight=class_weight, reduction=reduction, divisor=divisor,
                                              z_loss_reduction=z_loss_reduction)
        stats = predicted = None
        if return_z_loss or return_predicted_tokens or return_token_accuracy:  # no rows, or hidden size 0
            logits = torch.nn.functional.linear(hidden, weight, bias).detach().reshape(-1, vocab)
            stats, predicted = reference_rows(logits, flat_target, int(ignore_index), softcap)
        return loss_result(loss, stats, predicted, target, **result)
    grad_on = torch.is_grad_enabled()
    needs = (grad_on and hidden.requires_grad, grad_on and weight.requires_grad,
             grad_on and bias is not None and bias.requires_grad)
    divisor_tensor = divisor if isinstance(divisor, torch.Tensor) else None
    divisor_value = float(divisor) if divisor is not None and divisor_tensor is None else 1.0
    w, by_tokens = mean_class_weight(flat_target, int(ignore_index), class_weight, float(z_loss), reduction,
                                     z_loss_reduction)
    loss, stats, _, _, _, predicted = torch.ops.wavefront.linear_cross_entropy_fwd(
        hidden.reshape(-1, n_hidden), weight, flat_target, bias, w.contiguous() if w is not None else None,
        divisor_tensor, divisor_value, int(ignore_index), float(label_smoothing), float(z_loss),
        None if softcap is None else float(softcap), reduction, chunk_size or 0, *needs, by_tokens,
        return_predicted_tokens or return_token_accuracy)
    loss = loss.view(target.shape) if reduction == "none" else loss
    return loss_result(loss, stats, predicted, target, **result)


# ---------------------------------------------------------------------------------------------------
# Registry entry. Dims: n_rows tokens, n_cols vocabulary, hidden H. Small chunk sizes in the cases make
# the CPU runs cross several chunk boundaries.


def _inputs(case: Case, dtype, device, gen) -> OpInputs:
    opts = dict(case.options)
    n_tokens, vocab, n_hidden = case.dims["n_rows"], case.dims["n_cols"], case.dims["hidden"]
    hidden = randn((n_tokens, n_hidden), dtype, device, gen)
    weight = randn((vocab, n_hidden), dtype, device, gen, scale=n_hidden ** -0.5 * opts.pop("logit_scale", 2.0))
    target = torch.randint(0, vocab, (n_tokens,), generator=gen)
    target = torch.where(torch.rand(n_tokens, generator=gen) < 0.125, torch.full_like(target, -100), target)
    args = [hidden, weight, target.to(device)]
    grad_argnums = (0, 1)
    if opts.pop("with_bias", False):
        opts["bias"] = randn((vocab,), dtype, device, gen, scale=0.5)
    if opts.pop("class_weight", False):
        opts["class_weight"] = randn((vocab,), torch.float32, device, gen).abs() + 0.1
    return OpInputs(tuple(args), opts, grad_argnums)


def _flops(case: Case, mode: Mode) -> float:
    n, v, h = case.dims["n_rows"], case.dims["n_cols"], case.dims["hidden"]
    # fwd: the logits GEMM and the cross-entropy; bwd: the dhidden and dweight GEMMs.
    return 2 * n * v * h + 5 * n * v if mode == "fwd" else 4 * n * v * h + 4 * n * v


def _bytes(case: Case, dtype: torch.dtype, mode: Mode) -> int:
    # The logits never reach memory at the minimum: read hidden, weight and targets; write the loss
    # (fwd) or dhidden and dweight (bwd).
    n, v, h = case.dims["n_rows"], case.dims["n_cols"], case.dims["hidden"]
    e = itemsize(dtype)
    if mode == "fwd":
        return (n * h + v * h) * e + 8 * n + 4 + predicted_bytes(case, mode)
    return 2 * (n * h + v * h) * e + 8 * n


def _bench(name: str, model: str, n_tokens: int, options: dict | None = None) -> Case:
    m = MODELS[model]
    return Case(name, f"{model}: {n_tokens} tokens, hidden {m.hidden}, vocab {m.vocab}",
                {"n_rows": n_tokens, "n_cols": m.vocab, "hidden": m.hidden}, dict(options or {}))


SPECS = (
    OpSpec(
        name="linear_cross_entropy",
        fn=linear_cross_entropy,
        reference=reference.linear_cross_entropy,
        make_inputs=_inputs,
        cases=(
            Case("one_chunk", "all tokens in one chunk", {"n_rows": 24, "n_cols": 500, "hidden": 32}),
            Case("chunks", "5 chunks of 16 with a ragged last one: dweight accumulates across chunks",
                 {"n_rows": 70, "n_cols": 1000, "hidden": 48}, {"chunk_size": 16}),
            Case("bias_softcap", "lm_head bias and Gemma 2 softcap 30", {"n_rows": 40, "n_cols": 700, "hidden": 32},
                 {"chunk_size": 16, "with_bias": True, "softcap": 30.0, "logit_scale": 20.0}),
            Case("sum_divisor", "reduction sum with a gradient-accumulation divisor",
                 {"n_rows": 40, "n_cols": 600, "hidden": 32}, {"chunk_size": 16, "reduction": "sum", "divisor": 57.0}),
            Case("none", "reduction none: the backward re-runs the chunks with per-row gradients",
                 {"n_rows": 40, "n_cols": 600, "hidden": 32}, {"chunk_size": 16, "reduction": "none"}),
            Case("options", "smoothing, z-loss and class weights through the chunks",
                 {"n_rows": 40, "n_cols": 600, "hidden": 32},
                 {"chunk_size": 16, "label_smoothing": 0.1, "z_loss": 1e-3, "class_weight": True}),
            Case("wide_vocab", "a 40k vocabulary: the CE kernel loops over blocks inside each chunk",
                 {"n_rows": 8, "n_cols": 40000, "hidden": 16}, {"chunk_size": 4}),
            Case("outputs", "z-loss term, predicted tokens and accuracy through the chunks; PaLM z-loss, weights",
                 {"n_rows": 40, "n_cols": 600, "hidden": 32},
                 {"chunk_size": 16, "z_loss": 1e-3, "class_weight": True, "softcap": 30.0, "logit_scale": 20.0,
                  **RETURN_ALL}),
            Case("outputs_none", "the same with reduction none: per-row z-loss terms",
                 {"n_rows": 40, "n_cols": 600, "hidden": 32},
                 {"chunk_size": 16, "z_loss": 1e-3, "reduction": "none", **RETURN_ALL}),
        ),
        bench_cases=(
            _bench("llama3-8b_8k", "llama3-8b", 8192),
            _bench("qwen2.5-7b_8k", "qwen2.5-7b", 8192),
            _bench("gemma2-9b_8k", "gemma2-9b", 8192),
            _bench("llama3-8b_8k_outputs", "llama3-8b", 8192, {"z_loss": 1e-4, **RETURN_ALL}),
        ),
        flops=_flops,
        min_bytes=_bytes,
        description="LM-head matmul + cross-entropy in token chunks; the full logits never exist",
    ),
)
