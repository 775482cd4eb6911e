"""Layer 3: modules built on wavefront.ops, with state_dict keys identical to the modules they replace."""

from __future__ import annotations

from wavefront.nn.attention import ScaledDotProductAttention, hf_attention_forward
from wavefront.nn.fp8 import Float8Linear
from wavefront.nn.linear import Linear
from wavefront.nn.mlp import GeGLUMLP, SwiGLUMLP
from wavefront.nn.moe import MoE, MoEExperts, MoERouter, tokens_per_expert
from wavefront.nn.norm import LayerNorm, RMSNorm

__all__ = ["Float8Linear", "GeGLUMLP", "LayerNorm", "Linear", "MoE", "MoEExperts", "MoERouter", "RMSNorm",
           "ScaledDotProductAttention", "SwiGLUMLP", "hf_attention_forward", "tokens_per_expert"]
