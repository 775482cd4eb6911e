"""The Llama layout, shared by several families: one constructor instead of one identical file each.

A Llama-like family has ``<Prefix>RMSNorm`` (Llama's cast: normalize, round to the input dtype, then
multiply by the weight), a SwiGLU ``<Prefix>MLP`` with ``gate_proj``/``up_proj``/``down_proj``, rotary
embeddings applied in ``<Prefix>Attention`` through ``apply_rotary_pos_emb``, and a
``<Prefix>ForCausalLM`` head. Families that differ from it in a few named places are
``replace(llama_like(...), field=...)`` below (GLM-4, Llama 4, Falcon-H1, Qwen2.5-VL, Qwen3-VL); the Gemma layout is
gemma.py's ``gemma_like``, Phi-3 and the MoE families have their own files.
"""

from __future__ import annotations

from dataclasses import replace

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

#: GLM-4: Llama-cast RMSNorms, four per layer (``post_self_attn_layernorm`` and ``post_mlp_layernorm`` normalize the
#: attention and MLP outputs before their residual adds: still an RMSNorm over the last dim, patched like the
#: others), a fused ``gate_up_proj`` whose output is [gate, up] (Phi-3's layout), q/k/v biases kept in their
#: Linears. Its RoPE is not ours: GLM-4's ``apply_rotary_pos_emb`` rotates *interleaved* pairs (even/odd dims,
#: ``repeat_interleave`` of the tables) of a partial slice, where ``ops.rope`` rotates halves (``rotate_half``).
GLM4 = replace(
    llama_like("glm4", "Glm4", fp8_producers=()),
    mlp=GatedMLPRule(("Glm4MLP",), fused_gate_up=True),
    rope=RopeRule(("Glm4Attention",), unsupported="GLM-4 rotates interleaved (even/odd) pairs of a partial slice; "
                                                  "ops.rope rotates halves (rotate_half), so the RoPE replacement "
                                                  "does not cover it; patch with rope=False"))

#: Llama 4 (text, ``llama4_text``): Llama-cast ``Llama4TextRMSNorm``s and SwiGLU ``Llama4TextMLP``s (the dense
#: layers' MLP and each MoE block's shared expert) are ours. Left alone: q and k are normalized by
#: ``Llama4TextL2Norm``, a weightless RMSNorm on the fp32 copy (known, not swapped, not reported as unknown); RoPE
#: multiplies by complex ``freqs_cis`` (interleaved pairs) in ``apply_rotary_emb``; attention is chunked on RoPE
#: layers and temperature-tuned on NoPE layers; the MoE block (a router whose sigmoid scores scale the expert
#: *inputs*, plus a shared expert) is not what ``ops.moe_router`` and the grouped experts compute. The multimodal
#: ``llama4`` model is not covered.
LLAMA4 = replace(
    llama_like("llama4_text", "Llama4Text", fp8_producers=(), attention_unsupported=(
        "Llama 4 chunks attention on RoPE layers and temperature-tunes NoPE layers; the attention op has neither"),
        unsupported=(("moe", "Llama 4's MoE block (sigmoid router scores scaling the expert inputs, a shared expert) "
                             "is not what ops.moe_router and the grouped experts compute"),)),
    rms_norm=RMSNormRule(("Llama4TextRMSNorm",), eps_attr="eps"),
    rope=RopeRule(("Llama4TextAttention",), unsupported="Llama 4 rotates interleaved pairs with complex freqs_cis "
                                                        "(apply_rotary_emb); ops.rope rotates halves, so the RoPE "
                                                        "replacement does not cover it"),
    loss=CausalLMLossRule(("Llama4ForCausalLM",)),
    left_alone=("Llama4TextL2Norm",))

#: Falcon-H1: hybrid layers, each a Mamba-2 mixer beside attention, then a SwiGLU ``feed_forward`` with muP
#: multipliers (``mlp_multipliers`` = gate, down: ``down(up * silu(gate * m_g)) * m_d``), fused into the
#: activation. Llama-cast norms (``input_layernorm``, ``pre_ff_layernorm``, the final norm); the mixer and its
#: gated norm (``FalconH1RMSNormGated``) keep their own code. Keys are scaled by ``key_multiplier`` before the
#: standard rotary call. The logits are multiplied by ``lm_head_multiplier``, which the fused loss does not apply.
FALCON_H1 = replace(
    llama_like("falcon_h1", "FalconH1", fp8_producers=(), unsupported=(
        ("loss", "Falcon-H1 multiplies the logits by config.lm_head_multiplier, which the fused LM-head loss does "
                 "not apply"),)),
    mlp=GatedMLPRule(("FalconH1MLP",), multipliers_from="mlp_multipliers"))

#: Qwen3-VL's text tower (``qwen3_vl``, ``Qwen3VLForConditionalGeneration``): Qwen3's layout (q/k norms included)
#: and a standard ``apply_rotary_pos_emb`` call: the interleaved multimodal RoPE is folded into the cos/sin tables
#: by the rotary-embedding module, so the rotation is ``ops.rope``'s. The vision tower keeps its own attention (2-D
#: rotary) and non-gated MLPs; its ``torch.nn.LayerNorm``s are swapped by ``layer_norm`` like any LayerNorm.
QWEN3_VL = replace(llama_like("qwen3_vl", "Qwen3VLText", fp8_producers=()),
                   loss=CausalLMLossRule(("Qwen3VLForConditionalGeneration",)))

#: Qwen2.5-VL's text tower (``qwen2_5_vl``): Qwen2's layout (q/k/v biases) with its MRoPE sections folded into the
#: cos/sin tables by the rotary-embedding module before a standard ``apply_rotary_pos_emb`` call (transformers
#: 5.24), and the text MLP class named ``Qwen2MLP``. The vision tower's norms are ``Qwen2_5_VLRMSNorm`` too (the
#: same Llama-cast RMSNorm, patched); its gated MLPs (``Qwen2_5_VLMLP``, the vision config's activation) and its
#: windowed attention are left alone.
QWEN2_5_VL = replace(llama_like("qwen2_5_vl", "Qwen2_5_VL", fp8_producers=()), mlp=GatedMLPRule(("Qwen2MLP",)),
                     loss=CausalLMLossRule(("Qwen2_5_VLForConditionalGeneration",)))
