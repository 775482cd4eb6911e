"""Patching keeps the checkpoint layout, and unpatch restores the exact original modules."""

from __future__ import annotations

import copy

import torch

import wavefront
from wavefront.patching import patched


def _same_state(a: dict, b: dict) -> None:
    assert list(a) == list(b)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0, msg=k)


def test_state_dict_keys_and_tensors_unchanged(family, tiny, norms_only):
    model = tiny(family)
    before = copy.deepcopy(model.state_dict())
    wavefront.patch(model, **norms_only)
    _same_state(model.state_dict(), before)


def test_checkpoint_round_trip_patched_to_unpatched_and_back(family, tiny, norms_only):
    trained = tiny(family, seed=1)
    wavefront.patch(trained, **norms_only)
    ids = torch.randint(0, 128, (1, 8), generator=torch.Generator().manual_seed(0))
    loss = trained(input_ids=ids, labels=ids).loss
    loss.backward()
    with torch.no_grad():
        for p in trained.parameters():
            if p.grad is not None:  # a vision tower gets none from text
                p -= 0.1 * p.grad
    saved = copy.deepcopy(trained.state_dict())

    plain = tiny(family, seed=2)
    plain.load_state_dict(saved, strict=True)
    _same_state(plain.state_dict(), saved)

    repatched = tiny(family, seed=3)
    wavefront.patch(repatched, **norms_only)
    repatched.load_state_dict(plain.state_dict(), strict=True)
    _same_state(repatched.state_dict(), saved)


def test_unpatch_restores_exact_modules_and_trained_values(family, tiny, norms_only):
    model = tiny(family)
    originals = {name: m for name, m in model.named_modules()}
    types_before = {name: type(m) for name, m in originals.items()}
    wavefront.patch(model, **norms_only)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    after_training = copy.deepcopy(model.state_dict())
    wavefront.unpatch(model)
    now = dict(model.named_modules())
    assert list(now) == list(originals)
    for name, m in now.items():
        assert m is originals[name], name
        assert type(m) is types_before[name], name
    _same_state(model.state_dict(), after_training)
    assert not wavefront.patching.is_patched(model)


def test_patched_model_matches_unpatched_forward_and_backward(family, tiny, norms_only, final_norm):
    model = tiny(family, num_hidden_layers=1)  # a layer's norms and the final norm; more layers repeat them
    ref = copy.deepcopy(model)
    ids = torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(0))
    with patched(model, **norms_only) as report:
        assert report.ok
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
    ref_loss = ref(input_ids=ids, labels=ids).loss
    ref_loss.backward()
    torch.testing.assert_close(loss, ref_loss)
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=name)
    assert type(model.get_submodule(final_norm(family))).__module__.startswith("transformers.")


def test_unpatch_after_assign_load_keeps_the_loaded_values(tiny, norms_only):
    model = tiny("llama")
    wavefront.patch(model, **norms_only)
    fresh = {k: torch.full_like(v, 0.5) for k, v in model.state_dict().items()}
    model.load_state_dict(fresh, assign=True)
    wavefront.unpatch(model)
    assert torch.equal(model.model.norm.weight, torch.full((32,), 0.5))
