"""Mixture-of-experts families (transformers 5.x layout: a router ``gate`` and fused 3-D ``experts`` per
sparse block).

- Mixtral: Llama's norms, attention and RoPE; every layer sparse (no dense MLP); softmax top-k, always
  renormalized, fp32 weights.
- Qwen3-MoE: Qwen3's layout (per-head q/k norms); dense ``Qwen3MoeMLP`` only on ``mlp_only_layers`` (or
  off the ``decoder_sparse_step``), so the dense-MLP rule is optional; softmax top-k renormalized when
  ``norm_topk_prob``, weights rounded to the logits' dtype.
- DeepSeek-V3: sigmoid scores, selection bias ``e_score_correction_bias``, group-limited selection
  (``n_group``/``topk_group``), renormalization when ``norm_topk_prob`` (+1e-20), ``routed_scaling_factor``;
  an fp32 router; a shared SwiGLU expert (``DeepseekV3MLP``, patched by the dense-MLP rule with the first
  ``first_k_dense_replace`` dense layers). Its multi-head latent attention applies RoPE to a decoupled slice
  (interleaved by default) and has different q/k and v head widths: neither the RoPE nor the attention
  replacement covers it, so both are reported unmatched when requested (pass ``rope=False``).
"""

from __future__ import annotations

from dataclasses import replace

from wavefront.patching.rule_types import (
    AttentionRule,
    CausalLMLossRule,
    Family,
    GatedMLPRule,
    MoERule,
    RMSNormRule,
    RopeRule,
)
from wavefront.patching.rules.llama_like import llama_like

MIXTRAL = replace(llama_like("mixtral", "Mixtral"), mlp=None,
                  moe=MoERule(("MixtralTopKRouter",), ("MixtralExperts",)))

QWEN3_MOE = replace(llama_like("qwen3_moe", "Qwen3Moe"), mlp=GatedMLPRule(("Qwen3MoeMLP",), optional=True),
                    moe=MoERule(("Qwen3MoeTopKRouter",), ("Qwen3MoeExperts",), normalize_attr="norm_topk_prob",
                                weights_dtype="logits"))

_MLA = ("DeepSeek-V3's multi-head latent attention rotates a decoupled (by default interleaved) slice of q and "
        "k with one shared key head")

DEEPSEEK_V3 = Family(
    name="deepseek_v3",
    model_types=("deepseek_v3",),
    rms_norm=RMSNormRule(("DeepseekV3RMSNorm",)),
    mlp=GatedMLPRule(("DeepseekV3MLP",)),
    rope=RopeRule(("DeepseekV3Attention",), unsupported=f"{_MLA}; the RoPE replacement does not cover it"),
    loss=CausalLMLossRule(("DeepseekV3ForCausalLM",)),
    attention=AttentionRule(("DeepseekV3Attention",),
                            unsupported=f"{_MLA} and q/k heads wider than v heads; the attention op has neither"),
    moe=MoERule(("DeepseekV3TopkRouter",), ("DeepseekV3Experts",), score="sigmoid", fp32_logits=True,
                normalize_attr="norm_topk_prob", bias_attr="e_score_correction_bias",
                scaling_attr="routed_scaling_factor", group_attrs=("num_group", "topk_group")),
)
