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

:class:`Fp8HandOff` carries an FP8 copy of a producer's output (a norm, the gated activation, attention)
to the Float8Linear layers that read that output, so the input is quantized once, in the producer's own
kernel pass (docs/fp8.md, "Fused producers in patched models"). ``wavefront.patch(model, fp8=...)`` links
producers and consumers; the copy is used only for the very tensor it was made from, unmodified.
"""

from __future__ import annotations

import weakref

import torch
from torch import nn

from wavefront import ops, reference
from wavefront.ops.linear_fp8 import PROVIDERS, RECIPES, Quantized, default_fnuz

#: The attribute of a producer module (a wavefront norm, the patched gated MLP, a Hugging Face attention
#: module) holding its :class:`Fp8HandOff`; set by wavefront.patch only.
HANDOFF_ATTR = "fp8_handoff"
_FUSABLE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


class PrequantizedWeight:
    """A weight that runs its FP8 linear itself, from FP8 copies it already holds: the FSDP2 FP8 all-gather's
    weights (wavefront.parallel.fp8_fsdp) implement it; this layer sits below them and cannot import them."""

    def fp8_linear(self, x: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor | None,
                   provider: str) -> torch.Tensor:
        raise NotImplementedError


class Fp8HandOff:
    """A producer's FP8 copy of its latest output, for the Float8Linear layers that read that output.

    The producer asks :meth:`options` for the ``quantize=`` keywords of its op (the recipe's activation
    layout: ``reference.fp8_recipe_operand(recipe, "act")``), runs the op once, and hands the output with its
    ``(q, scale)`` to :meth:`put`. A consumer's :meth:`take` returns the copy only when

    - the consumer runs the hand-off's recipe and format (another recipe sees nothing);
    - its input is the output itself or a contiguous view of it with the copy's shape (same storage, same
      offset), and that output is still alive and unmodified (its version counter unchanged: an in-place
      change after the producer ran makes the copy stale, so it is not used);
    - not every linked consumer has taken it yet (the copy is dropped after the last one, so it is not held
      until the backward like the output itself).

    Otherwise the consumer quantizes its input itself, as without the hand-off: the result is the same
    bit for bit either way, the hand-off only saves the second read. Under torch.compile and in inference
    mode the hand-off is off (:meth:`active`), so a compiled graph is the plain one. Copies and pickles of a
    model keep the link, never a pending copy.
    """

    def __init__(self, recipe: str, fnuz: bool | None, consumers: tuple[nn.Module, ...]):
        _, self.scaling, self.pow2_scale = reference.fp8_recipe_operand(recipe, "act", False)
        self.recipe, self.fnuz, self.consumers = recipe, fnuz, tuple(consumers)
        self._clear()

    def _clear(self) -> None:
        self._out: weakref.ref | None = None
        self._version = -1
        self._copy: Quantized | None = None
        self._where: tuple = ()
        self._left = 0

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state.update(_out=None, _version=-1, _copy=None, _where=(), _left=0)
        return state

    def _takers(self) -> int:
        return sum(not isinstance(c.weight, PrequantizedWeight) for c in self.consumers)

    def active(self, x: torch.Tensor) -> bool:
        """Whether the producer should emit the FP8 copy for an output computed from `x`."""
        if torch.compiler.is_compiling() or torch.is_inference_mode_enabled() or x.is_inference():
            return False
        return x.dtype in _FUSABLE_DTYPES and self._takers() > 0

    def fp8_dtype(self, device) -> str:
        fnuz = default_fnuz(device) if self.fnuz is None else self.fnuz
        return "e4m3fnuz" if fnuz else "e4m3"

    def options(self, device) -> dict:
        """The producer op's ``quantize=`` keywords for this recipe's activation operand."""
        return {"quantize": self.scaling, "fp8_dtype": self.fp8_dtype(device), "pow2_scale": self.pow2_scale}

    def put(self, out: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> None:
        # The weak reference is to the storage's owner: a view (the attention output's reshape) may die while
        # the view the consumer gets lives on, and a view keeps its base alive, never its sibling.
        base = out if out._base is None else out._base
        self._out, self._version = weakref.ref(base), out._version
        self._where = (out.dtype, out.device, out.untyped_storage().data_ptr(), out.storage_offset(), out.numel(),
                       out.is_contiguous())
        self._copy, self._left = Quantized(q, scale, self.scaling), self._takers()

    def take(self, x: torch.Tensor, recipe: str, fnuz: bool | None) -> Quantized | None:
        """The FP8 copy of `x` for a consumer of `recipe` / `fnuz`, or None (see the class docstring)."""
        copy = self._copy
        if copy is None or torch.compiler.is_compiling() or recipe != self.recipe or fnuz != self.fnuz:
            return None
        out = self._out()
        if out is None or x.is_inference():
            self._clear()
            return None
        where = (x.dtype, x.device, x.untyped_storage().data_ptr(), x.storage_offset(), x.numel(), True)
        if tuple(x.shape) != tuple(copy.data.shape) or not x.is_contiguous() or where != self._where:
            return None
        if x._version != self._version or out._version != self._version:
            self._clear()  # modified in place since the producer ran: the copy is stale for every consumer
            return None
        self._left -= 1
        if self._left <= 0:
            self._clear()
        return copy

    def __repr__(self) -> str:
        return f"Fp8HandOff(recipe={self.recipe!r}, scaling={self.scaling!r}, consumers={len(self.consumers)})"


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
        self.fp8_source: Fp8HandOff | None = None  # the producer whose FP8 copy of x it may take (patching)

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

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None, *,
                x_fp8: Quantized | None = None) -> torch.Tensor:
        """``x @ W^T + b`` in FP8 (+ ``residual``, added in the GEMM's epilogue). x_fp8: x already quantized
        in the recipe's activation layout (``ops.linear_fp8``'s); else the linked producer's copy of x if it
        has one (:class:`Fp8HandOff`), else the op quantizes x. With the FSDP2 FP8 all-gather's weights the
        op always quantizes x itself."""
        if isinstance(self.weight, PrequantizedWeight):
            return self.weight.fp8_linear(x, self.bias, residual, self.provider)
        source = getattr(self, "fp8_source", None)
        if x_fp8 is None and source is not None:
            x_fp8 = source.take(x, self.recipe, self.fnuz)
        return ops.linear_fp8(x, self.weight, self.bias, residual=residual, recipe=self.recipe, fnuz=self.fnuz,
                              provider=self.provider, x_fp8=x_fp8)

    def extra_repr(self) -> str:
        extra = f", provider={self.provider!r}" if self.provider != "auto" else ""
        extra += ", fp8_all_gather=True" if self.fp8_all_gather else ""
        return f"{super().extra_repr()}, recipe={self.recipe!r}{extra}"
