"""Mistral: Llama's layout; sliding-window attention is a mask property, so norms, MLP, RoPE and the
loss patch as in Llama."""

from wavefront.patching.rule_types import (
    AttentionRule,
    CausalLMLossRule,
    Family,
    GatedMLPRule,
    RMSNormRule,
    RopeRule,
)

FAMILY = Family(
    name="mistral",
    model_types=("mistral",),
    rms_norm=RMSNormRule(("MistralRMSNorm",)),
    mlp=GatedMLPRule(("MistralMLP",)),
    rope=RopeRule(("MistralAttention",)),
    loss=CausalLMLossRule(("MistralForCausalLM",)),
    attention=AttentionRule(("MistralAttention",),
                            unsupported="Mistral's sliding window needs a windowed mask the attention op lacks"),
)
