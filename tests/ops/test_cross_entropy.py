"""cross_entropy beyond the registry's accuracy sweep: semantics, reductions, in-place opt-in, host syncs,
bad input, and the kernel's behaviour on out-of-range targets."""

from __future__ import annotations

import importlib

import pytest
import torch
import torch.nn.functional as F
from _host_sync import host_syncs

from wavefront.ops import cross_entropy

# The package re-exports the function under the module's name; reach the module itself.
ce_mod = importlib.import_module("wavefront.ops.cross_entropy")


def _data(n_rows=12, n_classes=300, seed=0, ignore_every=4, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    logits = (torch.randn(n_rows, n_classes, generator=gen) * 2).to(device)
    target = torch.randint(0, n_classes, (n_rows,), generator=gen)
    target[::ignore_every] = -100
    return logits, target.to(device)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("smoothing", [0.0, 0.15])
@pytest.mark.parametrize("weighted", [False, True])
def test_same_definition_as_torch(reduction, smoothing, weighted, device):
    logits, target = _data(device=device)
    weight = None
    if weighted:
        weight = torch.rand(logits.shape[1], generator=torch.Generator().manual_seed(1)).to(device) + 0.2
    ours_in = logits.clone().requires_grad_()
    torch_in = logits.clone().requires_grad_()
    ours = cross_entropy(ours_in, target, weight=weight, label_smoothing=smoothing, reduction=reduction)
    expect = F.cross_entropy(torch_in, target, weight=weight, label_smoothing=smoothing, reduction=reduction)
    torch.testing.assert_close(ours, expect, rtol=2e-6, atol=2e-6)
    dy = torch.randn(ours.shape, generator=torch.Generator().manual_seed(2)).to(device)
    ours.backward(dy)
    expect.backward(dy)
    torch.testing.assert_close(ours_in.grad, torch_in.grad, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_all_ignored_gives_zero_loss_and_zero_grad(reduction, device):
    logits, target = _data(device=device)
    target.fill_(-100)
    x = logits.clone().requires_grad_()
    loss = cross_entropy(x, target, reduction=reduction, label_smoothing=0.1, z_loss=1e-3)
    loss.backward()
    assert loss.item() == 0.0
    assert torch.count_nonzero(x.grad) == 0
    # The difference from torch, on purpose: F.cross_entropy's mean is 0/0.
    assert torch.isnan(F.cross_entropy(logits, target, reduction="mean"))


def test_custom_ignore_index_and_int32_targets(device):
    logits, target = _data(device=device)
    target = torch.where(target == -100, torch.full_like(target, 7), target)
    target[::4] = 5
    ours = cross_entropy(logits, target.to(torch.int32), ignore_index=5)
    torch.testing.assert_close(ours, F.cross_entropy(logits, target, ignore_index=5), rtol=2e-6, atol=2e-6)


def test_default_path_leaves_logits_untouched(device):
    # Liger #272 / Unsloth #5002: a gradient written into the logits corrupts a tensor the caller still uses.
    logits, target = _data(device=device)
    x = logits.clone().requires_grad_()
    cross_entropy(x, target, label_smoothing=0.1, softcap=10.0).backward()
    assert torch.equal(x.detach(), logits)


def test_inplace_backward_is_opt_in_and_matches(device):
    logits, target = _data(n_classes=20000, device=device)
    base = logits.clone().requires_grad_()
    loss = cross_entropy(base, target, softcap=15.0, z_loss=1e-3)
    loss.backward(torch.tensor(0.7))
    inner = logits.clone().requires_grad_()
    x = inner * 1.0  # a non-leaf, as lm_head outputs are
    loss_inplace = cross_entropy(x, target, softcap=15.0, z_loss=1e-3, inplace_backward=True)
    # Documented behaviour: the logits buffer now holds the per-row gradient.
    assert not torch.equal(x.detach(), logits)
    loss_inplace.backward(torch.tensor(0.7))
    torch.testing.assert_close(loss_inplace, loss)
    torch.testing.assert_close(inner.grad, base.grad, rtol=1e-5, atol=1e-8)


def test_mean_path_makes_no_host_sync(monkeypatch, device):
    # The detector works: the CPU-only target range check syncs by design (bool of a tensor; free on the
    # CPU, skipped on GPUs) and is caught.
    with host_syncs() as calls:
        ce_mod.check_target("t", torch.tensor([0, 1]), (2,), 4, -100, "cpu", "")
    assert any("__bool__" in c for c in calls)
    # Everything else on the mean path (denominator, reduction, kernels, backward) must not sync.
    monkeypatch.setattr(ce_mod, "check_target", lambda *a, **k: None)
    logits, target = _data(device=device)
    weight = torch.rand(logits.shape[1]).to(device) + 0.5
    x = logits.clone().requires_grad_()
    with host_syncs() as calls:
        loss = cross_entropy(x, target, weight=weight, label_smoothing=0.1)
        loss.backward()
    assert calls == []


def test_divisor_gives_gradient_accumulation(device):
    # Two micro-batches with reduction="sum", divisor = non-ignored tokens of the whole batch, sum to the
    # full batch's mean (Hugging Face's num_items_in_batch), loss and gradient.
    logits, target = _data(n_rows=16, device=device)
    full = logits.clone().requires_grad_()
    cross_entropy(full, target).backward()
    n_items = (target != -100).sum()
    parts = logits.clone().requires_grad_()
    total = 0.0
    for rows in (slice(0, 7), slice(7, 16)):
        loss = cross_entropy(parts[rows], target[rows], reduction="sum", divisor=n_items)
        loss.backward()
        total = total + loss.detach()
    torch.testing.assert_close(total, cross_entropy(logits, target))
    torch.testing.assert_close(parts.grad, full.grad)
    as_float = cross_entropy(logits, target, reduction="sum", divisor=float(n_items))
    torch.testing.assert_close(as_float, total)


def test_none_reduction_keeps_batch_shape(device):
    logits = torch.randn(2, 3, 50).to(device)
    target = torch.randint(0, 50, (2, 3)).to(device)
    out = cross_entropy(logits, target, reduction="none")
    assert out.shape == (2, 3)
    torch.testing.assert_close(out, F.cross_entropy(logits.reshape(6, 50), target.reshape(6), reduction="none")
                               .reshape(2, 3), rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"target": torch.tensor([0, 1, 50, 2])}, ValueError, r"'target' has values outside \[0, 50\).*50 at flat index 2"),
    ({"target": torch.tensor([0, -3, 1, 2])}, ValueError, r"'target' has values outside"),
    ({"target": torch.zeros(4)}, TypeError, r"'target' must have dtype"),
    ({"target": torch.zeros(5, dtype=torch.long)}, ValueError, r"'target' must have shape \(4,\)"),
    ({"softcap": 0.0}, ValueError, r"'softcap' must be > 0"),
    ({"softcap": -1.0}, ValueError, r"'softcap' must be > 0"),
    ({"label_smoothing": 1.0}, ValueError, r"'label_smoothing' must be in \[0, 1\)"),
    ({"label_smoothing": -0.1}, ValueError, r"'label_smoothing' must be in \[0, 1\)"),
    ({"z_loss": -1e-4}, ValueError, r"'z_loss' must be >= 0"),
    ({"reduction": "avg"}, ValueError, r"'reduction' must be one of"),
    ({"divisor": 3.0}, ValueError, r"'divisor' needs reduction='sum'"),
    ({"divisor": 0, "reduction": "sum"}, ValueError, r"'divisor' must be non-zero"),
    ({"weight": torch.ones(49)}, ValueError, r"'weight' must have shape \(50,\)"),
    ({"ignore_index": 1.5}, TypeError, r"'ignore_index' must be an int"),
])
def test_bad_input_is_named(kwargs, error, match):
    args = {"logits": torch.randn(4, 50), "target": torch.tensor([0, 1, 2, 3])}
    args.update(kwargs)
    with pytest.raises(error, match=match):
        cross_entropy(args.pop("logits"), args.pop("target"), **args)


def test_bad_logits_dtype_is_named():
    with pytest.raises(TypeError, match=r"cross_entropy: argument 'logits' must have dtype"):
        cross_entropy(torch.zeros(4, 5, dtype=torch.int64), torch.zeros(4, dtype=torch.long))


def test_kernel_out_of_range_target_poisons_its_row_only():
    # The kernel never addresses outside the row: the logits sit inside a NaN-filled buffer, so reading
    # a neighbour would show as NaN in the other rows; the bad row itself is NaN on purpose.
    from wavefront.kernels.cross_entropy import cross_entropy_rows

    n_rows, n_classes = 4, 300
    buf = torch.full((n_rows + 2, n_classes + 64), float("nan"))
    logits = buf[1:-1, 32:32 + n_classes]
    logits.copy_(torch.randn(n_rows, n_classes))
    target = torch.tensor([3, n_classes + 5, -7, 10])
    loss, stats = cross_entropy_rows(logits, target, None, ignore_index=-100, label_smoothing=0.0, z_loss=0.0,
                                     softcap=None)
    assert torch.isnan(loss[1]) and torch.isnan(loss[2])
    good = [0, 3]
    expect = F.cross_entropy(logits[good], target[good], reduction="none")
    torch.testing.assert_close(loss[good], expect)
    grad = torch.empty_like(logits)
    cross_entropy_rows(logits, target, None, ignore_index=-100, label_smoothing=0.0, z_loss=0.0, softcap=None,
                       stats=stats, grad=grad, scale=torch.ones(n_rows))
    assert torch.isnan(grad[1]).all() and torch.isnan(grad[2]).all()
    assert torch.isfinite(grad[good]).all()


def _masked_logits(n_cols, device):
    # Masked vocabulary entries (-inf) in the single-pass and the blocked path: one entry, a whole block,
    # the row's tail; and logits near the fp32 maximum, where lse^2 overflows.
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(4, n_cols, generator=gen) * 2
    x[0, 5] = -float("inf")
    x[1, : n_cols // 2] = -float("inf")
    x[2, -7:] = -float("inf")
    x[3] = (torch.rand(n_cols, generator=gen) * 2 - 1) * 3e38
    target = torch.tensor([1, n_cols - 1, 3, 2])
    return x.to(device), target.to(device)


@pytest.mark.parametrize("n_cols", [300, 20000])
def test_minus_inf_and_huge_logits_without_smoothing_match_torch(n_cols, device):
    # Issue #13 defect 1: the smoothing term (0 * inf at label_smoothing=0) and the z-loss term (0 * lse^2 =
    # 0 * inf near the fp32 maximum) made the loss NaN where torch's is finite (or +inf, like torch's).
    x, target = _masked_logits(n_cols, device)
    ours_in, torch_in = x.clone().requires_grad_(), x.clone().requires_grad_()
    ours = cross_entropy(ours_in, target, reduction="none")
    expect = F.cross_entropy(torch_in, target, reduction="none")
    assert not torch.isnan(ours).any()
    torch.testing.assert_close(ours, expect, rtol=2e-6, atol=2e-6)
    ours[:3].sum().backward()
    expect[:3].sum().backward()
    torch.testing.assert_close(ours_in.grad, torch_in.grad, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("n_cols", [300, 20000])
def test_minus_inf_logits_with_smoothing_match_torch(n_cols, device):
    # With smoothing on, every class carries eps / V of the target mass: a -inf logit makes the loss +inf
    # in torch; ours agrees (not NaN), and rows without -inf stay finite.
    x, target = _masked_logits(n_cols, device)
    x = x[:3]
    x = torch.cat([x, torch.randn(1, n_cols).to(device)])
    target = target.clone()
    ours = cross_entropy(x, target, reduction="none", label_smoothing=0.1)
    expect = F.cross_entropy(x, target, reduction="none", label_smoothing=0.1)
    assert torch.isposinf(ours[:3]).all()
    torch.testing.assert_close(ours, expect, rtol=2e-6, atol=2e-6)


def test_reference_rows_handle_minus_inf_without_smoothing():
    # The cpu-reference backend of the fused linear cross-entropy runs this; same defect, same fix.
    from wavefront import reference

    x, target = _masked_logits(300, "cpu")
    loss, _ = reference.cross_entropy_rows(x, target, None, ignore_index=-100, label_smoothing=0.0, z_loss=0.0,
                                           softcap=None)
    torch.testing.assert_close(loss, F.cross_entropy(x, target, reduction="none"), rtol=2e-6, atol=2e-6)


def test_inplace_backward_refuses_a_leaf(device):
    # Issue #13 defect 5: a leaf with requires_grad (a parameter, an input) would be overwritten.
    logits, target = _data(device=device)
    leaf = logits.clone().requires_grad_()
    with pytest.raises(ValueError, match=r"inplace_backward=True would overwrite 'logits', a leaf"):
        cross_entropy(leaf, target, inplace_backward=True)
    assert torch.equal(leaf.detach(), logits)


def test_inplace_backward_refuses_logits_used_after_the_loss(device):
    logits, target = _data(device=device)
    leaf = logits.clone().requires_grad_()
    x = leaf * 1.0
    loss = cross_entropy(x, target, inplace_backward=True)
    other = (x * x).sum()  # reads the overwritten logits with autograd
    with pytest.raises(RuntimeError, match="used by another op after the loss"):
        (loss + other).backward()


def test_inplace_backward_refuses_logits_modified_after_the_loss(device):
    logits, target = _data(device=device)
    x = logits.clone().requires_grad_() * 1.0
    loss = cross_entropy(x, target, inplace_backward=True)
    with torch.no_grad():
        x.add_(1.0)
    with pytest.raises(RuntimeError, match="modified in place after the loss"):
        loss.backward()


def test_inplace_backward_refuses_logits_saved_by_an_earlier_op(device):
    # An op that saved the logits for its backward before the loss sees them overwritten: autograd's version
    # counter names it.
    logits, target = _data(device=device)
    x = logits.clone().requires_grad_() * 1.0
    earlier = x.sin().sum()
    loss = cross_entropy(x, target, inplace_backward=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        (loss + earlier).backward()


# ---------------------------------------------------------------------------------------------------
# Few long rows split over several programs per row (issue #16 item 3): partial statistics, a combine,
# and the gradient written chunk by chunk; the same definition and the accuracy rule, split or not.

def _split_off(monkeypatch):
    import dataclasses

    from wavefront.kernels import row_config as rc

    monkeypatch.setitem(rc.ROW_TABLES, "cpu", dataclasses.replace(rc.ROW_TABLES["cpu"], split_min_cols=1 << 40))


@pytest.mark.parametrize("options", [{}, {"label_smoothing": 0.1, "weighted": True, "z_loss": 1e-3},
                                     pytest.param({"softcap": 30.0, "label_smoothing": 0.1}, marks=pytest.mark.slow)])
def test_split_rows_match_the_float64_reference(options, monkeypatch):
    from wavefront import reference
    from wavefront.kernels import cross_entropy as kernels
    from wavefront.kernels._launch import recording
    from wavefront.ops._spec import Tolerance

    # 3 rows on the interpreter's 2 'SMs' x 2: two programs per row, chunks of 12288 columns (3 blocks) and a
    # ragged 7712.
    n_rows, n_cols = 3, 20000
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(n_rows, n_cols, generator=gen) * 4
    x[0, 12288:] = -float("inf")  # a whole chunk of a padded vocabulary: its partial weighs nothing
    target = torch.tensor([3, -100, n_cols - 1])
    weight = torch.rand(n_cols, generator=gen) + 0.5 if options.get("weighted") else None
    kw = dict(ignore_index=-100, label_smoothing=options.get("label_smoothing", 0.0),
              z_loss=options.get("z_loss", 0.0), softcap=options.get("softcap"))
    if kw["label_smoothing"]:
        x[0, 12288:] = -30.0  # smoothing makes a -inf logit an infinite loss (torch's too)
    scale = torch.rand(n_rows, generator=gen) + 0.5

    def run(x):
        with recording() as rec:
            loss, stats = kernels.cross_entropy_rows(x, target, weight, **kw)
            grad = torch.empty_like(x)
            kernels.cross_entropy_rows(x, target, weight, **kw, stats=stats, grad=grad, scale=scale)
        return loss, grad, rec

    loss, grad, rec = run(x)
    assert [r.grid for r in rec] == [(3, 2), (3,), (3, 2)]
    ref_loss, ref_stats = reference.cross_entropy_rows(x.double(), target, None if weight is None else weight.double(),
                                                       **kw)
    ref_grad = torch.empty_like(x, dtype=torch.float64)
    reference.cross_entropy_rows(x.double(), target, None if weight is None else weight.double(), **kw,
                                 stats=ref_stats, grad=ref_grad, scale=scale.double())
    eager_loss, eager_stats = reference.cross_entropy_rows(x, target, weight, **kw)
    eager_grad = torch.empty_like(x)
    reference.cross_entropy_rows(x, target, weight, **kw, stats=eager_stats, grad=eager_grad, scale=scale)
    tol = Tolerance()
    for ours, eager, ref in ((loss, eager_loss, ref_loss), (grad, eager_grad, ref_grad)):
        if kw["softcap"] is not None and ours is grad:
            # The softcap's own tanh error (the same unsplit, checked by the registry's sweep against the op's
            # eager) exceeds these fp32 rows' torch.tanh; the split is held to the unsplit kernel below.
            continue
        err = float((ours.double() - ref).abs().max())
        assert err <= tol.bound(float((eager.double() - ref).abs().max()), float(ref.abs().max()), torch.float32)
    assert float(grad[1].abs().max()) == 0.0 and float(loss[1]) == 0.0  # the ignored row
    # The unsplit kernel (one program per row) agrees to a few ulps: only the summation order differs.
    _split_off(monkeypatch)
    loss1, grad1, rec1 = run(x)
    assert [r.grid for r in rec1] == [(3, 1), (3, 1)]
    torch.testing.assert_close(loss, loss1, rtol=4e-7, atol=0)
    torch.testing.assert_close(grad, grad1, rtol=4e-6, atol=1e-12)


def test_split_rows_in_place_gradient_matches():
    from wavefront.kernels import cross_entropy as kernels

    gen = torch.Generator().manual_seed(8)
    x = torch.randn(2, 40000, generator=gen)
    target = torch.tensor([7, 39999])
    kw = dict(ignore_index=-100, label_smoothing=0.0, z_loss=0.0, softcap=None)
    loss, stats = kernels.cross_entropy_rows(x, target, None, **kw)
    grad = torch.empty_like(x)
    one = torch.ones(())
    kernels.cross_entropy_rows(x, target, None, **kw, stats=stats, grad=grad, scale=one)
    inplace = x.clone()
    loss2, stats2 = kernels.cross_entropy_rows(inplace, target, None, **kw, grad=inplace, scale=one)
    assert torch.equal(loss, loss2) and torch.equal(stats, stats2) and torch.equal(grad, inplace)


def test_split_column_slice_backward_matches_unsplit(monkeypatch):
    # Backward mode on a column slice (the fused and vocabulary-parallel losses: col_offset, n_classes) with
    # the slice split over programs: the target (inside the slice for row 0, outside for row 1) and the class
    # weights are indexed relative to the slice in every chunk.
    from wavefront.kernels import cross_entropy as kernels
    from wavefront.kernels._launch import recording

    gen = torch.Generator().manual_seed(9)
    x = torch.randn(2, 40000, generator=gen) * 3
    target = torch.tensor([25000, 5])
    weight = torch.rand(40000, generator=gen) + 0.5
    kw = dict(ignore_index=-100, label_smoothing=0.1, z_loss=0.0, softcap=None)
    _, stats = kernels.cross_entropy_rows(x, target, weight, **kw)
    part = x[:, 10000:]
    scale = torch.tensor([0.5, 2.0])

    def grad_of_slice():
        grad = torch.empty_like(part)
        with recording() as rec:
            kernels.cross_entropy_rows(part, target, weight, **kw, stats=stats, grad=grad, scale=scale,
                                       col_offset=10000, n_classes=40000)
        return grad, [r.grid for r in rec]

    split, grids = grad_of_slice()
    assert grids == [(2, 2)]
    _split_off(monkeypatch)
    whole, grids = grad_of_slice()
    assert grids == [(2, 1)]
    assert torch.equal(split, whole)  # the same per-element arithmetic, whoever computes it
