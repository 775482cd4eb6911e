"""Worker for tests/parallel/test_fp8_fsdp.py, run under torchrun (2 gloo processes, CPU, Triton interpreter).

Per recipe (rowwise, tensorwise, blockwise): a two-block model of Float8Linear layers (fp32 masters, FSDP2 with
bf16 param_dtype and fp32 reduce_dtype, one fully_shard per block and at the root) runs forward, backward, an
AdamW step and a second forward twice from the same seed: with the FP8 weight all-gather and without it. Each
rank records whether the outputs, the input gradient and its local shards of the weight gradients are
bit-identical, and the bytes handed to the collectives (FSDP2's all-gather and our scale collectives) in each
run. "rowwise_keep" repeats rowwise with reshard_after_forward=False (no re-gather before backward: the dx
product gathers its per-column copy from the local shard); "rowwise_recompute" with activation checkpointing
(the forward recomputed in backward holds the per-column copy and gathers its per-row one from the shard);
"*_uneven": 65 hidden rows, shards of 33 and 32 (FSDP2 pads the last one; so does the FP8 all-gather input).
Rank 0 writes the results as JSON to argv[1]."""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
import torch.utils.checkpoint
from _torchrun import process_group, report  # this folder is on sys.path: torchrun runs the worker as a script
from torch import nn

from wavefront.nn import Float8Linear
from wavefront.parallel.fp8_fsdp import Fp8GatheredWeight, Fp8ShardedWeight, enable_fp8_all_gather

IN, ROWS = 64, 8
HIDDEN = {"blockwise": 256}  # 128-row shards of the up projection on 2 ranks; the down projection's 32 are not


class Block(nn.Module):
    def __init__(self, recipe: str, recompute: bool = False, hidden: int | None = None):
        super().__init__()
        hidden = hidden or HIDDEN.get(recipe, 64)
        self.up = Float8Linear(IN, hidden, bias=False, recipe=recipe)
        self.down = Float8Linear(hidden, IN, bias=True, recipe=recipe)
        self.recompute = recompute

    def _body(self, x):
        return x + self.down(torch.relu(self.up(x)))

    def forward(self, x):
        if self.recompute:
            return torch.utils.checkpoint.checkpoint(self._body, x, use_reentrant=False)
        return self._body(x)


class Counter:
    """Bytes of the tensors handed to all-gathers and all-reduces while installed."""

    def __init__(self):
        self.bytes = {"all_gather": 0, "all_reduce": 0}
        self._orig = {}

    def __enter__(self):
        for name in ("all_gather_into_tensor", "all_gather_single", "all_reduce"):
            fn = getattr(dist, name, None)
            if fn is None:
                continue
            self._orig[name] = fn
            kind = "all_reduce" if name == "all_reduce" else "all_gather"

            def wrapped(*args, _fn=fn, _kind=kind, **kwargs):
                inp = kwargs.get("input_tensor", kwargs.get("tensor"))
                if inp is None:
                    inp = args[0] if _kind == "all_reduce" else args[1]
                self.bytes[_kind] += inp.numel() * inp.element_size()
                return _fn(*args, **kwargs)

            setattr(dist, name, wrapped)
        return self

    def __exit__(self, *exc):
        for name, fn in self._orig.items():
            setattr(dist, name, fn)


def _run(recipe: str, fp8_gather: bool, reshard: bool, recompute: bool, hidden: int | None) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    torch.manual_seed(0)
    model = nn.Sequential(Block(recipe, recompute, hidden), Block(recipe, recompute, hidden))
    report = enable_fp8_all_gather(model, dist.get_world_size(), marked_only=False) if fp8_gather else None
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model:
        fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(1 + dist.get_rank())
    x = torch.randn(ROWS, IN, generator=gen).bfloat16().requires_grad_()
    dy = torch.randn(ROWS, IN, generator=gen).bfloat16()
    seen = []
    hook = model[0].up.register_forward_pre_hook(lambda m, a: seen.append(type(m.weight).__name__))
    with Counter() as count:
        y = model(x)
        y.backward(dy)
    hook.remove()
    grads = [p.grad.to_local().clone() for p in model.parameters()]
    kinds = sorted({type(p.to_local()).__name__ for p in model.parameters()})
    opt.step()
    opt.zero_grad()
    y2 = model(x.detach())
    return {"y": y.detach(), "dx": x.grad, "grads": grads, "y2": y2.detach(), "bytes": count.bytes, "seen": seen,
            "local_kinds": kinds, "wrapped": list(report.wrapped) if report else []}


def _same(a, b) -> bool:
    return bool(torch.equal(a.view(torch.int16 if a.dtype == torch.bfloat16 else torch.int32),
                            b.view(torch.int16 if b.dtype == torch.bfloat16 else torch.int32)))


def check(name: str, recipe: str, reshard: bool = True, recompute: bool = False, hidden: int | None = None) -> dict:
    base = _run(recipe, False, reshard, recompute, hidden)
    ours = _run(recipe, True, reshard, recompute, hidden)
    return {"name": name, "y_equal": _same(ours["y"], base["y"]), "dx_equal": _same(ours["dx"], base["dx"]),
            "grads_equal": [_same(a, b) for a, b in zip(ours["grads"], base["grads"], strict=True)],
            "y2_equal": _same(ours["y2"], base["y2"]),
            "y_err": float((ours["y"].double() - base["y"].double()).abs().max()),
            "bytes_fp8": ours["bytes"], "bytes_base": base["bytes"], "seen": ours["seen"],
            "local_kinds": ours["local_kinds"], "wrapped": ours["wrapped"]}


def main() -> None:
    torch.set_num_threads(1)
    checks = {"rowwise": ("rowwise", True), "tensorwise": ("tensorwise", True), "blockwise": ("blockwise", True),
              "rowwise_keep": ("rowwise", False), "rowwise_recompute": ("rowwise", True, True),
              "rowwise_uneven": ("rowwise", True, False, 65), "tensorwise_uneven": ("tensorwise", True, False, 65)}
    wanted = sys.argv[2].split(",") if len(sys.argv) > 2 else list(checks)
    with process_group(sys.argv[1]):
        report([check(name, *checks[name]) for name in wanted], sys.argv[1])


if __name__ == "__main__":
    assert Fp8GatheredWeight and Fp8ShardedWeight
    main()
