"""Plain PyTorch references for every op: float64-capable, differentiable, importable without Triton.

Each reference computes in the dtype of its inputs' promotion with fp32 as the floor for 16-bit inputs
(the way Hugging Face models compute these ops), so it serves three roles:

- called on float64 inputs it is the ground truth that tests and ``wavefront bench`` compare against;
- called on the original 16-bit/fp32 inputs it is "eager PyTorch in the same dtype", the baseline
  whose error sets each op's tolerance (see wavefront.ops._spec.Tolerance);
- on a CPU without the Triton interpreter the ops fall back to it (backend "cpu-reference").
"""

from __future__ import annotations

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
    """
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
# Attention and linear (issue 6).


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
    from torch.nn.attention import SDPBackend, sdpa_kernel

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
