"""wavefront.nn norms: state_dict layout identical to torch.nn, and the same outputs."""

from __future__ import annotations

import torch

import wavefront.nn as wnn


def test_rms_norm_state_dict_round_trips_with_torch_nn():
    ours = wnn.RMSNorm(96, eps=1e-5)
    theirs = torch.nn.RMSNorm(96, eps=1e-5)
    assert set(ours.state_dict()) == set(theirs.state_dict()) == {"weight"}
    theirs.weight.data.normal_()
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(3, 96)
    torch.testing.assert_close(ours(x), theirs(x), rtol=1e-5, atol=1e-5)
    theirs.load_state_dict(ours.state_dict())


def test_gemma_style_rms_norm_starts_at_identity_scale():
    m = wnn.RMSNorm(64, offset=1.0, cast="gemma")
    assert torch.equal(m.weight, torch.zeros(64))
    x = torch.randn(2, 64)
    torch.testing.assert_close(m(x), torch.nn.functional.rms_norm(x, (64,), eps=1e-6), rtol=1e-5, atol=1e-5)


def test_layer_norm_state_dict_and_outputs_match_torch_nn():
    ours = wnn.LayerNorm(80)
    theirs = torch.nn.LayerNorm(80)
    with torch.no_grad():
        theirs.weight.normal_()
        theirs.bias.normal_()
    assert set(ours.state_dict()) == set(theirs.state_dict()) == {"weight", "bias"}
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(5, 80, requires_grad=True)
    torch.testing.assert_close(ours(x), theirs(x), rtol=1e-5, atol=1e-5)
    no_bias = wnn.LayerNorm(80, bias=False)
    assert set(no_bias.state_dict()) == set(torch.nn.LayerNorm(80, bias=False).state_dict())
