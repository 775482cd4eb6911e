"""Gemma 3 (text, ``model_type="gemma3_text"``): Gemma's offset norm ``x * (1 + w)`` in fp32, four per layer
plus per-head ``q_norm``/``k_norm`` of the same class (over head_dim, before RoPE), GeGLU
(``hidden_activation``), and an optional final-logit softcap. Its attention interleaves sliding-window layers
(and may softcap scores), which the attention op does not cover. The multimodal ``gemma3`` model is not covered
by these rules."""

from wavefront.patching.rules.gemma import gemma_like

FAMILY = gemma_like("gemma3_text", "Gemma3", softcap_from="final_logit_softcapping",
                    attention_unsupported="Gemma 3 interleaves sliding-window layers (and may softcap scores); the "
                                          "attention op has neither")
