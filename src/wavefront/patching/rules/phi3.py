"""Phi-3: Llama-style norms, one fused ``gate_up_proj`` Linear whose output is [gate, up], and partial
rotary embeddings on some checkpoints (the RoPE replacement rotates the first cos.shape[-1] dims)."""

from wavefront.patching.rule_types import (
    AttentionRule,
    CausalLMLossRule,
    Family,
    GatedMLPRule,
    RMSNormRule,
    RopeRule,
)

FAMILY = Family(
    name="phi3",
    model_types=("phi3",),
    rms_norm=RMSNormRule(("Phi3RMSNorm",)),
    mlp=GatedMLPRule(("Phi3MLP",), fused_gate_up=True),
    rope=RopeRule(("Phi3Attention",)),
    loss=CausalLMLossRule(("Phi3ForCausalLM",)),
    attention=AttentionRule(("Phi3Attention",)),
)
