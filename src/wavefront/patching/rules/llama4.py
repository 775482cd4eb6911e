"""Llama 4 (text, ``model_type="llama4_text"``): Llama-cast ``Llama4TextRMSNorm``s and SwiGLU ``Llama4TextMLP``s
(the dense layers' MLP and each MoE block's shared expert) are ours.

Left alone, and why: q and k are normalized by ``Llama4TextL2Norm``, an RMSNorm with no weight computed on the
fp32 copy (known to the rules, not reported as an unknown norm, not swapped); RoPE multiplies q and k by complex
``freqs_cis`` (interleaved pairs) in ``apply_rotary_emb``, not ``ops.rope``'s half-split rotation; attention is
chunked on RoPE layers and temperature-tuned on NoPE layers; the MoE block (``Llama4TextMoe``: a top-k router whose
sigmoid scores scale the expert *inputs*, plus a shared expert) is not what ``ops.moe_router`` and the grouped
experts compute. RoPE, attention and MoE are reported unmatched when requested (strict raises; patch with
``rope=False, moe=False``). The multimodal ``llama4`` model is not covered by these rules."""

from wavefront.patching.rule_types import (
    AttentionRule,
    CausalLMLossRule,
    Family,
    GatedMLPRule,
    RMSNormRule,
    RopeRule,
)

FAMILY = Family(
    name="llama4_text",
    model_types=("llama4_text",),
    rms_norm=RMSNormRule(("Llama4TextRMSNorm",), eps_attr="eps"),
    mlp=GatedMLPRule(("Llama4TextMLP",)),
    rope=RopeRule(("Llama4TextAttention",), unsupported="Llama 4 rotates interleaved pairs with complex freqs_cis "
                                                        "(apply_rotary_emb); ops.rope rotates halves, so the RoPE "
                                                        "replacement does not cover it"),
    loss=CausalLMLossRule(("Llama4ForCausalLM",)),
    attention=AttentionRule(("Llama4TextAttention",),
                            unsupported="Llama 4 chunks attention on RoPE layers and temperature-tunes NoPE layers; "
                                        "the attention op has neither"),
    unsupported=(("moe", "Llama 4's MoE block (sigmoid router scores scaling the expert inputs, a shared expert) is "
                         "not what ops.moe_router and the grouped experts compute"),),
    left_alone=("Llama4TextL2Norm",),
)
