"""The RoPE applier: attention modules get a forward whose call of the modeling module's rotary function
(``apply_rotary_pos_emb``) goes to ``wavefront.ops.rope``: q and k rotated in one fused launch.

Why this mechanism: transformers 5.24's attention forwards call the module-level
``apply_rotary_pos_emb`` directly; there is no per-instance seam for it (the ``use_kernelized_func``
decorator only acts with the optional ``kernels`` package, and then through the Hub). Attention itself
has one (``AttentionInterface``, see attention.py) and uses it. So for RoPE alone, the attention class's
own ``forward`` is rebuilt from its code object with a *private copy* of its globals in which that one
name points to wavefront's function (decorators such as ``deprecate_kwarg`` are rebuilt around it). A
subclass carrying that forward is swapped onto each attention *instance* (``obj.__class__``); the
modeling module, its functions and every other model keep the original, and no model code is copied. If
a transformers release stops calling the function by that name, the module is reported unmatched.
The subclass pickles and deep-copies through its base class (``__reduce_ex__``), so a patched model can
be saved with ``torch.save`` and copied.
"""

from __future__ import annotations

import functools
import inspect
import types
from collections.abc import Callable

import torch

from wavefront import ops
from wavefront.patching.patcher import Patcher


def wavefront_rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                     unsqueeze_dim: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Drop-in for Hugging Face's ``apply_rotary_pos_emb``: q, k are [batch, heads, seq, head_dim] (or
    [batch, seq, heads, head_dim] with unsqueeze_dim=2), cos/sin [batch, seq, rotary_dim] with
    rotary_dim <= head_dim (partial rotary rotates the first rotary_dim dims)."""
    if unsqueeze_dim == 2:
        q_out, k_out = ops.rope(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
        return q_out.transpose(1, 2), k_out.transpose(1, 2)
    return ops.rope(q, k, cos, sin)


def _rebuild(fn: Callable, replacements: dict[str, Callable]) -> Callable:
    """`fn` (possibly wrapped by closure decorators) with each global named in `replacements` bound to its
    replacement in one private globals dict. Raises LookupError when the innermost function does not use
    one of those globals."""
    wrapped = getattr(fn, "__wrapped__", None)
    if wrapped is not None:
        inner = _rebuild(wrapped, replacements)
        cells = fn.__closure__ or ()
        if not any(c.cell_contents is wrapped for c in cells):
            raise LookupError(f"cannot rebuild decorator {fn.__qualname__} around a new function")
        closure = tuple(types.CellType(inner) if c.cell_contents is wrapped else c for c in cells)
        new = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, closure)
    else:
        for name in replacements:
            if name not in fn.__code__.co_names or name not in fn.__globals__:
                raise LookupError(f"{fn.__qualname__} does not call the global {name!r}")
        scope = {**fn.__globals__, **replacements}
        new = types.FunctionType(fn.__code__, scope, fn.__name__, fn.__defaults__, fn.__closure__)
    new.__kwdefaults__ = fn.__kwdefaults__
    functools.update_wrapper(new, fn)
    if wrapped is not None:
        new.__wrapped__ = inner
    return new


_SUBCLASSES: dict[tuple[type, str], type] = {}


def _restore(base: type, function: str) -> torch.nn.Module:
    """Unpickling and deep-copying entry point: an empty instance of the patched subclass of `base`."""
    cls = _subclass(base, function)
    return cls.__new__(cls)


def _reduce_ex(self, protocol):
    # The subclass is built at run time, so pickle cannot find it by name: rebuild it from its base class.
    return _restore, (self._wavefront_base, self._wavefront_function), self.__getstate__()


def _subclass(cls: type, function: str) -> type:
    """One cached subclass per (class, global name): every patched instance of a class shares it."""
    key = (cls, function)
    if key not in _SUBCLASSES:
        forward = _rebuild(inspect.getattr_static(cls, "forward"), {function: wavefront_rotary})
        _SUBCLASSES[key] = type(f"Wavefront{cls.__name__}", (cls,), {
            "forward": forward, "__module__": __name__, "__reduce_ex__": _reduce_ex, "_wavefront_base": cls,
            "_wavefront_function": function,
            "__doc__": f"{cls.__name__} whose forward calls wavefront's RoPE for {function}"})
    return _SUBCLASSES[key]


def apply_rope(p: Patcher) -> None:
    """Swap the class of each attention module whose forward calls the rule's rotary function."""
    rule = p.family.rope
    if rule is None:
        p.absent("rope", f"{p.family.name} models have no rotary embedding")
        return
    if rule.unsupported:
        p.unmatched("rope", rule.unsupported)
        return
    if not hasattr(ops, "rope"):
        p.unmatched("rope", "wavefront.ops.rope is not available in this build of wavefront")
        return
    found = p.of_classes(rule.attention_classes)
    if not found:
        p.unmatched("rope", f"no module of class {' or '.join(rule.attention_classes)} in this model")
    for path, module in found:
        try:
            new_cls = _subclass(type(module), rule.function)
        except LookupError as e:
            p.unmatched("rope", f"{e} in transformers {p.report.transformers_version}", path)
            continue
        p.swap_class("rope", path, module, new_cls)
