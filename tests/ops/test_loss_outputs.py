"""What the fused losses return beside the loss (issue 33): the z-loss term, the predicted tokens and the token
accuracy as one LossOutput; PaLM's z-loss under a weighted mean and the previous rule by name; loss_dtype.

The registry's cases ``outputs*`` hold the values to the float64 accuracy rule (tests/ops/test_accuracy.py);
here: the argmax exactly (ties, blocks, split rows, softcap), gradients unchanged by the extra outputs, the
z-loss rule's defining property, compile(fullgraph), the cpu-reference fallback, bad arguments, and traffic
that shows no extra pass over the logits.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from wavefront import ops, reference
from wavefront.ops import LossOutput
from wavefront.ops._spec import Case, Tolerance

ALL = {"return_z_loss": True, "return_predicted_tokens": True, "return_token_accuracy": True}


def _split(monkeypatch, on: bool):
    from wavefront.kernels import row_config as rc

    if not on:
        monkeypatch.setitem(rc.ROW_TABLES, "cpu", dataclasses.replace(rc.ROW_TABLES["cpu"], split_min_cols=1 << 40))


def _tied_logits(n_rows: int, n_cols: int, dtype, gen) -> torch.Tensor:
    """Random logits whose maximum is tied in two columns of every row (the first one must win), one row all
    equal, the rest distinct at the top."""
    x = (torch.randn(n_rows, n_cols, generator=gen) * 3).to(dtype)
    for i in range(n_rows):
        a, b = sorted(torch.randperm(n_cols, generator=gen)[:2].tolist())
        top = x[i].max() + 1
        x[i, a] = top
        x[i, b] = top
    x[0] = 1.5
    return x


@pytest.mark.parametrize(("n_cols", "split"), [(300, False), (20000, False), (20000, True)],
                         ids=["one_block", "blocks", "split_rows"])
@pytest.mark.parametrize("softcap", [None, 30.0])
def test_predicted_tokens_are_torch_argmax_first_on_ties(n_cols, split, softcap, monkeypatch):
    _split(monkeypatch, split)
    gen = torch.Generator().manual_seed(n_cols)
    n_rows = 3
    x = _tied_logits(n_rows, n_cols, torch.bfloat16, gen)
    target = torch.randint(0, n_cols, (n_rows,), generator=gen)
    target[1] = -1
    target[2] = int(x[2].argmax())
    out = ops.cross_entropy(x, target, ignore_index=-1, softcap=softcap, **ALL)
    assert isinstance(out, LossOutput)
    expect = torch.where(target == -1, torch.full_like(target, -1), x.argmax(-1))
    assert torch.equal(out.predicted_tokens, expect)
    assert out.predicted_tokens.dtype == torch.int64
    valid = target != -1
    assert float(out.token_accuracy) == pytest.approx(float(((expect == target) & valid).sum() / valid.sum()))
    assert float(out.token_accuracy) > 0


def test_fields_not_asked_for_are_none_and_shapes_follow_the_target():
    x = torch.randn(2, 3, 50)
    target = torch.randint(0, 50, (2, 3))
    assert isinstance(ops.cross_entropy(x, target), torch.Tensor)
    out = ops.cross_entropy(x, target, return_predicted_tokens=True)
    assert out.z_loss is None and out.token_accuracy is None and out.predicted_tokens.shape == (2, 3)
    out = ops.cross_entropy(x, target, reduction="none", z_loss=1e-3, return_z_loss=True)
    assert out.z_loss.shape == (2, 3) and out.predicted_tokens is None
    # The z-loss term is the loss's own share: the loss without z-loss plus the term.
    base = ops.cross_entropy(x, target, reduction="none")
    torch.testing.assert_close(out.loss, base + out.z_loss)


def _ce_grads(x, target, **kw):
    leaf = x.clone().requires_grad_()
    out = ops.cross_entropy(leaf, target, **kw)
    loss = out.loss if isinstance(out, LossOutput) else out
    (loss * 1.0 if loss.dim() == 0 else loss.sum()).backward()
    return loss.detach(), leaf.grad, out


@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("options", [{"z_loss": 1e-3}, {"z_loss": 1e-3, "weight": True, "label_smoothing": 0.1},
                                     {"reduction": "none", "softcap": 20.0}], ids=["z", "weighted", "none"])
def test_cross_entropy_gradients_unchanged_by_the_outputs(options, inplace):
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(8, 200, generator=gen) * 4
    target = torch.randint(0, 200, (8,), generator=gen)
    target[3] = -100
    options = dict(options)
    if options.pop("weight", False):
        options["weight"] = torch.rand(200, generator=gen) + 0.1

    def run(**extra):
        leaf = x.clone().requires_grad_()
        rows = leaf * 1.0  # a non-leaf: the in-place gradient overwrites it
        out = ops.cross_entropy(rows, target, inplace_backward=inplace, **options, **extra)
        loss = out.loss if isinstance(out, LossOutput) else out
        loss.sum().backward()
        return loss.detach(), leaf.grad, out

    loss_a, grad_a, _ = run()
    loss_b, grad_b, out = run(**ALL)
    assert torch.equal(loss_a, loss_b) and torch.equal(grad_a, grad_b)
    assert not (out.z_loss.requires_grad or out.token_accuracy.requires_grad or out.predicted_tokens.requires_grad)


def test_linear_cross_entropy_outputs_and_unchanged_gradients():
    gen = torch.Generator().manual_seed(5)
    n, v, h = 40, 600, 32
    hidden = torch.randn(n, h, generator=gen)
    weight = torch.randn(v, h, generator=gen) * h ** -0.5 * 8
    target = torch.randint(0, v, (n,), generator=gen)
    target[::6] = -100
    logits = torch.cat([hidden[i:i + 16] @ weight.t() for i in range(0, n, 16)])  # the op's chunks' GEMMs
    target[1] = int(logits[1].argmax())
    grads = []
    for extra in ({}, ALL):
        hd, wt = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        out = ops.linear_cross_entropy(hd, wt, target, chunk_size=16, z_loss=1e-3, **extra)
        (out.loss if extra else out).backward()
        grads.append((hd.grad, wt.grad))
    assert all(torch.equal(a, b) for a, b in zip(*grads, strict=True))
    expect = torch.where(target == -100, target, logits.argmax(-1))
    assert torch.equal(out.predicted_tokens, expect)
    valid = target != -100
    assert float(out.token_accuracy) == pytest.approx(float(((expect == target) & valid).sum() / valid.sum()))
    z_ref, _, _ = reference.cross_entropy_extras((hidden.double() @ weight.double().t()), target, z_loss=1e-3)
    z_eager, _, _ = reference.cross_entropy_extras(logits, target, z_loss=1e-3)
    bound = Tolerance().bound(float((z_eager - z_ref).abs()), float(z_ref.abs()), torch.float32)
    assert float((out.z_loss.double() - z_ref).abs()) <= bound


@pytest.mark.parametrize("fused", [False, True], ids=["cross_entropy", "linear_cross_entropy"])
def test_palm_z_loss_does_not_scale_with_the_class_weights(fused):
    """The defining property: a weighted mean of the cross-entropy term is invariant to the weights' scale, and
    so is PaLM's z-loss averaged per token, so the whole loss is; with z_loss_reduction="weighted" the z-loss
    term divides by the total weight and shrinks as the weights grow."""
    gen = torch.Generator().manual_seed(9)
    n, v, h = 24, 300, 16
    hidden = torch.randn(n, h, generator=gen, dtype=torch.float64)
    weight = torch.randn(v, h, generator=gen, dtype=torch.float64) * 2
    target = torch.randint(0, v, (n,), generator=gen)
    target[::5] = -100
    w = torch.rand(v, generator=gen, dtype=torch.float64) + 0.1

    def run(scale, rule):
        kw = dict(z_loss=1e-2, z_loss_reduction=rule, return_z_loss=True)
        if fused:
            return ops.linear_cross_entropy(hidden, weight, target, class_weight=w * scale, chunk_size=8, **kw)
        return ops.cross_entropy(hidden @ weight.t(), target, weight=w * scale, **kw)

    one, ten = run(1.0, "token"), run(10.0, "token")
    torch.testing.assert_close(one.loss, ten.loss, rtol=1e-12, atol=0)
    torch.testing.assert_close(one.z_loss, ten.z_loss, rtol=1e-12, atol=0)
    unweighted = ops.cross_entropy(hidden @ weight.t(), target, z_loss=1e-2, return_z_loss=True)
    torch.testing.assert_close(one.z_loss, unweighted.z_loss, rtol=1e-12, atol=0)  # per token, weights or not
    old_one, old_ten = run(1.0, "weighted"), run(10.0, "weighted")
    torch.testing.assert_close(old_ten.z_loss * 10, old_one.z_loss, rtol=1e-12, atol=0)
    # Each rule matches its float64 definition.
    for rule, got in (("token", one), ("weighted", old_one)):
        ref = reference.cross_entropy(hidden @ weight.t(), target, z_loss=1e-2, weight=w, z_loss_reduction=rule)
        torch.testing.assert_close(got.loss, ref, rtol=1e-12, atol=0)


@pytest.mark.parametrize("fused", [False, True], ids=["cross_entropy", "linear_cross_entropy"])
def test_loss_dtype_rounds_the_fp32_loss_once(fused):
    gen = torch.Generator().manual_seed(2)
    hidden = torch.randn(16, 32, generator=gen).to(torch.bfloat16)
    weight = (torch.randn(100, 32, generator=gen) * 0.3).to(torch.bfloat16)
    target = torch.randint(0, 100, (16,), generator=gen)

    def run(**kw):
        hd = hidden.clone().requires_grad_()
        if fused:
            out = ops.linear_cross_entropy(hd, weight, target, z_loss=1e-3, **kw)
        else:
            out = ops.cross_entropy(hd @ weight.t(), target, z_loss=1e-3, **kw)
        loss = out.loss if isinstance(out, LossOutput) else out
        loss.backward()
        return out, loss, hd.grad

    _, fp32, grad32 = run()
    out, low, grad16 = run(loss_dtype=torch.bfloat16, return_z_loss=True)
    assert fp32.dtype == torch.float32 and low.dtype == torch.bfloat16 and out.z_loss.dtype == torch.bfloat16
    assert torch.equal(low, fp32.to(torch.bfloat16))
    assert torch.equal(grad16, grad32)  # the upstream 1 is exact in bf16: the cast changes no gradient
    _, same, _ = run(loss_dtype=torch.float32)
    assert torch.equal(same, fp32)


@pytest.mark.parametrize("fused", [False, True], ids=["cross_entropy", "linear_cross_entropy"])
def test_outputs_under_compile_fullgraph(fused):
    torch._dynamo.reset()
    gen = torch.Generator().manual_seed(4)
    hidden = torch.randn(12, 16, generator=gen)
    weight = torch.randn(90, 16, generator=gen)
    target = torch.randint(0, 90, (12,), generator=gen)
    target[2] = -100
    w = torch.rand(90, generator=gen) + 0.1

    def f(hd):
        if fused:
            return ops.linear_cross_entropy(hd, weight, target, class_weight=w, z_loss=1e-3, chunk_size=8, **ALL)
        return ops.cross_entropy(hd @ weight.t(), target, weight=w, z_loss=1e-3, **ALL)

    results = []
    for fn in (f, torch.compile(f, backend="aot_eager", fullgraph=True)):
        hd = hidden.clone().requires_grad_()
        out = fn(hd)
        out.loss.backward()
        results.append((out, hd.grad))
    (eager, g_eager), (compiled, g_compiled) = results
    assert isinstance(compiled, LossOutput)
    assert torch.equal(eager.predicted_tokens, compiled.predicted_tokens)
    for a, b in ((eager.loss, compiled.loss), (eager.z_loss, compiled.z_loss),
                 (eager.token_accuracy, compiled.token_accuracy), (g_eager, g_compiled)):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_cpu_reference_fallback_returns_the_same(monkeypatch):
    from wavefront import runtime

    gen = torch.Generator().manual_seed(6)
    x = torch.randn(6, 70, generator=gen) * 3
    target = torch.randint(0, 70, (6,), generator=gen)
    target[0] = -100
    kw = dict(z_loss=1e-3, softcap=10.0, **ALL)
    kernel = ops.cross_entropy(x, target, **kw)
    monkeypatch.setattr(runtime, "uses_triton", lambda device=None: False)
    fallback = ops.cross_entropy(x, target, **kw)
    assert torch.equal(kernel.predicted_tokens, fallback.predicted_tokens)
    torch.testing.assert_close(kernel.loss, fallback.loss)
    torch.testing.assert_close(kernel.z_loss, fallback.z_loss)
    torch.testing.assert_close(kernel.token_accuracy, fallback.token_accuracy)


@pytest.mark.parametrize(("kw", "kind", "words"), [
    ({"z_loss_reduction": "palm"}, ValueError, ("'z_loss_reduction'", "token", "weighted")),
    ({"loss_dtype": torch.float16}, ValueError, ("'loss_dtype'", "torch.bfloat16")),
    ({"loss_dtype": "bf16"}, ValueError, ("'loss_dtype'",)),
    ({"return_z_loss": 1}, TypeError, ("'return_z_loss'", "bool")),
    ({"return_token_accuracy": None}, TypeError, ("'return_token_accuracy'",)),
])
@pytest.mark.parametrize("fused", [False, True], ids=["cross_entropy", "linear_cross_entropy"])
def test_bad_options_are_named(kw, kind, words, fused):
    hidden = torch.randn(4, 8).to(torch.bfloat16)
    weight = torch.randn(20, 8).to(torch.bfloat16)
    target = torch.zeros(4, dtype=torch.long)
    with pytest.raises(kind) as info:
        if fused:
            ops.linear_cross_entropy(hidden, weight, target, **kw)
        else:
            ops.cross_entropy(hidden @ weight.t(), target, **kw)
    for word in words:
        assert word in str(info.value), (word, str(info.value))


@pytest.mark.parametrize(("op", "dims", "split"), [
    ("cross_entropy", {"n_rows": 16, "n_cols": 1024}, False),
    ("cross_entropy", {"n_rows": 4, "n_cols": 20000}, False),
    ("cross_entropy", {"n_rows": 2, "n_cols": 20000}, True),
    ("linear_cross_entropy", {"n_rows": 32, "n_cols": 1000, "hidden": 32}, False),
], ids=["ce_one_block", "ce_blocks", "ce_split", "lce"])
def test_traffic_shows_no_extra_pass(op, dims, split, monkeypatch):
    """The outputs cost their own writes and O(rows) host arithmetic, never a pass over the logits (2 B per
    logit in bf16) or the weight: the kernels move exactly 8 B per row more (the int64 predicted token; split
    rows: 8 B more per chunk for the chunk's maximum and column, written once and read once)."""
    from wavefront.ops import REGISTRY
    from wavefront.workbench.static import traffic as tr

    _split(monkeypatch, split)
    spec = REGISTRY[op]
    extra = {"chunk_size": 16} if op == "linear_cross_entropy" else {}
    plain = Case("plain", "traffic", dims, {"z_loss": 1e-3, **extra})
    full = Case("plain", "traffic", dims, {"z_loss": 1e-3, **extra, **ALL})
    (p,) = tr.traffic_rows(spec, plain, torch.bfloat16, modes=("fwd",), marginal=False)
    (o,) = tr.traffic_rows(spec, full, torch.bfloat16, modes=("fwd",), marginal=False)
    assert p.error is None and o.error is None, (p.error, o.error)
    n_rows = dims["n_rows"]
    n_chunks = 0
    if split:
        from wavefront import runtime
        from wavefront.kernels.row_config import row_config, row_splits

        arch = runtime.arch(torch.device("cpu"))
        cfg = row_config(dims["n_cols"], torch.bfloat16, arch, online=True)
        n_chunks = row_splits(n_rows, dims["n_cols"], cfg.BLOCK_N, arch, runtime.sm_count("cpu"))[0] * n_rows
        assert n_chunks > n_rows
    # predicted token written; split: each chunk's (fp32 max, int32 column) written then read by the combine.
    assert o.kernel_bytes - p.kernel_bytes == 8 * n_rows + 2 * 8 * n_chunks
    assert [k.kernel for k in o.kernels] == [k.kernel for k in p.kernels]  # no extra launch
    one_pass = 2 * n_rows * dims["n_cols"]
    assert 0 <= o.host_bytes - p.host_bytes < one_pass / 4, (o.host_bytes, p.host_bytes)
    assert o.min_bytes - p.min_bytes == 8 * n_rows
