"""The declarative rules, one small file per model family, and the registry that maps a Hugging Face
``config.model_type`` to them.

A family with Llama's layout is one :func:`~wavefront.patching.rules.llama_like.llama_like` call in
``llama_like.py`` (with ``dataclasses.replace`` for the fields where it differs); a Gemma-layout family is one
``gemma_like`` call; any other family is one small file here (``phi3.py`` for a fused gate/up projection,
``moe.py`` for the MoE families); either way, one line in :data:`FAMILIES`. The rules only name transformers
classes and config attributes; no model code is copied.
"""

from __future__ import annotations

from wavefront.patching.rule_types import Family
from wavefront.patching.rules import gemma, gemma2, gemma3, phi3
from wavefront.patching.rules.llama_like import (
    FALCON_H1,
    GLM4,
    GRANITE,
    LLAMA,
    LLAMA4,
    MISTRAL,
    OLMO2,
    QWEN2,
    QWEN2_5_VL,
    QWEN3,
    QWEN3_VL,
    SMOLLM3,
)
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
    GLM4,
    SMOLLM3,
    LLAMA4,
    FALCON_H1,
    QWEN2_5_VL,
    QWEN3_VL,
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
