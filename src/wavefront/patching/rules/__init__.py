"""The declarative rules, one small file per model family, and the registry that maps a Hugging Face
``config.model_type`` to them.

Adding a family is one file here plus one line in :data:`FAMILIES`: name the family's transformers
classes for each op (see ``llama.py`` for the shape, ``gemma.py`` for an offset norm and GeGLU, ``phi3.py``
for a fused gate/up projection, ``gemma2.py`` for a logit softcap) and say which config attribute holds
what the kernel needs. No model code is copied: the rules only name classes and attributes.
"""

from __future__ import annotations

from wavefront.patching.rule_types import Family
from wavefront.patching.rules import gemma, gemma2, llama, mistral, phi3, qwen2, qwen3

FAMILIES: tuple[Family, ...] = (
    llama.FAMILY,
    mistral.FAMILY,
    qwen2.FAMILY,
    qwen3.FAMILY,
    gemma.FAMILY,
    gemma2.FAMILY,
    phi3.FAMILY,
)


def family_for(model_type: str) -> Family | None:
    """The rules for a ``config.model_type``, or None when wavefront has none."""
    for family in FAMILIES:
        if model_type in family.model_types:
            return family
    return None


def supported_model_types() -> list[str]:
    return sorted(t for f in FAMILIES for t in f.model_types)
