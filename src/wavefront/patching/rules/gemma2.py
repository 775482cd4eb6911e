"""Gemma 2: Gemma's offset norm (four per layer: pre/post attention and pre/post MLP), GeGLU, and a
final-logit softcap ``cap * tanh(logits / cap)`` that the fused loss applies inside its logit pass.
Its attention also softcaps the scores and alternates sliding-window layers."""

from wavefront.patching.rule_types import (
    AttentionRule,
    CausalLMLossRule,
    Family,
    GatedMLPRule,
    RMSNormRule,
    RopeRule,
)

FAMILY = Family(
    name="gemma2",
    model_types=("gemma2",),
    rms_norm=RMSNormRule(("Gemma2RMSNorm",), eps_attr="eps", offset=1.0, cast="gemma"),
    mlp=GatedMLPRule(("Gemma2MLP",), activation_from=("hidden_activation", "hidden_act")),
    rope=RopeRule(("Gemma2Attention",)),
    loss=CausalLMLossRule(("Gemma2ForCausalLM",), softcap_from="final_logit_softcapping"),
    attention=AttentionRule(("Gemma2Attention",),
                            unsupported="Gemma 2 softcaps attention scores and uses sliding windows; the "
                                        "attention op has neither"),
)
