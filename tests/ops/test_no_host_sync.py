"""No op synchronizes with the host in its forward or backward (#16): every registered op, one case each,
forward and backward under the host-sync detector. The value checks that run only on CPU tensors (free
there) are switched to their GPU behaviour; varlen attention's device-side check is tested in
test_attention.py, rope's in test_rope.py."""

from __future__ import annotations

import importlib

import pytest
import torch
from _host_sync import host_syncs

from wavefront.ops import REGISTRY

ce_ops = importlib.import_module("wavefront.ops.cross_entropy")  # the module, not the function


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_forward_and_backward_make_no_host_sync(name, monkeypatch):
    monkeypatch.setattr(ce_ops, "values_checkable", lambda t: False)  # what a CUDA tensor gets
    spec = REGISTRY[name]
    case = next(c for c in spec.cases if not c.slow)
    inputs = spec.make_inputs(case, torch.float32, "cpu", torch.Generator().manual_seed(0))
    args = [a.detach().clone().requires_grad_(True) if i in inputs.grad_argnums else a
            for i, a in enumerate(inputs.args)]
    with host_syncs() as calls:
        out = spec.fn(*args, **inputs.kwargs)
        outs = out if isinstance(out, tuple) else (out,)
        diff = [o for o in outs if isinstance(o, torch.Tensor) and o.requires_grad]
        if spec.has_backward and diff:
            sum(o.float().sum() for o in diff).backward()
    assert calls == [], f"{name}/{case.name}: host syncs at {calls}"
    if spec.has_backward and diff:
        assert any(args[i].grad is not None for i in inputs.grad_argnums), "the backward ran"


@pytest.mark.parametrize("name", ["cross_entropy", "linear_cross_entropy"])
def test_loss_outputs_make_no_host_sync(name, monkeypatch):
    """The z-loss term, predicted tokens and token accuracy stay on the device (the registry's `outputs` case:
    class weights, PaLM's z-loss rescaling them on the device, every return_* option)."""
    monkeypatch.setattr(ce_ops, "values_checkable", lambda t: False)
    spec = REGISTRY[name]
    case = next(c for c in spec.cases if c.name == "outputs")
    inputs = spec.make_inputs(case, torch.float32, "cpu", torch.Generator().manual_seed(0))
    args = [a.detach().clone().requires_grad_(True) if i in inputs.grad_argnums else a
            for i, a in enumerate(inputs.args)]
    with host_syncs() as calls:
        out = spec.fn(*args, **inputs.kwargs)
        out.loss.backward()
    assert calls == [], f"{name}/{case.name}: host syncs at {calls}"
    assert out.z_loss is not None and out.token_accuracy is not None and out.predicted_tokens is not None
