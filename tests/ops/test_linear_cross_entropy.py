"""linear_cross_entropy beyond the registry's accuracy sweep: memory, chunking, gradient accumulation,
frozen weights, host syncs, bad input, and FSDP2-sharded weights on two gloo processes."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F
from _host_sync import host_syncs

from wavefront.ops import linear_cross_entropy
from wavefront.ops.linear_cross_entropy import CHUNK_BUDGET_BYTES, chunk_tokens
from wavefront.workbench.bench.live_bytes import LiveBytesMeter

lce_mod = importlib.import_module("wavefront.ops.linear_cross_entropy")


def _data(n_tokens=48, vocab=300, n_hidden=16, seed=0, dtype=torch.float32, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n_tokens, n_hidden, generator=gen).to(device=device, dtype=dtype)
    weight = (torch.randn(vocab, n_hidden, generator=gen) * 0.5).to(device=device, dtype=dtype)
    target = torch.randint(0, vocab, (n_tokens,), generator=gen)
    target[::5] = -100
    return hidden, weight, target.to(device)


def _eager(hidden, weight, target, bias=None, **kw):
    return F.cross_entropy(F.linear(hidden, weight, bias).float(), target, **kw)


def test_chunk_size_formula():
    # 8k tokens at vocab 128,256: 256 fp32 rows (125 MiB) or 512 bf16 rows fit the 128 MiB budget.
    assert chunk_tokens(8192, 128256, 4) == 256
    assert chunk_tokens(8192, 128256, 2) == 512
    assert chunk_tokens(8192, 128256, 2) * 128256 * 2 <= CHUNK_BUDGET_BYTES
    # Free memory caps it (1/8 of 64 MiB free leaves 8 MiB: 16 bf16 rows of 262k), never below 16 rows.
    assert chunk_tokens(8192, 262144, 2, free_bytes=64 * 2**20) == 16
    assert chunk_tokens(8192, 262144, 2, free_bytes=2**20) == 16
    assert chunk_tokens(100, 1000, 4) == 100  # never more than the tokens
    with pytest.raises(ValueError, match="n_tokens, vocab and itemsize must be >= 1"):
        chunk_tokens(0, 10, 4)


def test_peak_memory_is_a_fraction_of_the_logits():
    # Scaled-down version of the 8k x 128k measurement (docs/kernels-loss-pointwise.md): 256 tokens,
    # vocab 2048, chunks of 8 tokens. Both contenders keep the gradients they produce.
    n_tokens, vocab, n_hidden = 256, 2048, 4
    full_logits = n_tokens * vocab * 4
    hidden, weight, target = _data(n_tokens, vocab, n_hidden)
    peaks = {}
    for name in ("ours", "eager"):
        h = hidden.clone().requires_grad_()
        w = weight.clone().requires_grad_()
        with LiveBytesMeter() as meter:
            if name == "ours":
                linear_cross_entropy(h, w, target, chunk_size=8).backward()
            else:
                _eager(h, w, target).backward()
        peaks[name] = meter.result.peak_bytes
    assert peaks["eager"] >= 2 * full_logits  # logits, log-softmax and their gradient: the meter sees them
    assert peaks["ours"] <= full_logits / 8, peaks


@pytest.mark.parametrize("chunk_size", [None, 7, 16])
def test_chunking_is_invisible(chunk_size):
    hidden, weight, target = _data()
    bias = torch.randn(weight.shape[0]) * 0.1
    ours_args = [t.clone().requires_grad_() for t in (hidden, weight, bias)]
    eager_args = [t.clone().requires_grad_() for t in (hidden, weight, bias)]
    ours = linear_cross_entropy(ours_args[0], ours_args[1], target, bias=ours_args[2], chunk_size=chunk_size,
                                label_smoothing=0.05)
    expect = _eager(eager_args[0], eager_args[1], target, eager_args[2], label_smoothing=0.05)
    torch.testing.assert_close(ours, expect)
    ours.backward(torch.tensor(1.7))
    expect.backward(torch.tensor(1.7))
    for a, b in zip(ours_args, eager_args, strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-6)


def test_batch_shaped_tokens_and_none_reduction():
    hidden, weight, target = _data(n_tokens=24)
    h3, t3 = hidden.view(2, 12, -1), target.view(2, 12)
    ours = linear_cross_entropy(h3, weight, t3, reduction="none", chunk_size=5)
    assert ours.shape == (2, 12)
    torch.testing.assert_close(ours, _eager(hidden, weight, target, reduction="none").view(2, 12))


def test_frozen_weight_and_no_grad():
    hidden, weight, target = _data()
    h = hidden.clone().requires_grad_()
    loss = linear_cross_entropy(h, weight, target, chunk_size=8)  # frozen lm_head: only dhidden
    loss.backward()
    h_ref = hidden.clone().requires_grad_()
    _eager(h_ref, weight, target).backward()
    torch.testing.assert_close(h.grad, h_ref.grad, rtol=1e-5, atol=1e-7)
    assert weight.grad is None
    with torch.no_grad():
        loss = linear_cross_entropy(hidden, weight.requires_grad_(), target)
    assert not loss.requires_grad
    torch.testing.assert_close(loss, _eager(hidden, weight.detach(), target))


def test_autocast_casts_like_f_linear():
    # Mixed precision: fp32 master weight, bf16 autocast. The loss equals eager's under the same autocast
    # and the weight's gradient arrives in fp32.
    hidden, weight, target = _data(n_tokens=16, vocab=64)
    w, w_ref = weight.clone().requires_grad_(), weight.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ours = linear_cross_entropy(hidden, w, target, chunk_size=8)
        expect = F.cross_entropy(F.linear(hidden, w_ref).float(), target)
    torch.testing.assert_close(ours, expect, rtol=1e-3, atol=1e-3)
    ours.backward()
    expect.backward()
    assert w.grad.dtype == torch.float32
    torch.testing.assert_close(w.grad, w_ref.grad, rtol=2e-2, atol=2e-3)


def test_gradient_accumulation_with_divisor():
    # Hugging Face: reduction="sum" and divisor = the batch's non-ignored tokens, across micro-batches,
    # equals the full batch's mean.
    hidden, weight, target = _data(n_tokens=40)
    n_items = (target != -100).sum()
    w_full = weight.clone().requires_grad_()
    linear_cross_entropy(hidden, w_full, target, chunk_size=8).backward()
    w_acc = weight.clone().requires_grad_()
    for rows in (slice(0, 13), slice(13, 40)):
        linear_cross_entropy(hidden[rows], w_acc, target[rows], reduction="sum", divisor=n_items,
                             chunk_size=8).backward()
    torch.testing.assert_close(w_acc.grad, w_full.grad, rtol=1e-5, atol=1e-7)


def test_all_ignored_gives_zero():
    hidden, weight, target = _data()
    target.fill_(-100)
    w = weight.clone().requires_grad_()
    loss = linear_cross_entropy(hidden, w, target, chunk_size=8)
    loss.backward()
    assert loss.item() == 0.0
    assert torch.count_nonzero(w.grad) == 0


def test_mean_path_makes_no_host_sync(monkeypatch):
    monkeypatch.setattr(lce_mod, "check_target", lambda *a, **k: None)
    hidden, weight, target = _data()
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    with host_syncs() as calls:
        linear_cross_entropy(h, w, target, chunk_size=16, z_loss=1e-4).backward()
    assert calls == []


def test_bf16_weight_gradient_accumulates_in_fp32():
    # 16 chunks of bf16 partial products summed in bf16 would drift by several ulps; the fp32 accumulator
    # keeps dweight within the rule's bound of eager's single GEMM.
    hidden, weight, target = _data(n_tokens=128, vocab=128, n_hidden=16, dtype=torch.bfloat16)
    w = weight.clone().requires_grad_()
    linear_cross_entropy(hidden, w, target, chunk_size=8).backward()
    w64 = weight.double().requires_grad_()
    _eager(hidden.double(), w64, target).backward()
    w_eager = weight.clone().requires_grad_()
    _eager(hidden, w_eager, target).backward()
    err_ours = (w.grad.double() - w64.grad).abs().max()
    err_eager = (w_eager.grad.double() - w64.grad).abs().max()
    eps = torch.finfo(torch.bfloat16).eps * w64.grad.abs().max()
    assert err_ours <= 2 * err_eager + eps, (err_ours, err_eager)


@pytest.mark.parametrize(("change", "error", "match"), [
    ({"weight": torch.empty(0)}, ValueError, r"'weight' must have shape \[vocab, 16\].*ZeRO-3"),
    ({"weight": torch.randn(30, 8)}, ValueError, r"'weight' must have shape \[vocab, 16\]"),
    ({"weight": torch.randn(30, 16, dtype=torch.float64)}, TypeError, r"'weight' must have the dtype of 'hidden'"),
    ({"bias": torch.randn(29)}, ValueError, r"'bias' must have shape \(30,\)"),
    ({"target": torch.full((48,), 30)}, ValueError, r"'target' has values outside \[0, 30\)"),
    ({"target": torch.zeros(47, dtype=torch.long)}, ValueError, r"'target' must have shape \(48,\)"),
    ({"chunk_size": 0}, ValueError, r"'chunk_size' must be a positive int"),
    ({"softcap": -2.0}, ValueError, r"'softcap' must be > 0"),
    ({"class_weight": torch.ones(31)}, ValueError, r"'class_weight' must have shape \(30,\)"),
    ({"reduction": "batchmean"}, ValueError, r"'reduction' must be one of"),
])
def test_bad_input_is_named(change, error, match):
    args = {"hidden": torch.randn(48, 16), "weight": torch.randn(30, 16), "target": torch.zeros(48, dtype=torch.long)}
    args.update(change)
    with pytest.raises(error, match=match):
        linear_cross_entropy(args.pop("hidden"), args.pop("weight"), args.pop("target"), **args)


_FSDP_WORKER = textwrap.dedent("""
    import json, sys
    import torch, torch.distributed as dist
    from torch import nn
    rank, tmp = int(sys.argv[1]), sys.argv[2]
    dist.init_process_group("gloo", init_method=f"file://{tmp}/rendezvous", rank=rank, world_size=2)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from wavefront.ops import linear_cross_entropy

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(16, 16)
            self.lm_head = nn.Linear(16, 96, bias=False)

        def forward(self, x, target):
            # Inside the root module's forward FSDP2 has gathered lm_head.weight: the contract.
            return linear_cross_entropy(self.proj(x), self.lm_head.weight, target, chunk_size=8)

    def run():  # the checks in a function: the model, its FSDP2 state and the mesh go with its frame
        torch.manual_seed(0)
        model = LM()
        replica = LM()
        replica.load_state_dict(model.state_dict())
        fully_shard(model, mesh=init_device_mesh("cpu", (2,)))
        out = {}
        data = []
        for r in range(2):
            g = torch.Generator().manual_seed(100 + r)
            x = torch.randn(20, 16, generator=g)
            t = torch.randint(0, 96, (20,), generator=g)
            t[::6] = -100
            data.append((x, t))
        loss = model(*data[rank])
        loss.backward()
        # Eager replica: FSDP2 averages gradients over ranks, i.e. the gradient of the mean of the two losses.
        ref = sum(nn.functional.cross_entropy(replica.lm_head(replica.proj(x)), t) for x, t in data) / 2
        ref.backward()
        out["loss"] = float(loss.detach())
        out["loss_ref_rank"] = float(nn.functional.cross_entropy(replica.lm_head(replica.proj(data[rank][0])),
                                                                 data[rank][1]).detach())
        for name in ("lm_head.weight", "proj.weight", "proj.bias"):
            full = dict(model.named_parameters())[name].grad.full_tensor()
            expect = dict(replica.named_parameters())[name].grad
            out[name] = float((full - expect).abs().max() / expect.abs().max())
        try:  # outside forward the weight is a sharded DTensor: rejected with a message
            linear_cross_entropy(torch.randn(4, 16), model.lm_head.weight, torch.zeros(4, dtype=torch.long))
            out["dtensor_error"] = ""
        except TypeError as exc:
            out["dtensor_error"] = str(exc)
        return out

    out = run()
    from wavefront.workbench.distributed import launch
    launch.destroy_process_group(barrier=True)
    with open(f"{tmp}/rank{rank}.json", "w") as f:
        json.dump(out, f)
    # After FSDP2 over a file-store gloo group, torch 2.13 keeps one group's gloo threads alive past
    # destroy_process_group with no Python object left referring to it (the same with F.cross_entropy in
    # place of our op), and one of them can abort the rank at interpreter exit ("terminate called without
    # an active exception") after every check here has passed; CI saw it once. The results are written and
    # closed, so the rank leaves without running the interpreter's teardown.
    import os
    os._exit(0)
""")


def test_fsdp2_sharded_weight_gathered_by_the_caller(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(_FSDP_WORKER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    procs = [subprocess.Popen([sys.executable, str(script), str(rank), str(tmp_path)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for rank in range(2)]
    logs = [p.communicate(timeout=240)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(logs)
    for rank in range(2):
        out = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert abs(out["loss"] - out["loss_ref_rank"]) < 1e-5
        for name in ("lm_head.weight", "proj.weight", "proj.bias"):
            assert out[name] < 1e-5, (name, out[name])
        assert "DTensor" in out["dtensor_error"] and "unshard" in out["dtensor_error"]


def test_dweight_by_slices_rule():
    # bf16 lm_head of Llama 3 8B: a 6 V H = 3 GiB fp32 accumulator + product would exceed the logits; slices.
    assert lce_mod.dweight_by_slices(128256, 4096, torch.bfloat16)
    assert not lce_mod.dweight_by_slices(128256, 64, torch.bfloat16)  # 49 MB: accumulate
    assert not lce_mod.dweight_by_slices(128256, 4096, torch.float32)  # the accumulator is the output
    # 8k tokens x 8192 bf16 columns = 128 MiB, the chunk budget; never below one aligned slice
    assert lce_mod.slice_columns(8192, 128256, 2) == 8192
    assert lce_mod.slice_columns(8192, 128256, 2, free_bytes=8 * 2**20) == 128
    assert lce_mod.slice_columns(64, 300, 4) == 300


def _force_slices(monkeypatch, n_tokens, itemsize, cols=128):
    monkeypatch.setattr(lce_mod, "DWEIGHT_ACCUMULATOR_MAX_BYTES", 0)
    monkeypatch.setattr(lce_mod, "CHUNK_BUDGET_BYTES", n_tokens * itemsize * cols)


@pytest.mark.parametrize("options", [
    {},
    {"label_smoothing": 0.1, "z_loss": 1e-3, "softcap": 5.0, "class_weight": True, "bias": True},
])
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_dweight_by_slices_meets_the_accuracy_rule(monkeypatch, options, reduction):
    # vocab 300 in slices of 128, 128 and 44 columns; bf16, so slices are the path that real lm_heads take.
    n_tokens, vocab = 64, 300
    _force_slices(monkeypatch, n_tokens, 2)
    hidden, weight, target = _data(n_tokens=n_tokens, vocab=vocab, dtype=torch.bfloat16)
    gen = torch.Generator().manual_seed(3)
    kw = {k: v for k, v in options.items() if k not in ("class_weight", "bias")}
    if options.get("class_weight"):
        kw["weight"] = torch.rand(vocab, generator=gen) + 0.5
    bias = (torch.randn(vocab, generator=gen) * 0.1).to(torch.bfloat16) if options.get("bias") else None
    upstream = torch.randn(n_tokens, generator=gen) if reduction == "none" else torch.tensor(1.3)

    def run(dtype, fn):
        args = [t.to(dtype).requires_grad_() for t in (hidden, weight)]
        b = bias.to(dtype).requires_grad_() if bias is not None else None
        fn(args[0], args[1], b).backward(upstream.to(torch.float64 if dtype == torch.float64 else torch.float32))
        return [args[0].grad, args[1].grad] + ([b.grad] if b is not None else [])

    def eager(h, w, b):
        acc = torch.float64 if h.dtype == torch.float64 else torch.float32
        logits = F.linear(h, w, b).to(acc)  # Hugging Face's order: the logits in the input dtype, then up-cast
        if "softcap" in kw:
            logits = kw["softcap"] * torch.tanh(logits / kw["softcap"])
        cw = kw["weight"].to(acc) if "weight" in kw else None
        loss = F.cross_entropy(logits, target, weight=cw, label_smoothing=kw.get("label_smoothing", 0.0),
                               reduction=reduction)
        if "z_loss" in kw:
            lse = torch.logsumexp(logits, -1)
            z = kw["z_loss"] * lse * lse * (target != -100)
            denom = (cw[target.clamp(min=0)] * (target != -100)).sum() if cw is not None else (target != -100).sum()
            loss = loss + (z if reduction == "none" else z.sum() / denom)
        return loss

    def ours(h, w, b):
        return linear_cross_entropy(h, w, target, bias=b, reduction=reduction, chunk_size=16,
                                    class_weight=kw.get("weight"), label_smoothing=kw.get("label_smoothing", 0.0),
                                    z_loss=kw.get("z_loss", 0.0), softcap=kw.get("softcap"))

    ref = run(torch.float64, eager)
    got, base = run(torch.bfloat16, ours), run(torch.bfloat16, eager)
    assert got[1].dtype == torch.bfloat16
    for name, g, e, r in zip(("dhidden", "dweight", "dbias"), got, base, ref, strict=False):
        err, err_eager = (g.double() - r).abs().max(), (e.double() - r).abs().max()
        floor = torch.finfo(torch.bfloat16).eps * r.abs().max()
        assert err <= 2 * err_eager + floor, (name, float(err), float(err_eager))


def test_dweight_by_slices_keeps_no_fp32_accumulator(monkeypatch):
    # The buffers live in the op layer, the same on every backend; the Triton interpreter adds host copies of
    # each launch's arguments that a GPU launch does not make, so this measures on the cpu-reference backend.
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    n_tokens, vocab, n_hidden = 256, 2048, 64
    hidden, weight, target = _data(n_tokens, vocab, n_hidden, dtype=torch.bfloat16)
    peaks = {}
    for path in ("accumulate", "slices"):
        if path == "slices":
            _force_slices(monkeypatch, n_tokens, 2, cols=256)
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        with LiveBytesMeter() as meter:
            linear_cross_entropy(h, w, target, chunk_size=32).backward()
        peaks[path] = meter.result.peak_bytes
    vh = vocab * n_hidden
    # accumulate: an fp32 accumulator (4 V H) and a bf16 product per chunk (2 V H), then the bf16 cast;
    # slices: dweight is born in bf16 (2 V H) and scaled in place, plus the [N, S] buffer and dhidden.
    assert peaks["accumulate"] >= 6 * vh
    assert peaks["slices"] <= 2 * vh + n_tokens * 256 * 2 + n_tokens * (2 * n_hidden + 64), peaks


@pytest.mark.parametrize("backend", ["kernel", "reference"])
def test_cross_entropy_rows_on_column_slices_equals_whole_rows(backend):
    from wavefront import reference
    from wavefront.kernels import cross_entropy as kernels

    rows_ce = kernels.cross_entropy_rows if backend == "kernel" else reference.cross_entropy_rows
    gen = torch.Generator().manual_seed(5)
    n_rows, vocab = 9, 300
    logits = torch.randn(n_rows, vocab, generator=gen) * 3
    target = torch.randint(0, vocab, (n_rows,), generator=gen)
    target[2] = -100
    target[4], target[5] = 0, vocab - 1  # the first and the last class: slice boundaries
    cw = torch.rand(vocab, generator=gen) + 0.5
    kw = dict(ignore_index=-100, label_smoothing=0.1, z_loss=1e-3, softcap=4.0)
    _, stats = rows_ce(logits, target, cw, **kw)
    scale = torch.rand(n_rows, generator=gen)
    whole = torch.empty_like(logits)
    rows_ce(logits, target, cw, stats=stats, grad=whole, scale=scale, **kw)
    for start, end in ((0, 128), (128, 256), (256, 300)):
        part = logits[:, start:end].contiguous()
        rows_ce(part, target, cw, stats=stats, grad=part, scale=scale, col_offset=start, n_classes=vocab, **kw)
        assert torch.equal(part, whole[:, start:end]), (start, end)
    with pytest.raises(ValueError, match="columns"):
        rows_ce(logits[:, :10].contiguous(), target, cw, stats=stats, grad=whole[:, :10].contiguous(),
                scale=scale, col_offset=295, n_classes=vocab, **kw)
    with pytest.raises(ValueError, match="column slice needs saved stats"):
        rows_ce(logits[:, :10].contiguous(), target, cw, col_offset=0, n_classes=vocab, **kw)


def test_second_backward_through_one_graph_is_refused():
    hidden, weight, target = _data()
    w = weight.clone().requires_grad_()
    loss = linear_cross_entropy(hidden, w, target, chunk_size=16)
    loss.backward(retain_graph=True)
    first = w.grad.clone()
    with pytest.raises(RuntimeError, match="backward ran a second time"):
        loss.backward()
    assert torch.equal(w.grad, first)  # nothing was added by the refused call
    # reduction="none" recomputes in its backward, so it supports it
    w.grad = None
    rows = linear_cross_entropy(hidden, w, target, reduction="none", chunk_size=16)
    rows.sum().backward(retain_graph=True)
    rows.sum().backward()
    torch.testing.assert_close(w.grad, 2 * first * (target != -100).sum(), rtol=1e-5, atol=1e-6)


def test_minus_inf_bias_gives_torch_loss_not_nan():
    # Issue #13 defect 1: a -inf LM-head bias (masked vocabulary) made the loss NaN.
    hidden, weight, target = _data(vocab=300)
    bias = torch.zeros(300)
    bias[7:40] = -float("inf")
    target = torch.where(target == -100, target, target % 7)
    ours = linear_cross_entropy(hidden, weight, target, bias=bias, chunk_size=16)
    torch.testing.assert_close(ours, _eager(hidden, weight, target, bias), rtol=1e-5, atol=1e-6)
