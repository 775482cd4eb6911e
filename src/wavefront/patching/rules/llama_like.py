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
    Fp8ProducerRule,
    GatedMLPRule,
    RMSNormRule,
    RopeRule,
)


def llama_like(model_type: str, prefix: str, *, attention_unsupported: str | None = None, cast: str = "llama",
               fp8_producers: tuple[Fp8ProducerRule, ...] = LLAMA_FP8_PRODUCERS,
               unsupported: tuple[tuple[str, str], ...] = ()) -> Family:
    """The rules of a family with Llama's layout whose transformers classes are named ``<prefix>...``.

    cast: the norm's rounding ("gemma" for ``(w * xhat).to(dtype)``, OLMo 2's); fp8_producers: () for a
    decoder layer whose norms are not the inputs of the linears (OLMo 2's post-norms); unsupported: see
    :class:`~wavefront.patching.rule_types.Family`."""
    return Family(
        name=model_type,
        model_types=(model_type,),
        rms_norm=RMSNormRule((f"{prefix}RMSNorm",), cast=cast),
        mlp=GatedMLPRule((f"{prefix}MLP",)),
        rope=RopeRule((f"{prefix}Attention",)),
        loss=CausalLMLossRule((f"{prefix}ForCausalLM",)),
        attention=AttentionRule((f"{prefix}Attention",), unsupported=attention_unsupported),
        fp8_producers=fp8_producers,
        unsupported=unsupported,
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
#: OLMo 2: norms *after* attention and MLP (``post_attention_layernorm``/``post_feedforward_layernorm``, their
#: outputs added to the residual) and q/k norms over the whole projection width (before the head split); each is
#: an ``Olmo2RMSNorm`` over the last dim, ``(w * xhat).to(dtype)``: cast="gemma" with no offset. No norm feeds a
#: linear, so there are no fused FP8 producers.
OLMO2 = llama_like("olmo2", "Olmo2", cast="gemma", fp8_producers=())
#: Granite (IBM Granite 3.x dense): Llama's modules; its multipliers live outside them (embedding_multiplier on
#: the embeddings, residual_multiplier on each branch before the residual add, attention_multiplier as the
#: attention's scaling, all untouched by the patch) except ``logits_scaling``, which divides the logits that the
#: fused loss would never materialize.
GRANITE = llama_like("granite", "Granite", unsupported=(
    ("loss", "Granite divides the logits by config.logits_scaling, which the fused LM-head loss does not apply"),))
#: SmolLM3: Llama's layout; its NoPE layers (``no_rope_layers``) never call the rotary function, so the patched
#: forward leaves them unrotated as the original does. An optional sliding window is refused by the attention
#: function at call time.
SMOLLM3 = llama_like("smollm3", "SmolLM3")
