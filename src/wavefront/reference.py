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
