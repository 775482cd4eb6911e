"""Plain PyTorch references for every op: float64-capable, differentiable, importable without Triton.

Each reference computes in the dtype of its inputs' promotion with fp32 as the floor for 16-bit inputs
(the way Hugging Face models compute these ops), so it serves three roles:

- called on float64 inputs it is the ground truth that tests and ``wavefront bench`` compare against;
- called on the original 16-bit/fp32 inputs it is "eager PyTorch in the same dtype", the baseline
  whose error sets each op's tolerance (see wavefront.ops._spec.Tolerance);
- on a CPU without the Triton interpreter the ops fall back to it (backend "cpu-reference").
"""

from __future__ import annotations

import math

import torch


def _compute_dtype(*tensors: torch.Tensor | None) -> torch.dtype:
    dtypes = [t.dtype for t in tensors if t is not None and t.is_floating_point()]
    out = dtypes[0]
    for d in dtypes[1:]:
        out = torch.promote_types(out, d)
    return torch.promote_types(out, torch.float32)


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float = 1e-6, offset: float = 0.0,
             cast: str = "llama") -> torch.Tensor:
    """RMSNorm over the last dim; output in x's dtype.

    cast="llama": normalize in fp32, round to x's dtype, then multiply by (weight + offset).
    cast="gemma": multiply in fp32, round once.
    cast="input": everything in x's dtype, no upcast (eager PyTorch on a 16-bit tensor without .float();
    identical to the others in float64).
    """
    if cast == "input":
        xhat = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        return xhat if weight is None else xhat * (weight.to(x.dtype) + offset)
    acc = _compute_dtype(x, weight)
    xf = x.to(acc)
    xhat = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if weight is None:
        return xhat.to(x.dtype)
    w = weight.to(acc) + offset
    if cast == "llama":
        return (xhat.to(x.dtype).to(acc) * w).to(x.dtype)
    return (xhat * w).to(x.dtype)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None, eps: float = 1e-6,
                 offset: float = 0.0, cast: str = "llama") -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual); the sum is rounded to x's dtype before normalizing."""
    new_residual = x + residual
    return rms_norm(new_residual, weight, eps, offset, cast), new_residual


def layer_norm(x: torch.Tensor, weight: torch.Tensor | None = None, bias: torch.Tensor | None = None,
               eps: float = 1e-5) -> torch.Tensor:
    """LayerNorm over the last dim, computed in fp32 (or fp64), output in x's dtype."""
    acc = _compute_dtype(x, weight, bias)
    w = weight.to(acc) if weight is not None else None
    b = bias.to(acc) if bias is not None else None
    return torch.nn.functional.layer_norm(x.to(acc), x.shape[-1:], w, b, eps).to(x.dtype)


def softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dim, computed in fp32 (or fp64), output in x's dtype."""
    return torch.softmax(x.to(_compute_dtype(x)), dim=-1).to(x.dtype)


# ---------------------------------------------------------------------------------------------------
# Losses, RoPE, gated activations, AdamW. Same three roles as above: float64 ground truth,
# eager baseline at the input dtype, and the cpu-reference fallback.

REDUCTIONS = ("mean", "sum", "none")
#: How reduction="mean" averages the z-loss term: "token", over the non-ignored tokens (PaLM; class weights do
#: not scale it), or "weighted", divided by the total class weight of the targets like the cross-entropy term
#: (wavefront before 0.x: the effective coefficient then changes with the weights' scale).
Z_LOSS_REDUCTIONS = ("token", "weighted")


def reduce_loss(loss_rows: torch.Tensor, denom: torch.Tensor, reduction: str,
                 divisor: torch.Tensor | float | None = None) -> torch.Tensor:
    """none: per-row losses; sum: their sum (divided by `divisor` when given); mean: sum / denom, 0 when
    denom is 0 (an all-ignored batch gives loss 0 and zero gradient, where F.cross_entropy gives NaN)."""
    if reduction == "none":
        return loss_rows
    total = loss_rows.sum()
    if reduction == "sum":
        return total if divisor is None else total / divisor
    return total / torch.where(denom > 0, denom, torch.ones_like(denom))


def cross_entropy_denominator(target: torch.Tensor, ignore_index: int, weight: torch.Tensor | None,
                              dtype: torch.dtype) -> torch.Tensor:
    """The mean reduction's denominator on the target's device (no host sync): the count of non-ignored
    targets, or the sum of their class weights when weights are given (F.cross_entropy's convention)."""
    valid = target != ignore_index
    if weight is None:
        return valid.sum().to(dtype)
    safe = torch.where(valid, target, torch.zeros_like(target)).clamp(0, weight.numel() - 1)
    return torch.where(valid, weight.to(dtype)[safe], torch.zeros((), dtype=dtype, device=target.device)).sum()


def cross_entropy(logits: torch.Tensor, target: torch.Tensor, *, ignore_index: int = -100,
                  label_smoothing: float = 0.0, z_loss: float = 0.0, softcap: float | None = None,
                  weight: torch.Tensor | None = None, reduction: str = "mean",
                  divisor: torch.Tensor | float | None = None, z_loss_reduction: str = "token",
                  return_z_loss: bool = False, return_predicted_tokens: bool = False,
                  return_token_accuracy: bool = False):
    """Cross-entropy over the last dim of logits [..., V] with targets [...], computed in fp32 (fp64).

    F.cross_entropy's definition (class weights also weight the smoothing term; mean divides by the
    total weight of the non-ignored targets), plus softcap (x -> c tanh(x / c) first, Gemma 2),
    PaLM's z-loss (z * lse^2 per non-ignored row, not class-weighted; under mean averaged over the
    non-ignored rows, or with ``z_loss_reduction="weighted"`` divided by the total class weight like the
    rest) and sum-with-divisor. With a ``return_*`` flag: the tuple (loss, z-loss term, predicted tokens,
    token accuracy) of wavefront.ops.LossOutput, None where not asked for (:func:`cross_entropy_extras`).
    """
    if return_z_loss or return_predicted_tokens or return_token_accuracy:
        loss = cross_entropy(logits, target, ignore_index=ignore_index, label_smoothing=label_smoothing,
                             z_loss=z_loss, softcap=softcap, weight=weight, reduction=reduction, divisor=divisor,
                             z_loss_reduction=z_loss_reduction)
        z_out, predicted, accuracy = cross_entropy_extras(logits.detach(), target, ignore_index=ignore_index,
                                                          z_loss=z_loss, softcap=softcap, weight=weight,
                                                          reduction=reduction, divisor=divisor,
                                                          z_loss_reduction=z_loss_reduction)
        return (loss, z_out if return_z_loss else None, predicted if return_predicted_tokens else None,
                accuracy if return_token_accuracy else None)
    acc = _compute_dtype(logits, weight)
    n_classes = logits.shape[-1]
    x = logits.to(acc).reshape(-1, n_classes)
    t = target.reshape(-1)
    if softcap is not None:
        x = softcap * torch.tanh(x / softcap)
    lse = torch.logsumexp(x, dim=-1)
    valid = t != ignore_index
    safe = torch.where(valid, t, torch.zeros_like(t))
    x_t = x.gather(1, safe[:, None]).squeeze(1)
    w = weight.to(acc) if weight is not None else None
    w_t = w[safe] if w is not None else torch.ones_like(lse)
    loss = (1.0 - label_smoothing) * w_t * (lse - x_t)
    if label_smoothing:
        per_class = lse[:, None] - x
        smooth = (per_class * w).sum(-1) if w is not None else per_class.sum(-1)
        loss = loss + label_smoothing / n_classes * smooth
    z_rows = torch.where(valid, z_loss * lse * lse, torch.zeros_like(lse)) if z_loss else None
    loss = torch.where(valid, loss, torch.zeros_like(loss))
    if reduction == "mean" and z_rows is not None and weight is not None and z_loss_reduction == "token":
        # PaLM: the z-loss term averaged over the tokens, the cross-entropy term over the class weight.
        return (reduce_loss(loss, cross_entropy_denominator(t, ignore_index, weight, acc), reduction)
                + reduce_loss(z_rows, cross_entropy_denominator(t, ignore_index, None, acc), reduction))
    if z_rows is not None:
        loss = loss + z_rows
    denom = cross_entropy_denominator(t, ignore_index, weight, acc) if reduction == "mean" else None
    out = reduce_loss(loss, denom, reduction, divisor)
    return out.reshape(target.shape) if reduction == "none" else out


def cross_entropy_extras(logits: torch.Tensor, target: torch.Tensor, *, ignore_index: int = -100,
                         z_loss: float = 0.0, softcap: float | None = None, weight: torch.Tensor | None = None,
                         reduction: str = "mean", divisor: torch.Tensor | float | None = None,
                         z_loss_reduction: str = "token") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The values the fused losses can return beside the loss, from logits [..., V], computed in fp32 (fp64):
    (z-loss term reduced like the loss, predicted tokens [...] int64, token accuracy 0-d).

    z-loss term: z * lse^2 per non-ignored row (lse of the softcapped logits); mean: over the non-ignored
    rows ("token") or over their total class weight ("weighted"); sum: the sum (divided by ``divisor`` when
    given); none: per row. Predicted token: the first index of the maximum of the raw logits (before any
    softcap: capping is monotone), ignore_index at ignored positions. Token accuracy: the fraction of
    non-ignored positions whose predicted token is the target (0 when every position is ignored).
    """
    acc = _compute_dtype(logits, weight)
    n_classes = logits.shape[-1]
    x = logits.reshape(-1, n_classes)
    t = target.reshape(-1)
    valid = t != ignore_index
    pred = torch.where(valid, x.argmax(-1), torch.full_like(t, ignore_index, dtype=torch.int64))
    xc = x.to(acc)
    if softcap is not None:
        xc = softcap * torch.tanh(xc / softcap)
    lse = torch.logsumexp(xc, dim=-1)
    z_rows = torch.where(valid, z_loss * lse * lse, torch.zeros_like(lse))
    by = weight if z_loss_reduction == "weighted" else None
    denom = cross_entropy_denominator(t, ignore_index, by, acc) if reduction == "mean" else None
    z_out = reduce_loss(z_rows, denom, reduction, divisor)
    z_out = z_out.reshape(target.shape) if reduction == "none" else z_out
    n_valid = valid.sum().to(acc)
    hits = ((pred == t) & valid).sum().to(acc)
    accuracy = hits / torch.where(n_valid > 0, n_valid, torch.ones_like(n_valid))
    return z_out, pred.reshape(target.shape), accuracy


def cross_entropy_rows(logits: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None, *,
                       ignore_index: int, label_smoothing: float, z_loss: float, softcap: float | None,
                       stats: torch.Tensor | None = None, grad: torch.Tensor | None = None,
                       scale: torch.Tensor | None = None, col_offset: int = 0, n_classes: int | None = None,
                       argmax: torch.Tensor | None = None) -> tuple[torch.Tensor | None, torch.Tensor]:
    """The cross-entropy kernel's contract (wavefront.kernels.cross_entropy.cross_entropy_rows) in plain
    PyTorch, for the cpu-reference backend of the chunked linear cross-entropy, column slices included.

    It works one row at a time so that, like the kernel, it allocates nothing of size [rows x vocab]
    beyond the outputs: its temporaries are a few vectors of the vocabulary's length. (Out-of-range
    targets are the op layer's to reject; here they raise an IndexError.)
    """
    n_rows, n_cols = logits.shape
    acc = torch.float64 if logits.dtype == torch.float64 else torch.float32
    compute_stats = stats is None
    if n_classes is None:
        n_classes = n_cols
    if col_offset < 0 or col_offset + n_cols > n_classes or (compute_stats and n_cols != n_classes):
        raise ValueError(f"cross_entropy_rows: columns [{col_offset}, {col_offset + n_cols}) of {n_classes} classes "
                         f"(a column slice needs saved stats)")
    loss = torch.zeros(n_rows, dtype=acc, device=logits.device) if compute_stats else None
    if compute_stats:
        stats = torch.zeros((n_rows, 2), dtype=acc, device=logits.device)
    w = weight.to(acc) if weight is not None else None
    w_sum = w.sum() if w is not None else float(n_classes)
    scales = None if scale is None else scale.to(acc).expand(n_rows)
    for i in range(n_rows):
        t = int(target[i])
        if t == ignore_index:
            if grad is not None:
                grad[i].zero_()
            if argmax is not None:
                argmax[i] = ignore_index
            continue
        if argmax is not None:
            argmax[i] = logits[i].argmax()
        x = logits[i].to(acc)
        if softcap is not None:
            x = softcap * torch.tanh(x / softcap)
        if compute_stats:
            m = x.max()
            log_s = torch.log(torch.exp(x - m).sum())
            stats[i, 0], stats[i, 1] = m, log_s
        else:
            m, log_s = stats[i, 0], stats[i, 1]
        lse = m + log_s
        w_t = w[t] if w is not None else 1.0
        if compute_stats:
            # The smoothing and z-loss terms only when on: at 0 they would add 0 * inf = NaN for a -inf logit
            # or an lse^2 that overflows.
            loss[i] = (1.0 - label_smoothing) * w_t * (lse - x[t])
            if label_smoothing:
                sum_wx = (w * x).sum() if w is not None else x.sum()
                loss[i] += label_smoothing * (lse * w_sum - sum_wx) / n_classes
            if z_loss:
                loss[i] += z_loss * lse * lse
        if grad is not None:
            p = torch.exp((x - m) - log_s)
            coef = (1.0 - label_smoothing) * w_t + label_smoothing * w_sum / n_classes + 2.0 * z_loss * lse
            w_cols = w[col_offset:col_offset + n_cols] if w is not None else 1.0
            g = coef * p - (label_smoothing / n_classes) * w_cols
            if col_offset <= t < col_offset + n_cols:
                g[t - col_offset] -= (1.0 - label_smoothing) * w_t
            g *= scales[i]
            if softcap is not None:
                g *= 1.0 - (x / softcap) ** 2
            grad[i].copy_(g)
    return loss, stats


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, *,
                         bias: torch.Tensor | None = None, ignore_index: int = -100, label_smoothing: float = 0.0,
                         z_loss: float = 0.0, softcap: float | None = None, class_weight: torch.Tensor | None = None,
                         reduction: str = "mean", divisor: torch.Tensor | float | None = None,
                         chunk_size: int | None = None, z_loss_reduction: str = "token", **outputs):
    """The LM-head loss as eager users write it: logits = F.linear(hidden, weight, bias) at the input dtype
    (the full [tokens x vocab] tensor), then cross_entropy on logits.float() (Hugging Face's order).
    chunk_size is accepted for signature parity and ignored; ``outputs``: the ``return_*`` flags of
    :func:`cross_entropy`."""
    logits = torch.nn.functional.linear(hidden, weight, bias)
    return cross_entropy(logits, target, ignore_index=ignore_index, label_smoothing=label_smoothing, z_loss=z_loss,
                         softcap=softcap, weight=class_weight, reduction=reduction, divisor=divisor,
                         z_loss_reduction=z_loss_reduction, **outputs)


def _glu(gate: torch.Tensor, up: torch.Tensor, act, gate_multiplier: float = 1.0,
         output_multiplier: float = 1.0) -> torch.Tensor:
    acc = _compute_dtype(gate, up)
    if gate_multiplier != 1.0:
        gate = gate * gate_multiplier  # in gate's dtype: Hugging Face's gate_proj(x) * gate_multiplier
    a = act(gate.to(acc)).to(gate.dtype)
    return (a.to(acc) * up.to(acc) * output_multiplier).to(gate.dtype)


def swiglu(gate: torch.Tensor, up: torch.Tensor, gate_multiplier: float = 1.0,
           output_multiplier: float = 1.0) -> torch.Tensor:
    """silu(gate) rounded to gate's dtype, times up, rounded: Hugging Face's act_fn(gate_proj(x)) * up_proj(x).
    Multipliers (muP): silu(round(gate * m_g)) * up * m_o."""
    return _glu(gate, up, torch.nn.functional.silu, gate_multiplier, output_multiplier)


def geglu(gate: torch.Tensor, up: torch.Tensor, approximate: str = "tanh", gate_multiplier: float = 1.0,
          output_multiplier: float = 1.0) -> torch.Tensor:
    """gelu(gate) (tanh or erf form) rounded to gate's dtype, times up: Gemma's MLP."""
    return _glu(gate, up, lambda g: torch.nn.functional.gelu(g, approximate=approximate), gate_multiplier,
                output_multiplier)


def swiglu_eager(gate: torch.Tensor, up: torch.Tensor, gate_multiplier: float = 1.0,
                 output_multiplier: float = 1.0) -> torch.Tensor:
    """The Hugging Face module's ops at the input dtype (its backward rounds dy * up before silu'); with
    multipliers, Falcon-H1's ``up * act(gate * m_g)`` then ``* m_o`` (eager: each product rounded)."""
    return _scaled_eager(torch.nn.functional.silu, gate, up, gate_multiplier, output_multiplier)


def geglu_eager(gate: torch.Tensor, up: torch.Tensor, approximate: str = "tanh", gate_multiplier: float = 1.0,
                output_multiplier: float = 1.0) -> torch.Tensor:
    return _scaled_eager(lambda g: torch.nn.functional.gelu(g, approximate=approximate), gate, up, gate_multiplier,
                         output_multiplier)


def _scaled_eager(act, gate, up, gate_multiplier, output_multiplier):
    if gate_multiplier != 1.0:
        gate = gate * gate_multiplier
    y = act(gate) * up
    return y * output_multiplier if output_multiplier != 1.0 else y


def rope_tables(q: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, position_ids: torch.Tensor | None = None,
                cu_seqlens: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin rows for every token of q, shaped to broadcast against q's rotary part:
    [B, 1, S, R] for q [B, H, S, D] (HF layout), [T, 1, R] for q [T, H, D] (packed)."""
    if cu_seqlens is not None:
        tokens = torch.arange(q.shape[0], device=q.device)
        seq = torch.searchsorted(cu_seqlens.to(torch.int64), tokens, right=True) - 1
        position_ids = tokens - cu_seqlens.to(torch.int64)[seq]
    if position_ids is not None:
        cos, sin = cos[position_ids], sin[position_ids]
    if q.dim() == 4 and cos.dim() == 3:
        return cos.unsqueeze(1), sin.unsqueeze(1)
    if q.dim() == 3:
        return cos.unsqueeze(1), sin.unsqueeze(1)
    return cos, sin


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rope_one(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, acc: torch.dtype | None) -> torch.Tensor:
    r = cos.shape[-1]
    rot, tail = x[..., :r], x[..., r:]
    if acc is not None:  # compute in fp32 (fp64), round once
        out = (rot.to(acc) * cos.to(acc) + _rotate_half(rot.to(acc)) * sin.to(acc)).to(x.dtype)
    else:  # Hugging Face: everything in x's dtype, each product and the sum rounded
        out = rot * cos.to(x.dtype) + _rotate_half(rot) * sin.to(x.dtype)
    return torch.cat((out, tail), dim=-1) if tail.shape[-1] else out


def rope(q: torch.Tensor, k: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor, *,
         position_ids: torch.Tensor | None = None,
         cu_seqlens: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """HF's apply_rotary_pos_emb on the first cos.shape[-1] dims of q and k, computed in fp32 (fp64)."""
    c, s = rope_tables(q, cos, sin, position_ids, cu_seqlens)
    acc = _compute_dtype(q, cos)
    return _rope_one(q, c, s, acc), (_rope_one(k, c, s, acc) if k is not None else None)


def rope_eager(q: torch.Tensor, k: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor, *,
               position_ids: torch.Tensor | None = None,
               cu_seqlens: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Hugging Face's apply_rotary_pos_emb as written (products and sum at q's dtype)."""
    c, s = rope_tables(q, cos, sin, position_ids, cu_seqlens)
    return _rope_one(q, c, s, None), (_rope_one(k, c, s, None) if k is not None else None)


def adamw_step(param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor, *,
               lr: float, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8, weight_decay: float = 1e-2,
               step: int = 1, maximize: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One AdamW step (decoupled weight decay, bias-corrected), computed in fp32 (fp64), rounded once per
    output; returns new (param, exp_avg, exp_avg_sq) in their own dtypes."""
    acc = _compute_dtype(param, grad, exp_avg, exp_avg_sq)
    p, g, m, v = (t.to(acc) for t in (param, grad, exp_avg, exp_avg_sq))
    if maximize:
        g = -g
    p = p * (1 - lr * weight_decay)
    m = m + (1 - beta1) * (g - m)
    v = v * beta2 + (1 - beta2) * g * g
    denom = v.sqrt() / (1 - beta2 ** step) ** 0.5 + eps
    p = p - (lr / (1 - beta1 ** step)) * m / denom
    return p.to(param.dtype), m.to(exp_avg.dtype), v.to(exp_avg_sq.dtype)


def adamw_update_(param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor,
                  max_exp_avg_sq: torch.Tensor | None = None, master: torch.Tensor | None = None, *, lr: float,
                  beta1: float, beta2: float, eps: float, weight_decay: float, step: float,
                  maximize: bool = False) -> None:
    """torch.optim.AdamW(foreach=False)'s update in place, op by op and at the tensors' own dtypes: the
    eager baseline, and the optimizer's path where no Triton kernel runs. With `master` (fp32) the update
    runs on it and `param` receives its rounding."""
    target = master if master is not None else param
    g = (-grad if maximize else grad).to(exp_avg.dtype)
    target.mul_(1 - lr * weight_decay)
    exp_avg.lerp_(g, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
    second = exp_avg_sq
    if max_exp_avg_sq is not None:
        torch.maximum(max_exp_avg_sq, exp_avg_sq, out=max_exp_avg_sq)
        second = max_exp_avg_sq
    denom = (second.sqrt() / (1 - beta2 ** step) ** 0.5).add_(eps)
    target.addcdiv_(exp_avg.to(target.dtype), denom.to(target.dtype), value=-(lr / (1 - beta1 ** step)))
    if master is not None:
        param.copy_(master)


def adamw_step_eager(param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor, *,
                     lr: float, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8,
                     weight_decay: float = 1e-2, step: int = 1,
                     maximize: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """torch.optim.AdamW(foreach=False)'s arithmetic at the input dtype, on copies."""
    p, m, v = param.clone(), exp_avg.clone(), exp_avg_sq.clone()
    adamw_update_(p, grad, m, v, lr=lr, beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay, step=step,
                  maximize=maximize)
    return p, m, v


# ---------------------------------------------------------------------------------------------------
# Attention and linear.


def _attention_dense(q, k, v, causal: bool, scale: float) -> torch.Tensor:
    """Explicit math on [B, H, S, D] with K/V heads repeated for GQA; computes in q's dtype."""
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale
    if causal:
        s_q, s_k = scores.shape[-2:]
        keep = torch.ones(s_q, s_k, dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1), v)


def _per_sequence(fn, q, k, v, cu_seqlens):
    """Apply fn to each packed sequence of [1, H, total, D] tensors and concatenate along the sequence."""
    bounds = [int(b) for b in cu_seqlens.tolist()]
    outs = [fn(q[:, :, s:e], k[:, :, s:e], v[:, :, s:e]) for s, e in zip(bounds[:-1], bounds[1:], strict=True)]
    return torch.cat(outs, dim=2) if outs else q.new_empty(q.shape)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, scale: float | None = None,
              cu_seqlens: torch.Tensor | None = None, max_seqlen: int | None = None) -> torch.Tensor:
    """softmax(q k^T * scale [causal mask]) v on [batch, heads, seq, head_dim], computed in fp32 (or fp64),
    output in q's dtype. GQA: k/v may have fewer heads (q heads a multiple of them). cu_seqlens: packed
    sequences along dim 2 of [1, heads, total, head_dim] tensors; max_seqlen is not needed here."""
    acc = _compute_dtype(q, k, v)
    scale = q.shape[-1] ** -0.5 if scale is None else scale

    def one(qs, ks, vs):
        return _attention_dense(qs.to(acc), ks.to(acc), vs.to(acc), causal, scale)

    out = one(q, k, v) if cu_seqlens is None else _per_sequence(one, q, k, v, cu_seqlens)
    return out.to(q.dtype)


def attention_sdpa_math(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                        scale: float | None = None, cu_seqlens: torch.Tensor | None = None,
                        max_seqlen: int | None = None) -> torch.Tensor:
    """PyTorch's math SDPA in the inputs' dtype: the eager baseline that sets attention's tolerance."""
    from torch.nn.attention import SDPBackend, sdpa_kernel  # lazy: torch submodule on use

    def one(qs, ks, vs):
        with sdpa_kernel(SDPBackend.MATH):
            return torch.nn.functional.scaled_dot_product_attention(
                qs, ks, vs, is_causal=causal, scale=scale, enable_gqa=ks.shape[1] != qs.shape[1])

    return one(q, k, v) if cu_seqlens is None else _per_sequence(one, q, k, v, cu_seqlens)


ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "silu")


def apply_activation(z: torch.Tensor, name: str | None) -> torch.Tensor:
    """The epilogue activations of wavefront.ops.linear, by name (None: identity)."""
    if name is None:
        return z
    if name == "relu":
        return torch.relu(z)
    if name == "gelu":
        return torch.nn.functional.gelu(z)
    if name == "gelu_tanh":
        return torch.nn.functional.gelu(z, approximate="tanh")
    if name == "silu":
        return torch.nn.functional.silu(z)
    raise ValueError(f"activation must be None or one of {ACTIVATIONS}, got {name!r}")


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, activation: str | None = None,
           residual: torch.Tensor | None = None) -> torch.Tensor:
    """activation(x @ weight.T + bias) + residual computed in fp32 (or fp64), rounded once to x's dtype."""
    acc = _compute_dtype(x, weight, bias, residual)
    z = torch.nn.functional.linear(x.to(acc), weight.to(acc), None if bias is None else bias.to(acc))
    y = apply_activation(z, activation)
    if residual is not None:
        y = y + residual.to(acc)
    return y.to(x.dtype)


def linear_eager(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 activation: str | None = None, residual: torch.Tensor | None = None) -> torch.Tensor:
    """What a user writes in eager PyTorch: F.linear, then the activation, then the residual add, each in
    the input dtype (each rounding to it)."""
    y = apply_activation(torch.nn.functional.linear(x, weight, bias), activation)
    return y if residual is None else y + residual


# ---------------------------------------------------------------------------------------------------
# FP8: scaled quantization and the FP8 linear (wavefront.ops.quantize, wavefront.ops.linear_fp8).
#
# The quantization is defined on the fp32 grid every FP8 stack uses (torchao, TransformerEngine):
# s = FP8_MAX / max(amax, EPS) in fp32, q = fp8_rne(clamp(fp32(x * s), +-FP8_MAX)). On float64 inputs
# holding fp32/bf16/fp16 values the product is exact before its one rounding to fp32, so the result is
# bit-identical to the kernel's; "exact" for the FP8 linear then means the float64 product of the
# dequantized (q / s) operands.

FP8_FORMATS = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2, "e4m3fnuz": torch.float8_e4m3fnuz,
               "e5m2fnuz": torch.float8_e5m2fnuz}
#: Scale granularity -> (rows, columns) of one scale group; 0 = the whole extent.
FP8_SCALINGS = {"tensorwise": (0, 0), "rowwise": (1, 0), "block1x128": (1, 128), "block1x32": (1, 32),
                "block128x128": (128, 128)}
FP8_EPS = 1e-12


def _fp8_rows(t: torch.Tensor) -> torch.Tensor:
    """t as [rows, last dim], also when it holds no element (reshape(-1, 0) is ambiguous)."""
    return t.reshape(math.prod(t.shape[:-1]), t.shape[-1])


def _fp8_group_amax(a: torch.Tensor, scaling: str) -> torch.Tensor:
    """Max of `a` (>= 0, [M, N]) over each scale group; zero padding cannot raise a max. An empty `a` has
    the groups' shape (a whole-extent group counts once, also over 0 elements) and amax 0."""
    gm, gn = FP8_SCALINGS[scaling]
    if scaling == "tensorwise":
        return a.amax() if a.numel() else a.new_zeros(())
    M, N = a.shape
    if a.numel() == 0:
        return a.new_zeros((-(-M // gm) if gm else 1, -(-N // gn) if gn else 1))
    gm, gn = gm or M, gn or N
    pm, pn = (-M) % gm, (-N) % gn
    if pm or pn:
        a = torch.nn.functional.pad(a, (0, pn, 0, pm))
    return a.view((M + pm) // gm, gm, (N + pn) // gn, gn).amax(dim=(1, 3))


def fp8_expand_scale(scale: torch.Tensor, scaling: str, M: int, N: int) -> torch.Tensor:
    """Scales broadcast to the [M, N] elements they scale."""
    gm, gn = FP8_SCALINGS[scaling]
    if scaling == "tensorwise":
        return scale.reshape(1, 1).expand(M, N)
    s = _fp8_rows(scale)
    return s.repeat_interleave(gm or M, 0)[:M].repeat_interleave(gn or N, 1)[:, :N]


def fp8_quantize(x: torch.Tensor, *, dtype: str = "e4m3", scaling: str = "tensorwise",
                 pow2_scale: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, scale) with x ~ q / scale; scale shapes: () tensorwise, [..., 1] rowwise, [..., cdiv(N, G)]
    block1xG, [cdiv(M, 128), cdiv(N, 128)] block128x128 (2-D x only)."""
    fmt = FP8_FORMATS[dtype]
    fp8_max = torch.finfo(fmt).max
    x2 = _fp8_rows(x) if x.dim() != 2 else x
    M, N = x2.shape
    a = x2.detach().abs().to(torch.float64)
    amax = _fp8_group_amax(torch.where(torch.isnan(a), 0.0, a), scaling).to(torch.float32)  # NaN-ignoring
    scale = torch.full_like(amax, fp8_max) / amax.clamp_min(FP8_EPS)
    if pow2_scale:
        scale = (scale.view(torch.int32) & -8388608).view(torch.float32)  # 0xFF800000: keep sign and exponent
    prod = (x2.detach().to(torch.float64) * fp8_expand_scale(scale, scaling, M, N).to(torch.float64)).float()
    q = prod.clamp(-fp8_max, fp8_max).to(fmt).view(x.shape)
    if scaling in ("rowwise", "block1x128", "block1x32"):
        scale = scale.view(*x.shape[:-1], scale.shape[-1])
    return q, scale


def fp8_quantize_eager(x: torch.Tensor, *, dtype: str = "e4m3", scaling: str = "tensorwise",
                       pow2_scale: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The unfused PyTorch quantization a user writes (torchao's eager casts): |x| and its amax in x's
    dtype, the scale and the product in fp32, the clamp, the cast; each a kernel and a pass over memory.
    The same values as :func:`fp8_quantize` (the traffic tool's baseline for the fused kernel)."""
    fmt = FP8_FORMATS[dtype]
    fp8_max = torch.finfo(fmt).max
    x2 = _fp8_rows(x) if x.dim() != 2 else x
    amax = _fp8_group_amax(x2.abs(), scaling).float()
    # tensor / tensor: one correctly rounded division (scalar / tensor is reciprocal-then-multiply in
    # PyTorch, off by an ulp at times, which torchao's scales inherit).
    scale = torch.full_like(amax, fp8_max) / amax.clamp_min(FP8_EPS)
    if pow2_scale:
        scale = (scale.view(torch.int32) & -8388608).view(torch.float32)
    M, N = x2.shape
    gm, gn = FP8_SCALINGS[scaling]
    gm, gn = gm or M, gn or N
    if M % gm == 0 and N % gn == 0:  # broadcast the scales over a blocked view, as a user would
        prod = x2.view(M // gm, gm, N // gn, gn).float() * scale.reshape(M // gm, 1, N // gn, 1)
    else:
        prod = x2.float() * fp8_expand_scale(scale, scaling, M, N)
    q = prod.clamp(-fp8_max, fp8_max).to(fmt).view(x.shape)
    if scaling in ("rowwise", "block1x128", "block1x32"):
        scale = scale.view(*x.shape[:-1], scale.shape[-1])
    return q, scale


def fp8_dequantize(q: torch.Tensor, scale: torch.Tensor, scaling: str, dtype: torch.dtype = torch.float64):
    """q / scale in `dtype` (q of any leading dims; block128x128 2-D)."""
    q2 = _fp8_rows(q)
    s = fp8_expand_scale(scale, scaling, *q2.shape)
    return (q2.to(dtype) / s.to(dtype)).view(q.shape)


# Recipe -> (activation and gradient scaling, weight scaling, gradient format, power-of-two scales).
# tensorwise: torchao's default float8 recipe (e4m3 forward, e5m2 gradients); rowwise: torchao's rowwise
# recipe (axiswise scales rounded to powers of two, e4m3 everywhere); blockwise: DeepSeek-V3 (1x128
# activation and gradient tiles, 128x128 weight blocks, e4m3 everywhere); mxfp8: OCP MX (1x32 blocks
# along the reduction dim with power-of-two scales, e4m3).
FP8_RECIPES = {
    "tensorwise": ("tensorwise", "tensorwise", "e5m2", False),
    "rowwise": ("rowwise", "rowwise", "e4m3", True),
    "blockwise": ("block1x128", "block128x128", "e4m3", False),
    "mxfp8": ("block1x32", "block1x32", "e4m3", True),
}


def fp8_recipe_operand(recipe: str, role: str, fnuz: bool = False) -> tuple[str, str, bool]:
    """(format, scaling, pow2_scale) of a GEMM operand in `recipe` for `role` ("act", "weight", "grad");
    fnuz: the FNUZ formats (AMD MI300: gfx942's matrix units take only those)."""
    act, weight, grad_dtype, pow2 = FP8_RECIPES[recipe]
    fmt = grad_dtype if role == "grad" else "e4m3"
    return fmt + ("fnuz" if fnuz else ""), weight if role == "weight" else act, pow2


def fp8_gemm_operand(t: torch.Tensor, recipe: str, role: str, fnuz: bool = False) -> torch.Tensor:
    """A GEMM operand [rows, reduction] dequantized the way `recipe` quantizes it for `role`, in fp32 (or
    fp64 for fp64 t)."""
    fmt, scaling, pow2 = fp8_recipe_operand(recipe, role, fnuz)
    q, s = fp8_quantize(t, dtype=fmt, scaling=scaling, pow2_scale=pow2)
    return fp8_dequantize(q, s, scaling, torch.float64 if t.dtype == torch.float64 else torch.float32)


class _Fp8LinearReference(torch.autograd.Function):
    """The three products of an FP8 linear on dequantized operands, each quantized along its reduction dim:
    y = Qa(x) Qw(W)^T + b + r, dx = Qg(dy) Qw(W^T)^T, dW = Qg(dy^T) Qa(x^T)^T, db = sum dy, dr = dy."""

    @staticmethod
    def forward(ctx, x, weight, bias, residual, recipe, fnuz):
        ctx.save_for_backward(x, weight)
        ctx.recipe, ctx.fnuz, ctx.has_bias = recipe, fnuz, bias is not None
        y = fp8_gemm_operand(x, recipe, "act", fnuz) @ fp8_gemm_operand(weight, recipe, "weight", fnuz).T
        if bias is not None:
            y = y + bias.to(y.dtype)
        if residual is not None:
            y = y + residual.to(y.dtype)
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        r, f = ctx.recipe, ctx.fnuz
        dx = dw = db = None
        if ctx.needs_input_grad[0]:
            dx = (fp8_gemm_operand(dy, r, "grad", f) @ fp8_gemm_operand(weight.t(), r, "weight", f).T).to(x.dtype)
        if ctx.needs_input_grad[1]:
            dw = (fp8_gemm_operand(dy.t(), r, "grad", f) @ fp8_gemm_operand(x.t(), r, "act", f).T).to(weight.dtype)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = dy.to(torch.float64 if dy.dtype == torch.float64 else torch.float32).sum(0).to(dy.dtype)
        return dx, dw, db, dy if ctx.needs_input_grad[3] else None, None, None


def linear_fp8(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
               residual: torch.Tensor | None = None, recipe: str = "rowwise", fnuz: bool = False) -> torch.Tensor:
    """The FP8 linear on dequantized operands: in float64 for float64 inputs (the reference), otherwise
    dequantized to fp32, multiplied in fp32 and rounded to x's dtype (torchao's "emulate" mode: the eager
    baseline of the accuracy rule)."""
    res = None if residual is None else _fp8_rows(residual)
    y = _Fp8LinearReference.apply(_fp8_rows(x), weight, bias, res, recipe, fnuz)
    return y.view(*x.shape[:-1], weight.shape[0])


# Vocabulary- and context-parallel pieces (wavefront.parallel): the kernels' contracts in plain PyTorch,
# the cpu-reference fallback and the float64 path. Per-shard only: nothing here communicates.

_LOG2E = 1.4426950408889634
_LN2 = 0.6931471805599453


def vocab_shard_stats(logits: torch.Tensor, target: torch.Tensor, weight: torch.Tensor | None, *,
                      ignore_index: int, label_smoothing: float, softcap: float | None, col_offset: int,
                      n_classes: int, argmax: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """wavefront.kernels.vocab_parallel.vocab_shard_stats in PyTorch: [n_rows, 4] = (shard max, sum of
    exp(x' - max), the target's x' if this shard owns it else 0, sum of w x' with smoothing else 0), and into
    ``argmax`` (best, column) the raw maximum and the global column of its first occurrence. Its
    temporaries are the shard's size ([n_rows, V_r]), never the whole vocabulary's."""
    n_rows, n_cols = logits.shape
    acc = torch.float64 if logits.dtype == torch.float64 else torch.float32
    x = logits.to(acc)
    valid = target != ignore_index
    if argmax is not None:
        col = x.argmax(dim=1)  # the first maximum (torch.max(dim) does not promise which)
        best = x.gather(1, col[:, None]).squeeze(1)
        argmax[0].copy_(torch.where(valid, best, torch.full_like(best, float("-inf"))))
        argmax[1].copy_(torch.where(valid, col + col_offset, torch.full_like(col, ignore_index)))
    if softcap is not None:
        x = softcap * torch.tanh(x / softcap)
    m = x.max(dim=1).values if n_cols else x.new_full((n_rows,), float("-inf"))
    m_ref = torch.where(torch.isinf(m) & (m < 0), torch.zeros_like(m), m)
    s = torch.exp(x - m_ref[:, None]).sum(1)
    local = target.to(torch.int64) - col_offset
    owned = (local >= 0) & (local < n_cols)
    x_t = x.gather(1, torch.where(owned, local, torch.zeros_like(local))[:, None]).squeeze(1)
    x_t = torch.where(owned, x_t, torch.zeros_like(x_t))
    bad = valid & ((target < 0) | (target >= n_classes))
    x_t = torch.where(bad, torch.full_like(x_t, float("nan")), x_t)
    if label_smoothing:
        wx = (x * weight[col_offset:col_offset + n_cols].to(acc)).sum(1) if weight is not None else x.sum(1)
    else:
        wx = torch.zeros_like(m)
    stats = torch.stack([m, s, x_t, wx], dim=1)
    ignored = torch.tensor([0.0, 1.0, 0.0, 0.0], dtype=acc, device=logits.device)
    return torch.where(valid[:, None], stats, ignored)


def attention_block(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                    scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """One attention block with its log-sum-exp, the contract of wavefront.ops.attention's forward custom op:
    (out in q's dtype, lse2 [B, H, S] = log2 sum_j exp(scale q.k_j) in fp32, fp64 for fp64 inputs)."""
    acc = _compute_dtype(q, k, v)
    group = q.shape[1] // k.shape[1]
    kr, vr = (t.to(acc).repeat_interleave(group, dim=1) for t in (k, v))
    scores = torch.matmul(q.to(acc), kr.transpose(-2, -1)) * scale
    if causal:
        keep = torch.ones(scores.shape[-2:], dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.matmul(torch.exp(scores - lse[..., None]), vr)
    return out.to(q.dtype), lse * _LOG2E


def attention_block_bwd(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                        lse2: torch.Tensor, causal: bool,
                        scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The attention backward's contract given any row statistics lse2 (base 2) and output o: with P =
    exp2(scale log2(e) q.k - lse2), delta = rowsum(do o): dV = P^T do, dS = P (do V^T - delta),
    dQ = scale dS K, dK = scale dS^T Q; K/V gradients summed over each GQA group."""
    acc = _compute_dtype(q, k, v)
    group = q.shape[1] // k.shape[1]
    kr, vr = (t.to(acc).repeat_interleave(group, dim=1) for t in (k, v))
    qa, doa = q.to(acc), do.to(acc)
    scores = torch.matmul(qa, kr.transpose(-2, -1)) * scale
    p = torch.exp(scores - lse2.to(acc)[..., None] * _LN2)
    if causal:
        keep = torch.ones(scores.shape[-2:], dtype=torch.bool, device=q.device).tril()
        p = p.masked_fill(~keep, 0.0)
    delta = (doa * o.to(acc)).sum(-1, keepdim=True)
    ds = p * (torch.matmul(doa, vr.transpose(-2, -1)) - delta)
    dq = torch.matmul(ds, kr) * scale
    dk = torch.matmul(ds.transpose(-2, -1), qa) * scale
    dv = torch.matmul(p.transpose(-2, -1), doa)
    b, h_kv, s, d = k.shape
    dk = dk.view(b, h_kv, group, s, d).sum(2)
    dv = dv.view(b, h_kv, group, s, d).sum(2)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)

# Mixture of experts: router, permutation to expert-contiguous rows, weighted combine.

#: Added to the sum of the selected sigmoid scores before normalizing (DeepSeek-V3's guard against 0/0).
MOE_SIGMOID_NORM_EPS = 1e-20


def moe_topk_lowest_index(key: torch.Tensor, top_k: int) -> torch.Tensor:
    """Indices of the top_k largest entries of each row, descending; equal values by lowest index first; a NaN
    ranks above +inf (torch's order)."""
    return torch.sort(key, dim=-1, descending=True, stable=True).indices[..., :top_k]


def moe_router(logits: torch.Tensor, top_k: int, *, score: str = "softmax", order: str = "softmax_topk",
               normalize: bool = True, bias: torch.Tensor | None = None, aux_loss_coef: float = 0.0,
               z_loss_coef: float = 0.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Top-k routing of (T, E) logits -> (weights (T, k) in the compute dtype, indices (T, k) int64, counts (E,)
    int32, aux_loss scalar).

    score="softmax": p = softmax(l); "sigmoid": s = sigmoid(l) (DeepSeek-V3). Selection key: p or s, or l for
    order="topk_softmax" (weights = softmax over the k selected logits); plus `bias` when given (selection only).
    normalize divides the selected scores by their sum (+1e-20 for sigmoid). aux_loss = aux_loss_coef * E *
    sum_e f_e * P_e with f_e = counts_e / T and P_e = mean_t of the router probability (p, or s / sum(s) for
    sigmoid) + z_loss_coef * mean_t logsumexp(l_t)^2.
    """
    acc = _compute_dtype(logits)
    lf = logits.to(acc)
    n_tokens, n_experts = lf.shape
    p = torch.softmax(lf, dim=-1)
    if score == "sigmoid":
        s = torch.sigmoid(lf)
        q = s / s.sum(-1, keepdim=True)
    else:
        s, q = p, p
    key = lf if order == "topk_softmax" else s
    if bias is not None:
        key = key + bias.to(acc)
    idx = moe_topk_lowest_index(key.detach(), top_k)
    if order == "topk_softmax":
        w = torch.softmax(lf.gather(1, idx), dim=-1)
    else:
        w = s.gather(1, idx)
        if normalize:
            w = w / (w.sum(-1, keepdim=True) + (MOE_SIGMOID_NORM_EPS if score == "sigmoid" else 0.0))
    counts = torch.zeros(n_experts, dtype=torch.int32, device=lf.device)
    counts = counts.scatter_add(0, idx.reshape(-1), torch.ones(idx.numel(), dtype=torch.int32, device=lf.device))
    rows = max(n_tokens, 1)
    aux = (counts.to(acc) / rows * q.sum(0) / rows).sum() * (aux_loss_coef * n_experts)
    aux = aux + z_loss_coef * torch.logsumexp(lf, dim=-1).pow(2).sum() / rows
    return w, idx, counts, aux


def moe_offsets(counts: torch.Tensor, pad_to: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """(cumulative END offsets (E,) int32 of the groups padded to multiples of pad_to, group starts (E,) int64).
    A negative count is taken as 0, so the groups never overlap."""
    padded = (counts.to(torch.int64).clamp(min=0) + pad_to - 1) // pad_to * pad_to
    ends = torch.cumsum(padded, 0)
    return ends.to(torch.int32), ends - padded


def moe_permute(x: torch.Tensor, indices: torch.Tensor, counts: torch.Tensor, *, pad_to: int = 1
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Copy each (token, slot) assignment's row of x (T, H) to its expert's group -> (x_sorted (rows, H), offsets
    (E,) int32 cumulative ends, row_map (T*k,) int64: x_sorted row of assignment t*k+j). Stable: within a group,
    assignments keep their t*k+j order. rows = T*k + E*(pad_to-1); padding rows are zero.

    Dropped (row_map -1, no row written): an assignment whose index is outside [0, E), or that its expert's
    group has no room for (counts[e], clamped at 0, smaller than the assignments to e; a row past `rows`)."""
    n_tokens, top_k = indices.shape
    n_experts = counts.shape[0]
    flat = indices.reshape(-1).to(torch.int64)
    n_assign = flat.numel()
    rows = n_tokens * top_k + n_experts * (pad_to - 1)
    # Invalid indices become expert E, a group that holds nothing; all of it on the device, no host read.
    expert = torch.where((flat >= 0) & (flat < n_experts), flat, n_experts)
    offsets, starts = moe_offsets(counts, pad_to)
    hits = torch.zeros(n_experts + 1, dtype=torch.int64, device=x.device).scatter_add_(
        0, expert, torch.ones_like(expert))
    firsts = torch.cumsum(hits, 0) - hits  # where each expert's assignments start in sorted order
    order = torch.argsort(expert, stable=True)
    rank = torch.empty_like(flat)
    rank[order] = torch.arange(n_assign, device=x.device) - firsts[expert[order]]
    cap = torch.cat((counts.to(torch.int64).clamp(min=0), counts.new_zeros(1, dtype=torch.int64)))[expert]
    start = torch.cat((starts, starts.new_zeros(1)))[expert]
    keep = (rank < cap) & (start + rank < rows)
    row_map = torch.where(keep, start + rank, -1)
    # Dropped rows land on a scratch row past the end, cut off below.
    x_sorted = x.new_zeros(rows + 1, x.shape[1]).index_copy(0, torch.where(keep, row_map, rows),
                                                            x.repeat_interleave(top_k, dim=0))[:rows]
    return x_sorted, offsets, row_map


def moe_unpermute(y_sorted: torch.Tensor, row_map: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """out[t] = sum_j weights[t, j] * y_sorted[row_map[t*k+j]], in fp32 (or fp64), rounded once to y's dtype. An
    entry of row_map outside [0, rows of y_sorted) (-1: an assignment moe_permute dropped) adds exactly 0."""
    acc = _compute_dtype(y_sorted, weights)
    n_tokens, top_k = weights.shape
    valid = ((row_map >= 0) & (row_map < y_sorted.shape[0])).view(n_tokens, top_k, 1)
    gathered = y_sorted.to(acc)[torch.where(row_map >= 0, row_map, 0).clamp(max=max(y_sorted.shape[0] - 1, 0))]
    terms = gathered.view(n_tokens, top_k, y_sorted.shape[1]) * weights.to(acc).unsqueeze(-1)
    return torch.where(valid, terms, terms.new_zeros(())).sum(1).to(y_sorted.dtype)


# Grouped linear (mixture-of-experts experts): x [T, K] in expert-contiguous order, weight [E, N, K], offsets
# (E,) cumulative group ends; rows past offsets[-1] are padding (zero output).

GROUPED_ACTIVATIONS = (None, "swiglu")


def _group_bounds(offsets: torch.Tensor) -> torch.Tensor:
    """[E, 2] (start, end) of every group, on offsets' device (no host read)."""
    ends = offsets.to(torch.int64)
    return torch.stack((torch.cat((ends.new_zeros(1), ends[:-1])), ends), 1)


def _grouped_epilogue(z: torch.Tensor, activation: str | None) -> torch.Tensor:
    if activation is None:
        return z
    if activation == "swiglu":
        gate, up = z.chunk(2, dim=-1)
        return torch.nn.functional.silu(gate) * up
    raise ValueError(f"activation must be one of {GROUPED_ACTIVATIONS}, got {activation!r}")


def grouped_linear(x: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor, activation: str | None = None
                   ) -> torch.Tensor:
    """Per group x_g @ W_e^T (then silu(gate) * up for "swiglu") in fp32 (or fp64), rounded once to x's dtype.

    Exact and free of host reads: every expert's product is taken over all rows and kept where the row belongs
    to the expert's group (E full products: a reference, not a fast path)."""
    acc = _compute_dtype(x, weight)
    T = x.shape[0]
    bounds = _group_bounds(offsets)
    rows = torch.arange(T, device=x.device)
    xa = x.to(acc)
    z = xa.new_zeros((T, weight.shape[1]))
    for e in range(weight.shape[0]):
        in_group = ((rows >= bounds[e, 0]) & (rows < bounds[e, 1]))[:, None]
        z = torch.where(in_group, torch.nn.functional.linear(xa, weight[e].to(acc)), z)
    return _grouped_epilogue(z, activation).to(x.dtype)


def grouped_linear_eager(x: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor,
                         activation: str | None = None) -> torch.Tensor:
    """What eager mixture-of-experts code runs: the group sizes read on the host, one F.linear per non-empty
    group in the input dtype, the activation in the input dtype, padding rows zero."""
    ends = offsets.tolist()
    pieces, start = [], 0
    for e, end in enumerate(ends):
        if end > start:
            pieces.append(_grouped_epilogue(torch.nn.functional.linear(x[start:end], weight[e]), activation))
        start = max(start, end)
    n_out = weight.shape[1] // (2 if activation == "swiglu" else 1)
    pieces.append(x.new_zeros((x.shape[0] - start, n_out)))
    return torch.cat(pieces)
