"""cross_entropy(grad_in_forward=True): the gradient computed in the forward launch, the backward touching a
row only when the upstream gradient is not the one assumed; exactness, scaled losses, traffic, host syncs."""

from __future__ import annotations

import importlib

import pytest
import torch
from _host_sync import host_syncs

from wavefront import reference
from wavefront.ops import REGISTRY, cross_entropy
from wavefront.ops._spec import Case
from wavefront.workbench.static import traffic as tr

ce_mod = importlib.import_module("wavefront.ops.cross_entropy")


def _data(n_rows, n_classes, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    logits = (torch.randn(n_rows, n_classes, generator=gen) * 3).to(dtype)
    target = torch.randint(0, n_classes, (n_rows,), generator=gen)
    target[::3] = -100
    return logits, target


def _loss_and_grad(logits, target, upstream, **kw):
    x = logits.clone().requires_grad_()
    loss = cross_entropy(x, target, **kw)
    loss.backward(torch.full_like(loss, upstream))
    return loss.detach(), x.grad


# 300: one block in registers; 20000: wider than the single-pass limit (statistics loop, then the gradient).
@pytest.mark.parametrize("n_classes", [300, 20000])
@pytest.mark.parametrize(("reduction", "opts"), [("mean", {}), ("sum", {}), ("none", {}),
                                                 ("sum", {"divisor": 7.0}),
                                                 ("mean", {"label_smoothing": 0.1, "z_loss": 1e-3,
                                                           "softcap": 20.0})])
def test_unit_upstream_gives_the_default_paths_gradient_bit_for_bit(n_classes, reduction, opts):
    """loss.backward() as returned: the stored gradient is the default backward's (same kernel code and the
    same scale, built by the same tensor operations as autograd's), and the backward leaves it untouched."""
    logits, target = _data(5, n_classes)
    loss0, grad0 = _loss_and_grad(logits, target, 1.0, reduction=reduction, **opts)
    loss1, grad1 = _loss_and_grad(logits, target, 1.0, reduction=reduction, grad_in_forward=True, **opts)
    assert torch.equal(loss0, loss1)
    assert torch.equal(grad0, grad1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("upstream", [0.37, 2.0, 65536.0])
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_scaled_loss_still_gets_its_exact_gradient(dtype, upstream, reduction):
    """A caller that scales the loss (accumulation divisor, GradScaler, a weight): the rows are rescaled in
    the backward; against float64, the error stays within twice eager's in the same dtype."""
    logits, target = _data(6, 1000, dtype)
    _, ours = _loss_and_grad(logits, target, upstream, reduction=reduction, grad_in_forward=True)
    x = logits.clone().requires_grad_()
    torch.nn.functional.cross_entropy(x, target, reduction=reduction).backward(
        torch.full((6,) if reduction == "none" else (), upstream, dtype=dtype))
    eager = x.grad
    x64 = logits.double().requires_grad_()
    reference.cross_entropy(x64, target, reduction=reduction).backward(
        torch.full((6,) if reduction == "none" else (), upstream, dtype=torch.float64))
    err_ours = (ours.double() - x64.grad).abs().max().item()
    err_eager = (eager.double() - x64.grad).abs().max().item()
    assert err_ours <= 2 * err_eager + 1e-7 * upstream, (err_ours, err_eager)


def test_power_of_two_scale_is_exact():
    logits, target = _data(6, 1000, torch.bfloat16)
    _, g1 = _loss_and_grad(logits, target, 1.0, grad_in_forward=True)
    _, g4 = _loss_and_grad(logits, target, 4.0, grad_in_forward=True)
    assert torch.equal(g4, g1 * 4)


def test_per_row_upstream_rescales_only_those_rows():
    logits, target = _data(6, 500)
    x = logits.clone().requires_grad_()
    loss = cross_entropy(x, target, reduction="none", grad_in_forward=True)
    dy = torch.ones(6)
    dy[4] = 3.0
    loss.backward(dy)
    _, ref = _loss_and_grad(logits, target, 1.0, reduction="none")
    assert torch.equal(x.grad[:4], ref[:4]) and torch.equal(x.grad[5:], ref[5:])
    torch.testing.assert_close(x.grad[4], 3 * ref[4])


def test_nan_upstream_propagates():
    logits, target = _data(4, 200)
    _, g = _loss_and_grad(logits, target, float("nan"), grad_in_forward=True)
    assert torch.isnan(g[target != -100]).all()


def test_backward_runs_once_and_leaf_logits_are_fine():
    logits, target = _data(4, 200)
    leaf = logits.clone().requires_grad_()  # a leaf: allowed (the logits are not overwritten)
    loss = cross_entropy(leaf, target, grad_in_forward=True)
    assert torch.equal(leaf.detach(), logits)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="grad_in_forward=True the backward can run only once"):
        loss.backward()


def test_no_grad_and_off_paths_unchanged():
    logits, target = _data(4, 200)
    with torch.no_grad():
        assert torch.equal(cross_entropy(logits, target, grad_in_forward=True), cross_entropy(logits, target))


def test_no_host_sync(monkeypatch):
    monkeypatch.setattr(ce_mod, "check_target", lambda *a, **k: None)
    logits, target = _data(8, 300)
    x = logits.clone().requires_grad_()
    with host_syncs() as calls:
        loss = cross_entropy(x, target, grad_in_forward=True, label_smoothing=0.1)
        (loss * 3).backward()
    assert calls == []


def _passes(n_cols: int, **opts) -> dict[str, float | None]:
    spec = REGISTRY["cross_entropy"]
    o = dict(opts, ignore_frac=0.0)
    small = tr.measure_case(spec, Case("t", "t", {"n_rows": 8, "n_cols": n_cols}, o), torch.bfloat16, eager=False)
    tall = tr.measure_case(spec, Case("t", "t", {"n_rows": 16, "n_cols": n_cols}, o), torch.bfloat16, eager=False)
    return {m: tr.hbm_passes(small[m][0], tall[m][0], 8, n_cols) for m in small}


def test_traffic_reads_the_logits_once():
    """Counted under the interpreter (loss.backward() with upstream 1): the default forward and backward read
    each row once each (2 passes); with the gradient in the forward, once in all (the backward reads 8 B per
    row). Rows wider than the single-pass limit read twice in that forward launch (cache-less count)."""
    assert _passes(4096) == {"fwd": 1.0, "bwd": 1.0}
    assert _passes(4096, grad_in_forward=True) == {"fwd": 1.0, "bwd": 0.0}
    assert _passes(20000, grad_in_forward=True) == {"fwd": 2.0, "bwd": 0.0}
