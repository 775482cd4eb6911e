"""The attention applier (opt-in, ``attention=True``): the attention modules' attention function is
served by ``wavefront.ops.attention`` through the same private-globals forward as RoPE (see rope.py), so
the model's ``config._attn_implementation`` and transformers' global attention registry are untouched."""

from __future__ import annotations

from wavefront.patching.apply import Patcher
from wavefront.patching.rope import Overrides


def collect(p: Patcher, overrides: Overrides) -> None:
    from wavefront import ops

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
    p.unmatched("attention", "the attention rule is not wired yet for this build")
