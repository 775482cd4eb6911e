"""Linear with a fused epilogue.

:class:`Linear` is a ``torch.nn.Linear`` (same parameters, initialisation and state_dict keys ``weight``,
``bias``) whose forward runs :func:`wavefront.ops.linear`, with an optional activation applied in the GEMM
epilogue and an optional residual added there: ``Linear(4096, 14336, activation="silu")(x)`` is
``F.silu(F.linear(x, W, b))`` in one pass, and ``proj(x, residual=h)`` is ``h + F.linear(x, W, b)``.
A checkpoint saved from either module loads into the other. ``provider`` is passed to the op ("auto",
"wavefront" or "vendor": who computes the GEMM products).
"""

from __future__ import annotations

import torch
from torch import nn

from wavefront import ops
from wavefront.ops.linear import ACTIVATIONS, PROVIDERS


class Linear(nn.Linear):
    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, activation: str | None = None,
                 provider: str = "auto", device=None, dtype=None):
        if activation not in ACTIVATIONS:
            raise ValueError(f"Linear: 'activation' must be one of {ACTIVATIONS}, got {activation!r}")
        if provider not in PROVIDERS:
            raise ValueError(f"Linear: 'provider' must be one of {PROVIDERS}, got {provider!r}")
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        self.activation = activation
        self.provider = provider

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        return ops.linear(x, self.weight, self.bias, activation=self.activation, residual=residual,
                          provider=self.provider)

    def extra_repr(self) -> str:
        extra = f", provider={self.provider!r}" if self.provider != "auto" else ""
        return f"{super().extra_repr()}, activation={self.activation!r}{extra}"
