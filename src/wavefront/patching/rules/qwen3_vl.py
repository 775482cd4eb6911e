"""Qwen3-VL's text tower (``model_type="qwen3_vl"``, ``Qwen3VLForConditionalGeneration``): Qwen3's layout
(Llama-cast ``Qwen3VLTextRMSNorm``s including per-head q/k norms, a SwiGLU ``Qwen3VLTextMLP``) and a standard
``apply_rotary_pos_emb`` call: the interleaved multimodal RoPE (MRoPE) is folded into the cos/sin tables by the
rotary-embedding module, so the rotation itself is ``ops.rope``'s. The LM head's loss is fused as for causal LMs.

The vision tower keeps its own attention (2-D rotary) and its non-gated MLPs; its ``torch.nn.LayerNorm``s are
swapped by the ``layer_norm`` op like any LayerNorm. Deepstack visual features, added to the text hidden states,
are untouched."""

from wavefront.patching.rule_types import (
    AttentionRule,
    CausalLMLossRule,
    Family,
    GatedMLPRule,
    RMSNormRule,
    RopeRule,
)

FAMILY = Family(
    name="qwen3_vl",
    model_types=("qwen3_vl",),
    rms_norm=RMSNormRule(("Qwen3VLTextRMSNorm",)),
    mlp=GatedMLPRule(("Qwen3VLTextMLP",)),
    rope=RopeRule(("Qwen3VLTextAttention",)),
    loss=CausalLMLossRule(("Qwen3VLForConditionalGeneration",)),
    attention=AttentionRule(("Qwen3VLTextAttention",)),
    has_layer_norm=True,
)
