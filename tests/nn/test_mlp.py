"""SwiGLUMLP / GeGLUMLP: Hugging Face's state dict keys and rounding, against a replica of their MLP."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from wavefront.nn import GeGLUMLP, SwiGLUMLP


class HFStyleMLP(nn.Module):
    """The shape of transformers' LlamaMLP / GemmaMLP forward (written out: transformers is not a test
    dependency)."""

    def __init__(self, hidden, inter, act):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)
        self.act_fn = act

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


@pytest.mark.parametrize(("ours_cls", "act", "kwargs"), [
    (SwiGLUMLP, nn.SiLU(), {}),
    (GeGLUMLP, nn.GELU(approximate="tanh"), {}),
    (GeGLUMLP, nn.GELU(), {"approximate": "none"}),
])
def test_checkpoint_and_bf16_outputs_match_hf(ours_cls, act, kwargs):
    torch.manual_seed(0)
    hf = HFStyleMLP(64, 176, act).to(torch.bfloat16)
    ours = ours_cls(64, 176, dtype=torch.bfloat16, **kwargs)
    assert set(ours.state_dict()) == set(hf.state_dict())
    ours.load_state_dict(hf.state_dict())
    x = torch.randn(3, 5, 64, dtype=torch.bfloat16)
    # Same rounding order as the module it replaces; the activation's own last bit may differ from
    # torch's, so: at least as accurate as the HF module against a float64 run of the same weights.
    hf64 = HFStyleMLP(64, 176, act).double()
    hf64.load_state_dict(hf.state_dict())
    ref = hf64(x.double())
    err_ours = (ours(x).double() - ref).abs().max()
    err_hf = (hf(x).double() - ref).abs().max()
    assert err_ours <= 2 * err_hf + torch.finfo(torch.bfloat16).eps * ref.abs().max()
    hf2 = HFStyleMLP(64, 176, act).to(torch.bfloat16)
    hf2.load_state_dict(ours.state_dict())
    assert torch.equal(hf2(x), hf(x))


def test_gradients_match_hf_in_fp32():
    torch.manual_seed(1)
    hf = HFStyleMLP(32, 80, nn.SiLU())
    ours = SwiGLUMLP(32, 80)
    ours.load_state_dict(hf.state_dict())
    x = torch.randn(6, 32)
    dy = torch.randn(6, 32)
    ours(x).backward(dy)
    hf(x).backward(dy)
    for name, p in ours.named_parameters():
        torch.testing.assert_close(p.grad, dict(hf.named_parameters())[name].grad, rtol=1e-5, atol=1e-6)


def test_bias_and_bad_approximate():
    m = SwiGLUMLP(8, 16, bias=True)
    assert {"gate_proj.bias", "up_proj.bias", "down_proj.bias"} <= set(m.state_dict())
    x = torch.randn(2, 8)
    expect = m.down_proj(F.silu(m.gate_proj(x)) * m.up_proj(x))
    torch.testing.assert_close(m(x), expect)
    with pytest.raises(ValueError, match="GeGLUMLP: argument 'approximate' must be one of"):
        GeGLUMLP(8, 16, approximate="erf")


class FalconH1StyleMLP(HFStyleMLP):
    """The shape of transformers' FalconH1MLP forward: ``down(up * act(gate * m_g)) * m_d``."""

    def __init__(self, hidden, inter, act, m_g, m_d):
        super().__init__(hidden, inter, act)
        self.m_g, self.m_d = m_g, m_d

    def forward(self, x):
        return self.down_proj(self.up_proj(x) * self.act_fn(self.gate_proj(x) * self.m_g)) * self.m_d


def test_mup_multipliers_match_falcon_h1_mlp():
    torch.manual_seed(2)
    hf = FalconH1StyleMLP(32, 80, nn.SiLU(), 0.35, 1.6)
    ours = SwiGLUMLP(32, 80, gate_multiplier=0.35, output_multiplier=1.6)
    ours.load_state_dict(hf.state_dict())
    assert set(ours.state_dict()) == set(hf.state_dict())
    x = torch.randn(6, 32, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    dy = torch.randn(6, 32)
    # fp32: the output multiplier is applied before the down projection instead of after: ulp-level apart.
    torch.testing.assert_close(ours(x), hf(x2))
    ours(x).backward(dy)
    hf(x2).backward(dy)
    torch.testing.assert_close(x.grad, x2.grad)
    for name, p in ours.named_parameters():
        torch.testing.assert_close(p.grad, dict(hf.named_parameters())[name].grad)
    assert "gate_multiplier=0.35" in repr(ours) and "multiplier" not in repr(SwiGLUMLP(8, 16))
