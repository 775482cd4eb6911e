"""The attention applier (opt-in, ``attention=True``): the model's attention function is
``wavefront.ops.attention`` (through :func:`wavefront.nn.hf_attention_forward`), selected through
transformers' own extension point.

Hugging Face attention modules pick their function at call time:
``ALL_ATTENTION_FUNCTIONS.get_interface(config._attn_implementation, eager_attention_forward)``. We

1. register the function once under the name :data:`IMPLEMENTATION` with
   ``AttentionInterface.register`` (an added entry: the existing ones are untouched), and a mask function
   for the same name with ``AttentionMaskInterface.register`` (transformers' sdpa mask: ``None`` for plain
   causal attention, an explicit mask when there is padding, which the function refuses with a clear
   error instead of silently ignoring it);
2. call ``model.set_attn_implementation("wavefront")`` on the patched instance: only that model's config
   changes. Unpatch sets the previous implementation back.

Supported: self-attention over the whole sequence, causal or not; no explicit mask tensor, no dropout,
no soft-capping or sliding windows (refused at call time). A family whose attention always needs one of
those (Gemma 2's score softcap, Mistral's window) is reported unmatched by its rule.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from wavefront import ops
from wavefront.nn.attention import hf_attention_forward
from wavefront.patching.patcher import Patcher
from wavefront.patching.report import Replacement

IMPLEMENTATION = "wavefront"


def register() -> None:
    """Make "wavefront" a valid ``attn_implementation`` (idempotent, adds two registry entries)."""
    from transformers import AttentionInterface  # lazy: optional transformers
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask  # lazy: optional transformers

    AttentionInterface.register(IMPLEMENTATION, hf_attention_forward)
    AttentionMaskInterface.register(IMPLEMENTATION, sdpa_mask)


@dataclass
class AttnImplementation:
    """The model's attention implementation was `previous` before the patch."""

    previous: str

    def undo(self, model: nn.Module) -> None:
        model.set_attn_implementation(self.previous)

    def __setstate__(self, state: dict) -> None:
        # A patched model loaded in a fresh process (torch.load) needs the registry entry back.
        self.__dict__.update(state)
        register()


def apply_attention(p: Patcher) -> None:
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
    model = p.model
    if not callable(getattr(model, "set_attn_implementation", None)):
        p.unmatched("attention", f"{type(model).__name__} has no set_attn_implementation (transformers "
                                 f"{p.report.transformers_version})")
        return
    found = p.of_classes(rule.attention_classes)
    if not found:
        p.unmatched("attention", f"no module of class {' or '.join(rule.attention_classes)} in this model")
        return
    previous = model.config._attn_implementation
    register()
    model.set_attn_implementation(IMPLEMENTATION)
    if model.config._attn_implementation != IMPLEMENTATION:
        p.unmatched("attention", f"{type(model).__name__} does not support setting its attention implementation")
        return
    p.record(AttnImplementation(previous))
    for path, _ in found:
        p.report.replacements.append(Replacement("attention", path, f"attn_implementation={previous!r}",
                                                 f"attn_implementation={IMPLEMENTATION!r}",
                                                 "attn_implementation"))
