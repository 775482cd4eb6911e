"""Qwen3: Llama's layout plus per-head RMSNorm on q and k (``q_norm``/``k_norm``, the same class as the
layer norms, over head_dim), which the RMSNorm rule covers too."""

from wavefront.patching.rule_types import (
    AttentionRule,
    CausalLMLossRule,
    Family,
    GatedMLPRule,
    RMSNormRule,
    RopeRule,
)

FAMILY = Family(
    name="qwen3",
    model_types=("qwen3",),
    rms_norm=RMSNormRule(("Qwen3RMSNorm",)),
    mlp=GatedMLPRule(("Qwen3MLP",)),
    rope=RopeRule(("Qwen3Attention",)),
    loss=CausalLMLossRule(("Qwen3ForCausalLM",)),
    attention=AttentionRule(("Qwen3Attention",)),
)
