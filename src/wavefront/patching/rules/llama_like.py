"""The Llama layout, shared by several families: one constructor instead of one identical file each.

A Llama-like family has ``<Prefix>RMSNorm`` (Llama's cast: normalize, round to the input dtype, then
multiply by the weight), a SwiGLU ``<Prefix>MLP`` with ``gate_proj``/``up_proj``/``down_proj``, rotary
embeddings applied in ``<Prefix>Attention`` through ``apply_rotary_pos_emb``, and a
``<Prefix>ForCausalLM`` head. Families that differ (offset norms, GeGLU, a fused gate/up projection, a
logit softcap) have their own file.
"""

from __future__ import annotations

from wavefront.patching.rule_types import (
    LLAMA_FP8_PRODUCERS,
    AttentionRule,
    CausalLMLossRule,
    Family,
    GatedMLPRule,
    RMSNormRule,
    RopeRule,
)


def llama_like(model_type: str, prefix: str, *, attention_unsupported: str | None = None) -> Family:
    """The rules of a family with Llama's layout whose transformers classes are named ``<prefix>...``."""
    return Family(
        name=model_type,
        model_types=(model_type,),
        rms_norm=RMSNormRule((f"{prefix}RMSNorm",)),
        mlp=GatedMLPRule((f"{prefix}MLP",)),
        rope=RopeRule((f"{prefix}Attention",)),
        loss=CausalLMLossRule((f"{prefix}ForCausalLM",)),
        attention=AttentionRule((f"{prefix}Attention",), unsupported=attention_unsupported),
        fp8_producers=LLAMA_FP8_PRODUCERS,
    )


#: Llama (Llama 2/3, TinyLlama, SmolLM and other Llama-architecture checkpoints).
LLAMA = llama_like("llama", "Llama")
#: Mistral: Llama's layout; its sliding window is a mask property the attention op lacks.
MISTRAL = llama_like("mistral", "Mistral", attention_unsupported="Mistral's sliding window needs a windowed mask "
                                                                 "the attention op lacks")
#: Qwen2 / Qwen2.5: biases on q/k/v (the Linear layers are kept, so the biases ride along).
QWEN2 = llama_like("qwen2", "Qwen2")
#: Qwen3: per-head RMSNorm on q and k (``q_norm``/``k_norm``, the same class), which the norm rule covers.
QWEN3 = llama_like("qwen3", "Qwen3")
