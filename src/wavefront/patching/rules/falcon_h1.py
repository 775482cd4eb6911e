"""Falcon-H1 (``model_type="falcon_h1"``): hybrid layers, each a Mamba-2 mixer beside attention, then a SwiGLU
``feed_forward`` with muP multipliers (``mlp_multipliers`` = gate, down: ``down(up * silu(gate * m_g)) * m_d``),
which the fused activation applies. Norms are Llama-cast ``FalconH1RMSNorm`` (``input_layernorm``,
``pre_ff_layernorm``, the final norm); the mixer's gated norm (``FalconH1RMSNormGated``) and the mixer itself are
left running their own code. Attention scales keys by ``key_multiplier`` before RoPE, so the rotary call is the
standard one. The logits are multiplied by ``lm_head_multiplier`` inside the model's forward, which the fused
loss does not apply: the loss is refused (patch with ``loss=False``)."""

from wavefront.patching.rule_types import (
    AttentionRule,
    CausalLMLossRule,
    Family,
    GatedMLPRule,
    RMSNormRule,
    RopeRule,
)

FAMILY = Family(
    name="falcon_h1",
    model_types=("falcon_h1",),
    rms_norm=RMSNormRule(("FalconH1RMSNorm",)),
    mlp=GatedMLPRule(("FalconH1MLP",), multipliers_from="mlp_multipliers"),
    rope=RopeRule(("FalconH1Attention",)),
    loss=CausalLMLossRule(("FalconH1ForCausalLM",)),
    attention=AttentionRule(("FalconH1Attention",)),
    unsupported=(("loss", "Falcon-H1 multiplies the logits by config.lm_head_multiplier, which the fused LM-head "
                          "loss does not apply"),),
)
