"""GLM-4 (``model_type="glm4"``): Llama-cast RMSNorms, four per layer (``post_self_attn_layernorm`` and
``post_mlp_layernorm`` normalize the attention and MLP outputs before their residual adds: still an RMSNorm
over the last dim, patched like the others), a fused ``gate_up_proj`` whose output is [gate, up] (Phi-3's
layout), and q/k/v biases (kept in their Linear layers).

Its rotary embedding is not ours: GLM-4's ``apply_rotary_pos_emb`` rotates *interleaved* pairs (even/odd
dims, ``repeat_interleave`` of the cos/sin tables) of a partial slice, where ``ops.rope`` rotates the two
halves (``rotate_half``). RoPE is reported unmatched (patch with ``rope=False``)."""

from wavefront.patching.rule_types import (
    AttentionRule,
    CausalLMLossRule,
    Family,
    GatedMLPRule,
    RMSNormRule,
    RopeRule,
)

FAMILY = Family(
    name="glm4",
    model_types=("glm4",),
    rms_norm=RMSNormRule(("Glm4RMSNorm",)),
    mlp=GatedMLPRule(("Glm4MLP",), fused_gate_up=True),
    rope=RopeRule(("Glm4Attention",), unsupported="GLM-4 rotates interleaved (even/odd) pairs of a partial slice; "
                                                  "ops.rope rotates halves (rotate_half), so the RoPE replacement "
                                                  "does not cover it; patch with rope=False"),
    loss=CausalLMLossRule(("Glm4ForCausalLM",)),
    attention=AttentionRule(("Glm4Attention",)),
)
