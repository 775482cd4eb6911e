"""Gemma: RMSNorm with a ``1 + weight`` offset multiplied in fp32 (zero-initialized weights), and a
GeGLU MLP (``gelu_pytorch_tanh``)."""

from wavefront.patching.rule_types import (
    AttentionRule,
    CausalLMLossRule,
    Family,
    GatedMLPRule,
    RMSNormRule,
    RopeRule,
)

FAMILY = Family(
    name="gemma",
    model_types=("gemma",),
    rms_norm=RMSNormRule(("GemmaRMSNorm",), eps_attr="eps", offset=1.0, cast="gemma"),
    mlp=GatedMLPRule(("GemmaMLP",), activation_from=("hidden_activation", "hidden_act")),
    rope=RopeRule(("GemmaAttention",)),
    loss=CausalLMLossRule(("GemmaForCausalLM",)),
    attention=AttentionRule(("GemmaAttention",)),
)
