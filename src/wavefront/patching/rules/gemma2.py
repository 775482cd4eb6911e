"""Gemma 2: Gemma's offset norm (four per layer: pre/post attention and pre/post MLP), GeGLU, and a
final-logit softcap ``cap * tanh(logits / cap)`` that the fused loss applies inside its logit pass.
Its attention also softcaps the scores and alternates sliding-window layers."""

from wavefront.patching.rules.gemma import gemma_like

FAMILY = gemma_like("gemma2", "Gemma2", softcap_from="final_logit_softcapping",
                    attention_unsupported="Gemma 2 softcaps attention scores and uses sliding windows; the attention "
                                          "op has neither")
