"""What each family's rules take and what they leave alone, where a family's modules are not plain Llama ones
(docs/patching.md, "Families"). The numerics of every family are proved in test_convergence.py."""

from __future__ import annotations

import pytest
import torch

import wavefront
from wavefront.patching import PatchError
from wavefront.patching.mlp import GatedMLP


def _norms(model) -> dict[str, wavefront.nn.RMSNorm]:
    return {path: m for path, m in model.named_modules() if isinstance(m, wavefront.nn.RMSNorm)}


@pytest.mark.parametrize(("family", "offset", "cast", "qk_norm_width"), [
    ("gemma3_text", 1.0, "gemma", 8),  # per-head q/k norms over head_dim, (1 + w) in fp32
    ("olmo2", 0.0, "gemma", 32),       # q/k norms over the whole projection (4 heads x 8), (w * xhat).to(dtype)
])
def test_norm_conventions_and_qk_norms(tiny, norms_only, family, offset, cast, qk_norm_width):
    model = tiny(family, num_hidden_layers=1)
    wavefront.patch(model, **norms_only)
    norms = _norms(model)
    assert {(m.offset, m.cast) for m in norms.values()} == {(offset, cast)}
    q_norm = norms["model.layers.0.self_attn.q_norm"]
    assert q_norm.hidden_size == qk_norm_width


def test_olmo2_has_post_norms_and_no_fp8_producers(tiny, norms_only):
    model = tiny("olmo2", num_hidden_layers=1)
    wavefront.patch(model, **norms_only)
    layer = sorted(p.rpartition(".")[2] for p in _norms(model) if p.startswith("model.layers.0."))
    assert layer == ["k_norm", "post_attention_layernorm", "post_feedforward_layernorm", "q_norm"]
    assert wavefront.patching.rules.family_for("olmo2").fp8_producers == ()


def test_falcon_h1_mlp_carries_its_mup_multipliers_and_the_mixer_is_left_alone(tiny):
    model = tiny("falcon_h1", num_hidden_layers=1)
    mixer = type(model.model.layers[0].mamba)
    report = wavefront.patch(model, loss=False)
    mlp = model.model.layers[0].feed_forward
    assert isinstance(mlp, GatedMLP)
    assert mlp.options == {"gate_multiplier": 0.6, "output_multiplier": 1.4}
    assert type(model.model.layers[0].mamba) is mixer
    assert report.ok and not any(r.path.startswith("model.layers.0.mamba") for r in report.replacements)


def test_llama4_l2_norms_are_left_alone_and_not_reported(tiny):
    model = tiny("llama4_text", num_hidden_layers=1)
    l2 = {p: type(m) for p, m in model.named_modules() if type(m).__name__ == "Llama4TextL2Norm"}
    assert l2, "the tiny preset must have q/k L2 norms (use_qk_norm)"
    report = wavefront.patch(model, rope=False, moe=False)
    assert report.ok, str(report)
    assert {p: type(model.get_submodule(p)) for p in l2} == l2
    assert not any(r.path in l2 for r in report.replacements)


@pytest.mark.parametrize(("family", "refused"), [
    ("glm4", {"rope": "interleaved"}),
    ("granite", {"loss": "logits_scaling"}),
    ("falcon_h1", {"loss": "lm_head_multiplier"}),
    ("llama4_text", {"rope": "freqs_cis", "moe": "sigmoid router", "attention": "chunks attention"}),
    ("gemma3_text", {"attention": "sliding-window"}),
])
def test_strict_patch_refuses_what_the_rules_do_not_cover_and_leaves_the_model_unpatched(tiny, family, refused):
    model = tiny(family, num_hidden_layers=1)
    before = {p: type(m) for p, m in model.named_modules()}
    with pytest.raises(PatchError) as err:
        wavefront.patch(model, **dict.fromkeys(refused, True))
    unmatched = {u.op: u.reason for u in err.value.report.unmatched}
    assert set(unmatched) == set(refused)
    assert all(why in unmatched[op] for op, why in refused.items()), unmatched
    assert {p: type(m) for p, m in model.named_modules()} == before
    assert not wavefront.patching.is_patched(model)


def test_multiplier_config_of_the_wrong_shape_is_unmatched(tiny):
    model = tiny("falcon_h1", num_hidden_layers=1)
    model.config.mlp_multipliers = [0.5]
    with pytest.raises(PatchError, match=r"config.mlp_multipliers to be \(gate multiplier, output multiplier\)"):
        wavefront.patch(model, loss=False)
    assert torch.is_tensor(model(input_ids=torch.tensor([[1, 2, 3]])).logits)
