"""Worker for tests/parallel/test_vocab_parallel.py, run under torchrun (gloo, CPU): every check of the
vocabulary-parallel losses against the float64 reference of the unsharded loss, with eager PyTorch's error in
the same dtype as the yardstick. Rank 0 writes the results as JSON to argv[1]."""

from __future__ import annotations

import json
import os
import sys
import zlib

import torch
import torch.distributed as dist
from _torchrun import process_group  # this folder is on sys.path: torchrun runs the worker as a script
from torch.utils._python_dispatch import TorchDispatchMode

from wavefront import reference
from wavefront.ops._spec import Tolerance
from wavefront.parallel import vocab_parallel_cross_entropy, vocab_parallel_linear_cross_entropy
from wavefront.workbench.bench.live_bytes import LargestTensorMeter


def _err(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return float((ours.double() - ref.double()).abs().max()) if ref.numel() else 0.0


def _check(name: str, ours, eager, ref, dtype) -> dict:
    ref_max = float(ref.double().abs().max()) if ref.numel() else 0.0
    eager_err = _err(eager, ref)
    return {"name": name, "ours_err": _err(ours, ref), "eager_err": eager_err,
            "bound": Tolerance().bound(eager_err, ref_max, dtype), "finite": bool(torch.isfinite(ours).all())}


def _gather_cols(t: torch.Tensor, dim: int) -> torch.Tensor:
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, t.contiguous())
    return torch.cat(parts, dim=dim)


def _targets(n: int, vocab: int, gen, ignore_frac: float) -> torch.Tensor:
    t = torch.randint(0, vocab, (n,), generator=gen)
    return torch.where(torch.rand(n, generator=gen) < ignore_frac, torch.full_like(t, -100), t)


class Collectives(TorchDispatchMode):
    """The collectives (c10d ops) issued while active, by name."""

    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "c10d":
            self.names.append(func.__name__)
        return func(*args, **(kwargs or {}))


def collective_checks(world: int) -> list[dict]:
    """Which collectives forward and backward issue: the statistics in the forward; in the backward nothing
    for the logits' gradient and one all-reduce for the fused variant's dhidden."""
    n, vocab, hid = 8, 32, 8
    gen = torch.Generator().manual_seed(11)
    target = _targets(n, vocab, gen, 0.1)
    shard = torch.randn(n, vocab // world, generator=gen).requires_grad_()
    hidden = torch.randn(n, hid, generator=gen).requires_grad_()
    w_shard = torch.randn(vocab // world, hid, generator=gen).requires_grad_()
    out = []
    tokens = dict(return_predicted_tokens=True, return_token_accuracy=True, return_z_loss=True, z_loss=1e-3)
    for name, fn in (("ce", lambda: vocab_parallel_cross_entropy(shard, target, None, label_smoothing=0.1)),
                     ("lce", lambda: vocab_parallel_linear_cross_entropy(hidden, w_shard, target, None)),
                     ("ce_outputs", lambda: vocab_parallel_cross_entropy(shard, target, None, **tokens).loss),
                     ("lce_outputs", lambda: vocab_parallel_linear_cross_entropy(hidden, w_shard, target, None,
                                                                                 **tokens).loss)):
        with Collectives() as first:  # the ranks' agreement check, once per call signature
            fn()
        with Collectives() as fwd:
            loss = fn()
        with Collectives() as bwd:
            loss.backward()
        out.append({"name": f"collectives/{name}", "first_forward": first.names, "forward": fwd.names,
                    "backward": bwd.names})
    return out


CE_CASES = [
    # name, n_rows, vocab, options, logit scale, ignore fraction
    ("plain", 12, 96, {}, 2.0, 0.2),
    ("options", 12, 96, {"label_smoothing": 0.1, "z_loss": 1e-3, "softcap": 30.0, "class_weight": True}, 20.0, 0.2),
    ("sum_divisor", 12, 96, {"reduction": "sum", "divisor": 7.0}, 2.0, 0.2),
    ("none", 12, 96, {"reduction": "none"}, 2.0, 0.2),
    ("all_ignored", 4, 64, {}, 2.0, 1.1),
    ("max_on_one_rank", 8, 96, {"label_smoothing": 0.1}, 30.0, 0.0),
    ("wide_blocks", 2, 2 * 20000, {"z_loss": 1e-4, "label_smoothing": 0.1}, 10.0, 0.0),
    ("padded_vocab", 8, 96, {"z_loss": 1e-3}, 2.0, 0.2),
]
#: Padding classes (logits -inf) from this fraction of the vocabulary on: part of the last shard, or all of it.
PADDED_FROM = {"padded_vocab": 0.5}

LCE_CASES = [
    # name, n_tokens, vocab, hidden, options
    ("lce_chunks_bias", 20, 96, 16, {"chunk_size": 8, "with_bias": True}),
    ("lce_options", 20, 96, 16, {"chunk_size": 8, "label_smoothing": 0.1, "z_loss": 1e-3, "softcap": 30.0,
                                 "class_weight": True}),
    ("lce_none", 20, 96, 16, {"chunk_size": 16, "reduction": "none"}),
]


def _split(opts: dict, vocab: int, gen) -> dict:
    opts = dict(opts)
    if opts.pop("class_weight", False):
        opts["weight"] = torch.rand(vocab, generator=gen) + 0.1
    return opts


def ce_checks(rank: int, world: int, dtype) -> list[dict]:
    out = []
    for name, n, vocab, options, scale, ignore in CE_CASES:
        gen = torch.Generator().manual_seed(zlib.crc32(name.encode()))
        logits64 = torch.randn(n, vocab, generator=gen, dtype=torch.float64) * scale
        if name == "max_on_one_rank":
            logits64[:, : vocab // world] += 40.0  # rank 0's shard holds every row's max by far
        target = _targets(n, vocab, gen, ignore)
        if name in PADDED_FROM:
            real = int(vocab * PADDED_FROM[name])
            logits64[:, real:] = float("-inf")  # the whole last shard with 2 ranks, a part of it with 4
            target = torch.where(target >= real, target % real, target)
        opts = _split(options, vocab, gen)
        reduction = opts.get("reduction", "mean")
        grad_out = torch.randn(n, generator=gen, dtype=torch.float64) if reduction == "none" else None
        v_r = vocab // world
        shard = logits64[:, rank * v_r:(rank + 1) * v_r].to(dtype).requires_grad_()
        loss = vocab_parallel_cross_entropy(shard, target, None, **opts)
        loss.backward(None if grad_out is None else grad_out.to(loss.dtype))
        grad = _gather_cols(shard.grad, 1)
        results = {}
        for label, x in (("ref", logits64.clone()), ("eager", logits64.to(dtype))):
            x.requires_grad_()
            ref_loss = reference.cross_entropy(x, target, **opts)
            ref_loss.backward(None if grad_out is None else grad_out.to(ref_loss.dtype))
            results[label] = (ref_loss.detach(), x.grad)
        tag = f"ce/{name}/{str(dtype).split('.')[-1]}"
        out.append(_check(tag + "/loss", loss.detach(), results["eager"][0], results["ref"][0], dtype))
        out.append(_check(tag + "/dlogits", grad, results["eager"][1], results["ref"][1], dtype))
    return out


def lce_checks(rank: int, world: int, dtype) -> list[dict]:
    out = []
    for name, n, vocab, hid, options in LCE_CASES:
        gen = torch.Generator().manual_seed(zlib.crc32(name.encode()))
        opts = dict(options)
        hidden64 = torch.randn(n, hid, generator=gen, dtype=torch.float64)
        scale = 20.0 if "softcap" in opts else 2.0
        weight64 = torch.randn(vocab, hid, generator=gen, dtype=torch.float64) * hid ** -0.5 * scale
        bias64 = torch.randn(vocab, generator=gen, dtype=torch.float64) * 0.5 if opts.pop("with_bias", False) else None
        if opts.pop("class_weight", False):
            opts["class_weight"] = torch.rand(vocab, generator=gen) + 0.1
        target = _targets(n, vocab, gen, 0.2)
        reduction = opts.get("reduction", "mean")
        grad_out = torch.randn(n, generator=gen, dtype=torch.float64) if reduction == "none" else None
        v_r = vocab // world
        rows = slice(rank * v_r, (rank + 1) * v_r)
        hidden = hidden64.to(dtype).requires_grad_()
        w_shard = weight64[rows].to(dtype).requires_grad_()
        b_shard = bias64[rows].to(dtype).requires_grad_() if bias64 is not None else None
        loss = vocab_parallel_linear_cross_entropy(hidden, w_shard, target, None, bias=b_shard, **opts)
        loss.backward(None if grad_out is None else grad_out.to(loss.dtype))
        ours = {"loss": loss.detach(), "dhidden": hidden.grad, "dweight": _gather_cols(w_shard.grad, 0)}
        if b_shard is not None:
            ours["dbias"] = _gather_cols(b_shard.grad, 0)
        ref_opts = {k: v for k, v in opts.items() if k != "chunk_size"}
        results = {}
        for label, cast in (("ref", torch.float64), ("eager", dtype)):
            h, w = (t.to(cast, copy=True).requires_grad_() for t in (hidden64, weight64))
            b = bias64.to(cast, copy=True).requires_grad_() if bias64 is not None else None
            ref_loss = reference.linear_cross_entropy(h, w, target, bias=b, **ref_opts)
            ref_loss.backward(None if grad_out is None else grad_out.to(ref_loss.dtype))
            results[label] = {"loss": ref_loss.detach(), "dhidden": h.grad, "dweight": w.grad,
                              "dbias": None if b is None else b.grad}
        tag = f"{name}/{str(dtype).split('.')[-1]}"
        for key, value in ours.items():
            out.append(_check(f"{tag}/{key}", value, results["eager"][key], results["ref"][key], dtype))
    return out


OUTPUT_OPTIONS = {"label_smoothing": 0.1, "z_loss": 1e-2, "softcap": 30.0}
RETURN_ALL = {"return_z_loss": True, "return_predicted_tokens": True, "return_token_accuracy": True}


def _argmax_close(predicted: torch.Tensor, logits64: torch.Tensor, target: torch.Tensor, dtype) -> bool:
    """The accuracy rule for a discrete output: at every non-ignored row the predicted class's float64 logit is
    the row's maximum, up to the rounding of the logits to ``dtype`` (two ulps of the maximum, plus a floor)."""
    valid = target != -100
    if not bool((predicted[~valid] == -100).all()):
        return False
    rows = logits64[valid]
    top = rows.max(dim=1).values
    at = rows.gather(1, predicted[valid][:, None]).squeeze(1)
    slack = 2 * torch.finfo(dtype).eps * top.abs() + 1e-6
    return bool(((top - at) <= slack).all())


def output_checks(rank: int, world: int, dtype) -> list[dict]:
    """return_z_loss / return_predicted_tokens / return_token_accuracy of both variants: the z-loss term by the
    accuracy rule against float64 (eager's error in ``dtype`` the yardstick), the predicted tokens exactly the
    argmax of the gathered logits (the plain variant) or by the rule above (the fused one, whose logits are
    our GEMM's), the accuracy from them, and the gradients bit-identical to a call that asks for nothing."""
    out = []
    tag = str(dtype).split(".")[-1]
    n, vocab, hid = 16, 96, 16
    v_r = vocab // world
    gen = torch.Generator().manual_seed(101)
    logits64 = torch.randn(n, vocab, generator=gen, dtype=torch.float64) * 10.0
    hidden64 = torch.randn(n, hid, generator=gen, dtype=torch.float64)
    weight64 = torch.randn(vocab, hid, generator=gen, dtype=torch.float64) * hid ** -0.5 * 10.0
    target = _targets(n, vocab, gen, 0.2)
    target[0] = int(logits64[0].to(dtype).argmax())  # at least one hit
    target[1] = int(logits64[1].to(dtype).argmax()) if target[1] != -100 else target[1]
    class_weight = torch.rand(vocab, generator=gen) + 0.1
    for z_rule in ("token", "weighted"):
        opts = dict(OUTPUT_OPTIONS, weight=class_weight, z_loss_reduction=z_rule)
        shard = logits64[:, rank * v_r:(rank + 1) * v_r].to(dtype).requires_grad_()
        res = vocab_parallel_cross_entropy(shard, target, None, **opts, **RETURN_ALL)
        res.loss.backward()
        plain = shard.detach().clone().requires_grad_()
        vocab_parallel_cross_entropy(plain, target, None, **opts).backward()
        full = logits64.to(dtype)
        expect = torch.where(target != -100, full.argmax(-1), torch.full_like(target, -100))
        z_ref, _, _ = reference.cross_entropy_extras(logits64, target, **{k: v for k, v in opts.items()
                                                                           if k != "label_smoothing"})
        z_eager, _, _ = reference.cross_entropy_extras(full, target, **{k: v for k, v in opts.items()
                                                                        if k != "label_smoothing"})
        loss_ref = reference.cross_entropy(logits64, target, **opts)
        loss_eager = reference.cross_entropy(full, target, **opts)
        hits = ((expect == target) & (target != -100)).sum() / (target != -100).sum()
        name = f"outputs/ce/{z_rule}/{tag}"
        out.append(_check(f"{name}/loss", res.loss.detach(), loss_eager, loss_ref, dtype))
        out.append(_check(f"{name}/z_loss", res.z_loss, z_eager, z_ref, dtype))
        out.append({"name": f"{name}/exact", "predicted": bool(torch.equal(res.predicted_tokens, expect)),
                    "accuracy": abs(float(res.token_accuracy) - float(hits)) < 1e-6,
                    "hits": float(res.token_accuracy), "grad_same": bool(torch.equal(shard.grad, plain.grad)),
                    "no_grad_fields": not (res.z_loss.requires_grad or res.token_accuracy.requires_grad)})
    opts = dict(OUTPUT_OPTIONS, class_weight=class_weight, chunk_size=8)
    rows = slice(rank * v_r, (rank + 1) * v_r)
    logits_ref = hidden64 @ weight64.T
    target = target.clone()
    target[0] = int(logits_ref[0].argmax())  # a clear maximum (logits ~10 apart): a hit in every dtype
    grads = []
    for extra in (RETURN_ALL, {}):
        hidden = hidden64.to(dtype).requires_grad_()
        w_shard = weight64[rows].to(dtype).requires_grad_()
        res = vocab_parallel_linear_cross_entropy(hidden, w_shard, target, None, **opts, **extra)
        (res.loss if extra else res).backward()
        grads.append((hidden.grad, w_shard.grad))
        if extra:
            kept = res
    ref_opts = {k: v for k, v in opts.items() if k not in ("chunk_size", "class_weight")}
    logits_eager = (hidden64.to(dtype) @ weight64.to(dtype).T)
    z_ref, _, _ = reference.cross_entropy_extras(logits_ref, target, weight=class_weight,
                                                 **{k: v for k, v in ref_opts.items() if k != "label_smoothing"})
    z_eager, _, _ = reference.cross_entropy_extras(logits_eager, target, weight=class_weight,
                                                   **{k: v for k, v in ref_opts.items() if k != "label_smoothing"})
    name = f"outputs/lce/{tag}"
    out.append(_check(f"{name}/z_loss", kept.z_loss, z_eager, z_ref, dtype))
    pred = kept.predicted_tokens
    valid = target != -100
    out.append({"name": f"{name}/exact", "predicted": _argmax_close(pred, logits_ref, target, dtype),
                "accuracy": abs(float(kept.token_accuracy) - float(((pred == target) & valid).sum() / valid.sum()))
                < 1e-6, "hits": float(kept.token_accuracy),
                "grad_same": all(torch.equal(a, b) for a, b in zip(grads[0], grads[1], strict=True)),
                "no_grad_fields": not (kept.z_loss.requires_grad or kept.token_accuracy.requires_grad)})
    return out


def memory_checks(rank: int, world: int) -> list[dict]:
    """The largest tensor any op creates on this rank, forward and backward, against the shard's logits."""
    n, vocab, hid = 32, 256, 8
    gen = torch.Generator().manual_seed(7)
    v_r = vocab // world
    target = _targets(n, vocab, gen, 0.1)
    shard = torch.randn(n, v_r, generator=gen).requires_grad_()
    with LargestTensorMeter() as meter:
        vocab_parallel_cross_entropy(shard, target, None, label_smoothing=0.1, z_loss=1e-3).backward()
    out = [{"name": "memory/ce", "max_bytes": meter.max_bytes, "shard_bytes": n * v_r * 4, "full_bytes": n * vocab * 4}]
    hidden = torch.randn(n, hid, generator=gen).requires_grad_()
    w_shard = torch.randn(v_r, hid, generator=gen).requires_grad_()
    chunk = 8
    with LargestTensorMeter() as meter:
        vocab_parallel_linear_cross_entropy(hidden, w_shard, target, None, chunk_size=chunk).backward()
    out.append({"name": "memory/lce", "max_bytes": meter.max_bytes, "chunk_bytes": chunk * v_r * 4,
                "largest_input_bytes": max(n * hid, v_r * hid) * 4, "shard_bytes": n * v_r * 4,
                "full_bytes": n * vocab * 4})
    return out


def error_checks(world: int) -> list[dict]:
    """Bad arguments with a process group present: the error names the argument and the global vocabulary."""
    vocab, n, hid = 8 * world, 4, 16
    shard, hidden = torch.randn(n, vocab // world), torch.randn(n, hid)
    ok_target = torch.zeros(n, dtype=torch.long)
    calls = {
        "target_out_of_range": lambda: vocab_parallel_cross_entropy(shard, torch.full((n,), vocab), None),
        "class_weight_shard": lambda: vocab_parallel_cross_entropy(shard, ok_target, None,
                                                                   weight=torch.ones(vocab // world)),
        "label_smoothing": lambda: vocab_parallel_cross_entropy(shard, ok_target, None, label_smoothing=1.5),
        "lce_weight_hidden": lambda: vocab_parallel_linear_cross_entropy(hidden, torch.randn(vocab // world, hid + 1),
                                                                         ok_target, None),
        "lce_bias_shard": lambda: vocab_parallel_linear_cross_entropy(hidden, torch.randn(vocab // world, hid),
                                                                      ok_target, None, bias=torch.zeros(vocab)),
        "group_type": lambda: vocab_parallel_cross_entropy(shard, ok_target, "tp"),
    }
    out = []
    for name, call in calls.items():
        try:
            call()
            out.append({"name": f"errors/{name}", "type": None, "message": ""})
        except (ValueError, TypeError) as e:
            out.append({"name": f"errors/{name}", "type": type(e).__name__, "message": str(e)})
    return out


def main() -> None:
    which = sys.argv[2].split(",") if len(sys.argv) > 2 else ["ce", "lce", "outputs", "memory"]
    with process_group(sys.argv[1]) as (rank, world):
        results = []
        for dtype in (torch.float32, torch.bfloat16):
            if "ce" in which:
                results += ce_checks(rank, world, dtype)
            if "lce" in which:
                results += lce_checks(rank, world, dtype)
            if "outputs" in which:
                results += output_checks(rank, world, dtype)
        if "memory" in which:
            results += memory_checks(rank, world)
            results += error_checks(world)
            results += collective_checks(world)
        gathered = [None] * world
        dist.all_gather_object(gathered, results)
        if rank == 0:
            with open(sys.argv[1], "w") as f:
                json.dump({"world": world, "ranks": gathered, "interpret": os.environ.get("TRITON_INTERPRET")}, f)


if __name__ == "__main__":
    main()
