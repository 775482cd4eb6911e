"""Attention as a module, and an adapter with the Hugging Face attention-function signature.

:class:`ScaledDotProductAttention` holds no parameters: it fixes ``causal`` and ``scale`` and calls
:func:`wavefront.ops.attention` on [batch, heads, seq, head_dim] tensors (GQA and packed sequences
included).

:func:`hf_attention_forward` has the signature of the functions in transformers'
``ALL_ATTENTION_FUNCTIONS`` (``(module, query, key, value, attention_mask, dropout, scaling, is_causal,
**kwargs) -> (attn_output [batch, seq, heads, head_dim], None)``); the patching layer registers it with
``AttentionInterface.register("wavefront", ...)`` and selects it on the patched model only. It serves
what the kernel computes and refuses the rest with a clear
error instead of silently computing something else: no explicit attention mask (causal or full
attention only; packed sequences through ``cu_seq_lens_q``/``max_length_q``, the keywords transformers
passes to its flash-attention path), no dropout, no soft-capping, no sliding window, and query and key of
the same length (training and prefill; decoding with a KV cache is left to the model's own attention).

In an FP8 model (``patch(fp8=..., attention=True)``) the attention module may carry an ``fp8_handoff``
(wavefront.nn.fp8.Fp8HandOff): the forward's epilogue then also writes the output in FP8 (1x128 or 1x32
groups, which stay inside a head) for the FP8 o_proj.
"""

from __future__ import annotations

import torch
from torch import nn

from wavefront import ops


class ScaledDotProductAttention(nn.Module):
    def __init__(self, causal: bool = False, scale: float | None = None):
        super().__init__()
        self.causal = causal
        self.scale = scale

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor | None = None,
                max_seqlen: int | None = None) -> torch.Tensor:
        return ops.attention(q, k, v, causal=self.causal, scale=self.scale, cu_seqlens=cu_seqlens,
                             max_seqlen=max_seqlen)

    def extra_repr(self) -> str:
        return f"causal={self.causal}, scale={self.scale}"


def hf_attention_forward(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                         attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                         is_causal: bool | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """Hugging Face attention interface over wavefront.ops.attention; see the module docstring."""
    name = "hf_attention_forward"
    if attention_mask is not None:
        raise NotImplementedError(f"{name}: an explicit attention_mask is not supported (wavefront attention is "
                                  "causal or full, with packed sequences through cu_seq_lens_q)")
    if dropout:
        raise NotImplementedError(f"{name}: attention dropout ({dropout}) is not supported")
    for unsupported in ("softcap", "sliding_window"):
        if kwargs.get(unsupported) is not None:
            raise NotImplementedError(f"{name}: '{unsupported}' is not supported")
    if query.shape[2] != key.shape[2]:
        raise NotImplementedError(f"{name}: query length {query.shape[2]} differs from key length {key.shape[2]} "
                                  "(KV-cache decoding); only self-attention over the whole sequence is supported")
    causal = bool(getattr(module, "is_causal", True) if is_causal is None else is_causal) and query.shape[2] > 1
    cu_seqlens = kwargs.get("cu_seq_lens_q")
    max_len = kwargs.get("max_length_q")
    kw = {"causal": causal, "scale": scaling, "cu_seqlens": cu_seqlens,
          "max_seqlen": int(max_len) if max_len is not None and cu_seqlens is not None else None}
    handoff = getattr(module, "fp8_handoff", None)
    group = _GROUP.get(handoff.scaling) if handoff is not None else None
    if group and query.shape[-1] % group == 0 and handoff.active(query):
        out, q8, scale = ops.attention(query, key, value, **kw, **handoff.options(query.device))
        out = out.transpose(1, 2).contiguous()  # o_proj reads it as [batch, seq, heads * head_dim]: q8's shape
        handoff.put(out, q8, scale)
        return out, None
    return ops.attention(query, key, value, **kw).transpose(1, 2).contiguous(), None


#: The output's FP8 scale group per scaling: one program holds one head, so a group must stay inside it.
_GROUP = {"block1x128": 128, "block1x32": 32}
