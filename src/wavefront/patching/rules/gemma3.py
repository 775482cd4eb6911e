"""Gemma 3 (text, ``model_type="gemma3_text"``): Gemma's offset norm ``x * (1 + w)`` in fp32, four per layer
plus per-head ``q_norm``/``k_norm`` of the same class (over head_dim, before RoPE), GeGLU
(``hidden_activation``), and an optional final-logit softcap. Its attention interleaves sliding-window layers
(and may softcap scores), which the attention op does not cover. The multimodal ``gemma3`` model is not covered
by these rules."""

from wavefront.patching.rule_types import (
    AttentionRule,
    CausalLMLossRule,
    Family,
    GatedMLPRule,
    RMSNormRule,
    RopeRule,
)

FAMILY = Family(
    name="gemma3_text",
    model_types=("gemma3_text",),
    rms_norm=RMSNormRule(("Gemma3RMSNorm",), eps_attr="eps", offset=1.0, cast="gemma"),
    mlp=GatedMLPRule(("Gemma3MLP",), activation_from=("hidden_activation", "hidden_act")),
    rope=RopeRule(("Gemma3Attention",)),
    loss=CausalLMLossRule(("Gemma3ForCausalLM",), softcap_from="final_logit_softcapping"),
    attention=AttentionRule(("Gemma3Attention",),
                            unsupported="Gemma 3 interleaves sliding-window layers (and may softcap scores); the "
                                        "attention op has neither"),
)
