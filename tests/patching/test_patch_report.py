"""What patch() reports and when it raises."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import wavefront
from wavefront.patching import PatchError
from wavefront.patching.rules import FAMILIES as RULES

# RMSNorm modules per tiny model (2 layers): 2 per layer + final; Qwen3 adds q_norm/k_norm per layer;
# Gemma 2 has four per layer.
EXPECTED_NORMS = {"llama": 5, "mistral": 5, "qwen2": 5, "qwen3": 9, "gemma": 5, "gemma2": 9, "phi3": 5,
                  # Gemma 3: four per layer plus q/k norms; OLMo 2: post-norms and full-width q/k norms (no
                  # input norm); GLM-4: four per layer.
                  "gemma3_text": 13, "olmo2": 9, "granite": 5, "glm4": 9, "smollm3": 5, "llama4_text": 5,
                  "falcon_h1": 5, "qwen3_vl": 9,
                  # Qwen2.5-VL: the text tower's 5 and the vision tower's (two in its block, one in the merger)
                  "qwen2_5_vl": 8}
#: torch.nn.LayerNorms (any family): Qwen3-VL's vision tower (two per block, one in the merger).
EXPECTED_LAYER_NORMS = {"qwen3_vl": 3}


def test_every_family_has_rules_and_a_tiny_preset():
    # MoE families build their tiny configs in test_moe_patch.py (the harness has no MoE presets yet).
    assert sorted(f.name for f in RULES if f.moe is None) == sorted(EXPECTED_NORMS)


def test_report_lists_every_norm_replacement(family, tiny, norms_only, final_norm):
    model = tiny(family)
    report = wavefront.patch(model, **norms_only)
    assert report.family == family and report.ok
    n_layer_norms = EXPECTED_LAYER_NORMS.get(family, 0)
    assert report.counts() == {"rms_norm": EXPECTED_NORMS[family], **({"layer_norm": n_layer_norms} if n_layer_norms
                                                                      else {})}
    paths = {r.path for r in report.replacements if r.op == "rms_norm"}
    for path in paths:
        assert type(model.get_submodule(path)) is wavefront.nn.RMSNorm
    assert final_norm(family) in paths
    assert all(r.old_type.startswith("transformers.models.") and r.new_type == "wavefront.nn.norm.RMSNorm"
               for r in report.replacements if r.op == "rms_norm")
    assert [a.op for a in report.absent] == ([] if n_layer_norms else ["layer_norm"])
    assert final_norm(family) in str(report)


def test_gemma_norms_keep_offset_and_fp32_multiply(tiny, norms_only):
    report = wavefront.patch(model := tiny("gemma"), **norms_only)
    assert report.ok
    norm = model.model.norm
    assert (norm.offset, norm.cast) == (1.0, "gemma")
    assert type(tiny("llama").model.norm).__name__ == "LlamaRMSNorm"


class CustomRMSNorm(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


def test_unknown_norm_type_is_reported_and_strict_raises(tiny, norms_only):
    model = tiny("llama")
    model.model.layers[1].post_attention_layernorm = CustomRMSNorm(32)
    with pytest.raises(PatchError, match=r"unknown norm type .*CustomRMSNorm"):
        wavefront.patch(model, **norms_only)
    assert type(model.model.norm).__name__ == "LlamaRMSNorm", "a failed strict patch must leave the model as it was"

    report = wavefront.patch(model, **norms_only, strict=False)
    assert not report.ok
    (miss,) = report.unmatched
    assert (miss.op, miss.path) == ("rms_norm", "model.layers.1.post_attention_layernorm")
    assert report.counts() == {"rms_norm": 4}
    assert type(model.model.layers[1].post_attention_layernorm) is CustomRMSNorm


def test_layer_norm_modules_are_swapped_in_any_family(tiny, norms_only):
    model = tiny("llama")
    model.model.norm = nn.LayerNorm(32)
    report = wavefront.patch(model, **norms_only)
    assert [r.path for r in report.replacements if r.op == "layer_norm"] == ["model.norm"]
    assert type(model.model.norm) is wavefront.nn.LayerNorm


def test_missing_kernels_are_unmatched_with_the_reason(tiny):
    from wavefront import ops

    model = tiny("llama")
    report = wavefront.patch(model, strict=False)
    for name, op in (("rope", "rope"), ("swiglu", "mlp"), ("linear_cross_entropy", "loss")):
        if not hasattr(ops, name):
            assert any(u.op == op and f"wavefront.ops.{name} is not available" in u.reason for u in report.unmatched)


def test_bad_options_raise_before_touching_the_model(tiny):
    model = tiny("llama")
    with pytest.raises(TypeError, match="rmsnorm"):
        wavefront.patch(model, rmsnorm=True)
    with pytest.raises(TypeError, match="'rope' must be True or False"):
        wavefront.patch(model, rope="yes")
    with pytest.raises(TypeError, match="Hugging Face"):
        wavefront.patch(nn.Linear(2, 2))
    assert type(model.model.norm).__name__ == "LlamaRMSNorm"


def test_double_patch_and_unpatched_unpatch_raise(tiny, norms_only):
    model = tiny("llama")
    with pytest.raises(ValueError, match="not patched"):
        wavefront.unpatch(model)
    wavefront.patch(model, **norms_only)
    with pytest.raises(ValueError, match="already patched"):
        wavefront.patch(model, **norms_only)


def test_model_type_without_rules():
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=32))
    with pytest.raises(PatchError, match="no rules for model_type 'gpt2'"):
        wavefront.patch(model)
    report = wavefront.patch(model, rope=False, mlp=False, loss=False, rms_norm=False, strict=False)
    assert report.family is None and report.counts() == {"layer_norm": 3}
