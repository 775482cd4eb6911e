"""FP8 linear layer.

:class:`Float8Linear` is a ``torch.nn.Linear`` (same parameters, kept in their own dtype, same state_dict
keys ``weight`` and ``bias``) whose forward runs :func:`wavefront.ops.linear_fp8`: both operands of every
product (forward, dx, dW) are quantized to FP8 with the recipe's scales on the fly, so the master weights,
the optimizer and checkpoints never see FP8. ``Float8Linear.from_linear(linear, recipe=...)`` wraps an
existing layer's parameter objects (no copy: an optimizer built before the swap keeps training them).

``fp8_all_gather=True`` marks the layer for FSDP2's FP8 weight all-gather: ``wavefront.parallel.
enable_fp8_all_gather(model, shard_degree)`` (called before ``fully_shard``) wraps the weights of the marked
layers so each rank quantizes its shard and the all-gather moves FP8 (docs/fp8.md, "FSDP2: FP8 all-gather").
The forward then takes the weight's gathered FP8 copy (a :class:`PrequantizedWeight`) as it is.
"""

from __future__ import annotations

import torch
from torch import nn

from wavefront import ops
from wavefront.ops.linear_fp8 import PROVIDERS, RECIPES


class PrequantizedWeight:
    """A weight that runs its FP8 linear itself, from FP8 copies it already holds: the FSDP2 FP8 all-gather's
    weights (wavefront.parallel.fp8_fsdp) implement it; this layer sits below them and cannot import them."""

    def fp8_linear(self, x: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor | None,
                   provider: str) -> torch.Tensor:
        raise NotImplementedError


class Float8Linear(nn.Linear):
    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, recipe: str = "rowwise",
                 fnuz: bool | None = None, provider: str = "auto", fp8_all_gather: bool = False, device=None,
                 dtype=None):
        if recipe not in RECIPES:
            raise ValueError(f"Float8Linear: 'recipe' must be one of {RECIPES}, got {recipe!r}")
        if provider not in PROVIDERS:
            raise ValueError(f"Float8Linear: 'provider' must be one of {PROVIDERS}, got {provider!r}")
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        self.recipe, self.fnuz, self.provider, self.fp8_all_gather = recipe, fnuz, provider, fp8_all_gather

    @classmethod
    def from_linear(cls, linear: nn.Linear, *, recipe: str = "rowwise", fnuz: bool | None = None,
                    provider: str = "auto", fp8_all_gather: bool = False) -> Float8Linear:
        """A Float8Linear holding `linear`'s own weight and bias Parameters (shared, not copied)."""
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"Float8Linear.from_linear: 'linear' must be a torch.nn.Linear, got "
                            f"{type(linear).__name__}")
        new = cls(linear.in_features, linear.out_features, linear.bias is not None, recipe=recipe, fnuz=fnuz,
                  provider=provider, fp8_all_gather=fp8_all_gather, device="meta", dtype=linear.weight.dtype)
        new.weight = linear.weight
        new.bias = linear.bias
        new.train(linear.training)
        return new

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor:
        """``x @ W^T + b`` in FP8 (+ ``residual``, added in the GEMM's epilogue)."""
        if isinstance(self.weight, PrequantizedWeight):
            return self.weight.fp8_linear(x, self.bias, residual, self.provider)
        return ops.linear_fp8(x, self.weight, self.bias, residual=residual, recipe=self.recipe, fnuz=self.fnuz,
                              provider=self.provider)

    def extra_repr(self) -> str:
        extra = f", provider={self.provider!r}" if self.provider != "auto" else ""
        extra += ", fp8_all_gather=True" if self.fp8_all_gather else ""
        return f"{super().extra_repr()}, recipe={self.recipe!r}{extra}"
