"""The Gemma layout: RMSNorm with a ``1 + weight`` offset multiplied in fp32 (zero-initialized weights), a GeGLU
MLP (``gelu_pytorch_tanh``), ``<Prefix>Attention`` calling ``apply_rotary_pos_emb``, a ``<Prefix>ForCausalLM``
head. Gemma 2 and Gemma 3 (gemma2.py, gemma3.py) are this layout with a final-logit softcap and attention the op
does not cover."""

from __future__ import annotations

from wavefront.patching.rule_types import (
    AttentionRule,
    CausalLMLossRule,
    Family,
    GatedMLPRule,
    RMSNormRule,
    RopeRule,
)


def gemma_like(model_type: str, prefix: str, *, softcap_from: str | None = None,
               attention_unsupported: str | None = None) -> Family:
    """The rules of a family with Gemma's layout whose transformers classes are named ``<prefix>...``."""
    return Family(
        name=model_type,
        model_types=(model_type,),
        rms_norm=RMSNormRule((f"{prefix}RMSNorm",), eps_attr="eps", offset=1.0, cast="gemma"),
        mlp=GatedMLPRule((f"{prefix}MLP",), activation_from=("hidden_activation", "hidden_act")),
        rope=RopeRule((f"{prefix}Attention",)),
        loss=CausalLMLossRule((f"{prefix}ForCausalLM",), softcap_from=softcap_from),
        attention=AttentionRule((f"{prefix}Attention",), unsupported=attention_unsupported),
    )


FAMILY = gemma_like("gemma", "Gemma")
