"""The attention applier (opt-in, ``attention=True``): the attention modules' attention function is
served by ``wavefront.ops.attention`` (through :func:`wavefront.nn.hf_attention_forward`), by the same
private-globals forward as RoPE (see rope.py).

Hugging Face attention modules pick their attention function at call time:
``ALL_ATTENTION_FUNCTIONS.get_interface(config._attn_implementation, eager_attention_forward)``. The patched
forward sees, in its private copy of the modeling module's globals, a registry whose every lookup answers
wavefront's function, and the same function as the eager fallback; transformers' global registry, the
model's config and every other model are untouched.

Supported: self-attention over the whole sequence, causal or not, with packed sequences; no explicit mask
tensor, no dropout, no soft-capping or sliding windows (the function raises on those at call time). A model
configured for ``attn_implementation="eager"`` always builds an explicit causal mask, so it is reported as
unmatched: load it with ``attn_implementation="sdpa"`` (transformers' default), whose causal mask is
skipped when there is no padding.
"""

from __future__ import annotations

from collections.abc import Callable

from wavefront.patching.apply import Patcher
from wavefront.patching.rope import Overrides, _subclass

_REGISTRY_NAME = "ALL_ATTENTION_FUNCTIONS"
_EAGER_NAME = "eager_attention_forward"


class _WavefrontAttentionFunctions:
    """Stands in for transformers' attention registry inside a patched forward only."""

    def __init__(self, fn: Callable):
        self._fn = fn

    def get_interface(self, attn_implementation, default=None):
        return self._fn

    def __getitem__(self, key):
        return self._fn

    def get(self, key, default=None):
        return self._fn


def collect(p: Patcher, overrides: Overrides) -> None:
    from wavefront import ops
    from wavefront.nn.attention import hf_attention_forward

    rule = p.family.attention
    if rule is None:
        p.absent("attention", f"{p.family.name} models have no attention rule")
        return
    if rule.unsupported:
        p.unmatched("attention", rule.unsupported)
        return
    if not hasattr(ops, "attention"):
        p.unmatched("attention", "wavefront.ops.attention is not available in this build of wavefront")
        return
    impl = getattr(p.model.config, "_attn_implementation", None)
    if impl == "eager":
        p.unmatched("attention", "the model uses attn_implementation='eager', which always passes an explicit "
                                 "causal mask; load it with attn_implementation='sdpa'")
        return
    replacements = {_REGISTRY_NAME: _WavefrontAttentionFunctions(hf_attention_forward),
                    _EAGER_NAME: hf_attention_forward}
    found = p.of_classes(rule.attention_classes)
    if not found:
        p.unmatched("attention", f"no module of class {' or '.join(rule.attention_classes)} in this model")
    for path, module in found:
        merged = {**overrides[id(module)][2], **replacements} if id(module) in overrides else dict(replacements)
        try:
            _subclass(type(module), merged)
        except LookupError as e:
            p.unmatched("attention", f"{e} in transformers {p.report.transformers_version}", path)
            continue
        ops_list = overrides[id(module)][3] + ["attention"] if id(module) in overrides else ["attention"]
        overrides[id(module)] = (path, module, merged, ops_list)
