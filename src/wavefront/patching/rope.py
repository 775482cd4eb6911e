"""The RoPE applier: attention modules get a forward whose call of the modeling module's rotary function
(``apply_rotary_pos_emb``) goes to ``wavefront.ops.rope``: q and k rotated in one fused launch.

How, without touching transformers: the attention class's own ``forward`` function is rebuilt from its
code object with a *private copy* of its globals in which that one name points to wavefront's function
(decorators such as ``deprecate_kwarg`` are rebuilt around it). A subclass carrying that forward is
swapped onto each attention *instance* (``obj.__class__``); the modeling module, its functions and every
other model keep the original. If a transformers release stops calling the function by that name, the
rule reports the module as unmatched instead of silently doing nothing.
"""

from __future__ import annotations

import functools
import inspect
import types
from collections.abc import Callable

import torch

from wavefront.patching.apply import Patcher


def wavefront_rotary(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                     unsqueeze_dim: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Drop-in for Hugging Face's ``apply_rotary_pos_emb``: q, k are [batch, heads, seq, head_dim] (or
    [batch, seq, heads, head_dim] with unsqueeze_dim=2), cos/sin [batch, seq, rotary_dim] with
    rotary_dim <= head_dim (partial rotary rotates the first rotary_dim dims)."""
    from wavefront import ops

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


def with_globals(fn: Callable, replacements: dict[str, Callable]) -> Callable:
    return _rebuild(fn, replacements)


_SUBCLASSES: dict[tuple[type, tuple[str, ...]], type] = {}


def _subclass(cls: type, replacements: dict[str, Callable]) -> type:
    """One cached subclass per (class, replaced names): every patched instance of a class shares it."""
    key = (cls, tuple(sorted(replacements)))
    if key not in _SUBCLASSES:
        forward = with_globals(inspect.getattr_static(cls, "forward"), replacements)
        _SUBCLASSES[key] = type(f"Wavefront{cls.__name__}", (cls,), {
            "forward": forward, "__module__": __name__, "__doc__": f"{cls.__name__} with wavefront kernels in "
                                                                  f"its forward ({', '.join(sorted(replacements))})"})
    return _SUBCLASSES[key]


#: id(module) -> (path, module, {global name: replacement}, ops that asked for it)
Overrides = dict[int, tuple[str, torch.nn.Module, dict[str, Callable], list[str]]]


def collect(p: Patcher) -> Overrides:
    """The attention modules RoPE applies to, with the global each one's forward must see replaced."""
    from wavefront import ops

    rule = p.family.rope
    overrides: Overrides = {}
    if rule is None:
        p.absent("rope", f"{p.family.name} models have no rotary embedding")
        return overrides
    if not hasattr(ops, "rope"):
        p.unmatched("rope", "wavefront.ops.rope is not available in this build of wavefront")
        return overrides
    found = p.of_classes(rule.attention_classes)
    if not found:
        p.unmatched("rope", f"no module of class {' or '.join(rule.attention_classes)} in this model")
    for path, module in found:
        try:
            _subclass(type(module), {rule.function: wavefront_rotary})
        except LookupError as e:
            p.unmatched("rope", f"{e} in transformers {p.report.transformers_version}", path)
            continue
        overrides[id(module)] = (path, module, {rule.function: wavefront_rotary}, ["rope"])
    return overrides


def swap_attention_classes(p: Patcher, overrides: Overrides) -> None:
    for path, module, replacements, ops in overrides.values():
        p.swap_class(tuple(ops), path, module, _subclass(type(module), replacements))
