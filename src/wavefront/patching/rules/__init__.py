"""The declarative rules, one small file per model family, and the registry that maps a Hugging Face
``config.model_type`` to them.

A family with Llama's layout is one :func:`~wavefront.patching.rules.llama_like.llama_like` call in
``llama_like.py``; any other family is one small file here (``gemma.py`` for an offset norm and GeGLU,
``phi3.py`` for a fused gate/up projection, ``gemma2.py`` for a logit softcap); either way, one line in
:data:`FAMILIES`. The rules only name transformers classes and config attributes; no model code is copied.
"""

from __future__ import annotations

from wavefront.patching.rule_types import Family
from wavefront.patching.rules import falcon_h1, gemma, gemma2, gemma3, glm4, llama4, phi3, qwen3_vl
from wavefront.patching.rules.llama_like import GRANITE, LLAMA, MISTRAL, OLMO2, QWEN2, QWEN3, SMOLLM3
from wavefront.patching.rules.moe import DEEPSEEK_V3, MIXTRAL, QWEN3_MOE

FAMILIES: tuple[Family, ...] = (
    LLAMA,
    MISTRAL,
    QWEN2,
    QWEN3,
    gemma.FAMILY,
    gemma2.FAMILY,
    phi3.FAMILY,
    gemma3.FAMILY,
    OLMO2,
    GRANITE,
    glm4.FAMILY,
    SMOLLM3,
    llama4.FAMILY,
    falcon_h1.FAMILY,
    qwen3_vl.FAMILY,
    MIXTRAL,
    QWEN3_MOE,
    DEEPSEEK_V3,
)


def family_for(model_type: str) -> Family | None:
    """The rules for a ``config.model_type``, or None when wavefront has none."""
    for family in FAMILIES:
        if model_type in family.model_types:
            return family
    return None


def supported_model_types() -> list[str]:
    return sorted(t for f in FAMILIES for t in f.model_types)
