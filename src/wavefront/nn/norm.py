"""RMSNorm and LayerNorm modules.

State dict keys match torch.nn.RMSNorm / Hugging Face ``LlamaRMSNorm`` (``weight``) and torch.nn.LayerNorm
(``weight``, ``bias``), so checkpoints load either way.

A norm patched into an FP8 model may carry an :class:`~wavefront.nn.fp8.Fp8HandOff` (``fp8_handoff``): its
forward then also returns nothing more, but emits the FP8 copy of its output for the Float8Linear layers it
feeds from the same kernel pass (the op's ``quantize=`` option), so they skip quantizing it.
"""

from __future__ import annotations

import numbers

import torch
from torch import nn

from wavefront import ops


class RMSNorm(nn.Module):
    """RMSNorm over the last dim. offset=1.0 with zero-initialized weights reproduces Gemma's norm;
    cast="gemma" multiplies in fp32 before the final cast (Gemma), "llama" casts first (Llama), "input"
    computes in the input dtype without an upcast (ops.rms_norm)."""

    def __init__(self, hidden_size: int, eps: float = 1e-6, *, offset: float = 0.0, cast: str = "llama",
                 elementwise_affine: bool = True, device=None, dtype=None):
        super().__init__()
        self.hidden_size = int(hidden_size)
        self.eps = float(eps)
        self.offset = float(offset)
        self.cast = cast
        if elementwise_affine:
            init = torch.zeros if offset != 0.0 else torch.ones
            self.weight = nn.Parameter(init(self.hidden_size, device=device, dtype=dtype))
        else:
            self.register_parameter("weight", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        handoff = getattr(self, "fp8_handoff", None)
        if handoff is not None and handoff.active(x):
            y, q, scale = ops.rms_norm(x, self.weight, self.eps, self.offset, cast=self.cast,
                                       **handoff.options(x.device))
            handoff.put(y, q, scale)
            return y
        return ops.rms_norm(x, self.weight, self.eps, self.offset, cast=self.cast)

    def extra_repr(self) -> str:
        return f"{self.hidden_size}, eps={self.eps}, offset={self.offset}, cast={self.cast!r}"


class LayerNorm(nn.Module):
    """LayerNorm over the last dim (one normalized dim), torch.nn.LayerNorm-compatible."""

    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True, bias: bool = True,
                 device=None, dtype=None):
        super().__init__()
        if isinstance(normalized_shape, numbers.Integral):
            normalized_shape = (int(normalized_shape),)
        normalized_shape = tuple(normalized_shape)
        if len(normalized_shape) != 1:
            raise ValueError(f"LayerNorm: normalized_shape must name one (the last) dim, got {normalized_shape}")
        self.normalized_shape = normalized_shape
        self.eps = float(eps)
        self.elementwise_affine = elementwise_affine
        if elementwise_affine:
            self.weight = nn.Parameter(torch.ones(normalized_shape, device=device, dtype=dtype))
            self.bias = nn.Parameter(torch.zeros(normalized_shape, device=device, dtype=dtype)) if bias else None
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        handoff = getattr(self, "fp8_handoff", None)
        if handoff is not None and handoff.active(x):
            y, q, scale = ops.layer_norm(x, self.weight, self.bias, self.eps, **handoff.options(x.device))
            handoff.put(y, q, scale)
            return y
        return ops.layer_norm(x, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"
