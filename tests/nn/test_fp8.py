"""wavefront.nn.Float8Linear: nn.Linear's parameters and checkpoint layout, the FP8 op in forward and
backward, from_linear sharing the layer's Parameters."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from wavefront import ops
from wavefront.nn import Float8Linear


def _linear(bias=True, dtype=torch.bfloat16):
    torch.manual_seed(0)
    return nn.Linear(48, 40, bias=bias, dtype=dtype)


def test_state_dict_is_nn_linears():
    lin = _linear()
    f8 = Float8Linear(48, 40, dtype=torch.bfloat16)
    assert f8.state_dict().keys() == lin.state_dict().keys()
    f8.load_state_dict(lin.state_dict())
    back = _linear()
    back.load_state_dict(f8.state_dict())
    for k, v in lin.state_dict().items():
        assert torch.equal(back.state_dict()[k], v) and f8.state_dict()[k].dtype == v.dtype


@pytest.mark.parametrize("bias", [True, False])
def test_from_linear_shares_parameters_and_runs_the_fp8_op(bias):
    lin = _linear(bias)
    f8 = Float8Linear.from_linear(lin, recipe="blockwise")
    assert f8.weight is lin.weight and f8.bias is lin.bias
    x = torch.randn(2, 5, 48, generator=torch.Generator().manual_seed(1)).bfloat16().requires_grad_()
    y = f8(x)
    assert torch.equal(y, ops.linear_fp8(x, lin.weight, lin.bias, recipe="blockwise"))
    y.float().square().sum().backward()
    assert lin.weight.grad is not None and x.grad is not None
    assert (bias and lin.bias.grad is not None) or not bias
    rel = (y.float() - lin(x).float()).norm() / lin(x).float().norm()
    assert 1e-3 < float(rel) < 0.1, "FP8 rounding: a few percent from the bf16 layer"
    assert "recipe='blockwise'" in repr(f8)


def test_bad_arguments():
    with pytest.raises(ValueError, match="'recipe' must be one of"):
        Float8Linear(4, 4, recipe="delayed")
    with pytest.raises(ValueError, match="'provider' must be one of"):
        Float8Linear(4, 4, provider="cublas")
    with pytest.raises(TypeError, match="must be a torch.nn.Linear"):
        Float8Linear.from_linear(nn.Conv1d(4, 4, 1))
