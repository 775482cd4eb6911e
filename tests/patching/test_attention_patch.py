"""attention=True: the attention function is wavefront.ops.attention, selected through transformers'
AttentionInterface on the patched instance only; the model computes the same thing."""

from __future__ import annotations

import copy

import pytest
import torch

import wavefront
from wavefront.patching import PatchError
from wavefront.workbench.distributed.train.presets import TINY_BY_FAMILY, build_model


def _sdpa(family: str, seed: int = 0, **overrides):
    return build_model(TINY_BY_FAMILY[family], seed=seed, attn_implementation="sdpa", **overrides)


def test_attention_patch_matches_unpatched_forward_and_backward():
    model = _sdpa("llama", num_hidden_layers=1)  # every layer is patched alike: one shows the numerics
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


def test_attention_patch_is_instance_scoped_and_reverts(tiny):
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from wavefront.patching.attention import IMPLEMENTATION

    before = {k: v for k, v in ALL_ATTENTION_FUNCTIONS.items() if k != IMPLEMENTATION}
    model, other = _sdpa("llama"), _sdpa("llama")
    ids = torch.randint(0, 128, (1, 6), generator=torch.Generator().manual_seed(4))
    other_out = other(input_ids=ids).logits
    with wavefront.patching.patched(model, attention=True) as report:
        assert report.counts()["attention"] == model.config.num_hidden_layers
        assert model.config._attn_implementation == IMPLEMENTATION
        assert other.config._attn_implementation == "sdpa", "another instance keeps its implementation"
        assert {k: v for k, v in ALL_ATTENTION_FUNCTIONS.items() if k != IMPLEMENTATION} == before
        torch.testing.assert_close(other(input_ids=ids).logits, other_out, rtol=0, atol=0)
    assert model.config._attn_implementation == "sdpa"
    assert type(model.model.layers[0].self_attn).__name__ == "LlamaAttention"


def test_eager_models_switch_and_switch_back_and_softcapped_families_are_reported(tiny):
    model = _sdpa("llama", num_hidden_layers=1)
    model.set_attn_implementation("eager")
    ref = copy.deepcopy(model)
    ids = torch.randint(0, 128, (2, 7), generator=torch.Generator().manual_seed(5))
    wavefront.patch(model, attention=True, rope=False, mlp=False, loss=False, rms_norm=False)
    torch.testing.assert_close(model(input_ids=ids).logits, ref(input_ids=ids).logits, rtol=1e-4, atol=1e-5)
    wavefront.unpatch(model)
    assert model.config._attn_implementation == "eager"
    with pytest.raises(PatchError, match="softcaps attention scores"):
        wavefront.patch(_sdpa("gemma2"), attention=True)


def test_padding_mask_is_refused_not_ignored():
    model = _sdpa("llama")
    wavefront.patch(model, attention=True, rope=False, mlp=False, loss=False)
    ids = torch.randint(0, 128, (2, 6), generator=torch.Generator().manual_seed(6))
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    with pytest.raises(NotImplementedError, match="explicit attention_mask is not supported"):
        model(input_ids=ids, attention_mask=mask)
