"""Qwen2 / Qwen2.5: Llama's layout with biases on q/k/v (the Linear layers are kept, so biases ride along)."""

from wavefront.patching.rule_types import (
    AttentionRule,
    CausalLMLossRule,
    Family,
    GatedMLPRule,
    RMSNormRule,
    RopeRule,
)

FAMILY = Family(
    name="qwen2",
    model_types=("qwen2",),
    rms_norm=RMSNormRule(("Qwen2RMSNorm",)),
    mlp=GatedMLPRule(("Qwen2MLP",)),
    rope=RopeRule(("Qwen2Attention",)),
    loss=CausalLMLossRule(("Qwen2ForCausalLM",)),
    attention=AttentionRule(("Qwen2Attention",)),
)
