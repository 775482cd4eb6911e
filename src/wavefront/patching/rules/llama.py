"""Llama (and Llama-architecture checkpoints such as Llama 2/3, TinyLlama, SmolLM)."""

from wavefront.patching.rule_types import (
    AttentionRule,
    CausalLMLossRule,
    Family,
    GatedMLPRule,
    RMSNormRule,
    RopeRule,
)

FAMILY = Family(
    name="llama",
    model_types=("llama",),
    rms_norm=RMSNormRule(("LlamaRMSNorm",)),
    mlp=GatedMLPRule(("LlamaMLP",)),
    rope=RopeRule(("LlamaAttention",)),
    loss=CausalLMLossRule(("LlamaForCausalLM",)),
    attention=AttentionRule(("LlamaAttention",)),
)
