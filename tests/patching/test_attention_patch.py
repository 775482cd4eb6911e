"""attention=True: the attention function of each attention module is served by wavefront.ops.attention,
instance-scoped (transformers' registry and config untouched), and the model computes the same thing."""

from __future__ import annotations

import copy

import pytest
import torch

import wavefront
from wavefront.patching import PatchError
from wavefront.workbench.distributed.train.presets import TINY_BY_FAMILY, build_model


def _sdpa(family: str, seed: int = 0):
    return build_model(TINY_BY_FAMILY[family], seed=seed, attn_implementation="sdpa")


def test_attention_patch_matches_unpatched_forward_and_backward():
    model = _sdpa("llama")
    assert model.config._attn_implementation == "sdpa"
    ref = copy.deepcopy(model)
    report = wavefront.patch(model, attention=True, loss=False)
    swapped = [r for r in report.replacements if "attention" in r.op]
    assert len(swapped) == model.config.num_hidden_layers
    ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(3))
    out, out_ref = model(input_ids=ids).logits, ref(input_ids=ids).logits
    torch.testing.assert_close(out, out_ref, rtol=1e-4, atol=1e-5)
    out.square().mean().backward()
    out_ref.square().mean().backward()
    for (name, p), p_ref in zip(model.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, p_ref.grad, rtol=1e-3, atol=1e-6, msg=name)


def test_attention_patch_leaves_transformers_and_other_models_alone(tiny):
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS  # noqa: F401  (imports cleanly)
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    before = dict(ALL_ATTENTION_FUNCTIONS)
    model, other = _sdpa("llama"), _sdpa("llama")
    with wavefront.patching.patched(model, attention=True):
        assert dict(ALL_ATTENTION_FUNCTIONS) == before
        assert type(other.model.layers[0].self_attn).__name__ == "LlamaAttention"
    assert type(model.model.layers[0].self_attn).__name__ == "LlamaAttention"


def test_eager_attention_models_and_softcapped_families_are_reported(tiny):
    model = tiny("llama")
    model.config._attn_implementation = "eager"
    with pytest.raises(PatchError, match="attn_implementation='sdpa'"):
        wavefront.patch(model, attention=True)
    assert type(model.model.layers[0].self_attn).__name__ == "LlamaAttention", "a strict failure rolls back"
    report = wavefront.patch(_sdpa("gemma2"), attention=True, strict=False)
    assert any(u.op == "attention" for u in report.unmatched)
