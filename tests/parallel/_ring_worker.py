"""Worker for tests/parallel/test_ring_attention.py, run under torchrun (gloo, CPU): ring attention on every
rank's sequence shard against unsharded attention, forward and backward. float64 cases (the reference blocks)
check the ring's bookkeeping to rounding level; float32/bfloat16 cases run wavefront.ops.attention's kernels
(Triton interpreter) under the accuracy rule. Rank 0 writes the results as JSON to argv[1]."""

from __future__ import annotations

import sys
import zlib

import torch
import torch.distributed as dist
from _torchrun import process_group, report  # this folder is on sys.path: torchrun runs the worker as a script

from wavefront import reference
from wavefront.ops._spec import Tolerance
from wavefront.parallel import ring_attention, shard_sequence, unshard_sequence

# name, dtype, layout, causal, (B, H, H_kv, S per rank, D)
CASES = [
    ("f64_zigzag_causal_gqa", torch.float64, "zigzag", True, (2, 4, 2, 6, 8)),
    ("f64_contiguous_causal", torch.float64, "contiguous", True, (1, 2, 2, 5, 8)),
    ("f64_zigzag_full_mqa", torch.float64, "zigzag", False, (1, 4, 1, 4, 8)),
    ("f32_zigzag_causal_gqa", torch.float32, "zigzag", True, (1, 4, 2, 8, 16)),
    ("bf16_zigzag_causal_gqa", torch.bfloat16, "zigzag", True, (1, 4, 2, 8, 16)),
    ("bf16_contiguous_full", torch.bfloat16, "contiguous", False, (1, 2, 2, 8, 16)),
]
#: With 4 processes: a ring inside a group of 2 (ranks {0, 1} and {2, 3}).
SUBGROUP_CASE = ("subgroup_f64_zigzag_causal_gqa", torch.float64, "zigzag", True, (1, 4, 2, 6, 8))


def _err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max())


def _gather_seq(t: torch.Tensor, layout: str, group=None) -> torch.Tensor:
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, t.contiguous(), group=group)
    return unshard_sequence(parts, 2, layout)


def _attend(fn, q, k, v, do, causal):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out = fn(q, k, v, causal)
    out.backward(do.to(out.dtype))
    return {"out": out.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}


def _checks(cases, group, rank: int, world: int) -> list[dict]:
    results = []
    for name, dtype, layout, causal, (b, h, h_kv, s_local, d) in cases:
        gen = torch.Generator().manual_seed(zlib.crc32(name.encode()))
        s = s_local * world
        q64, k64, v64, do64 = (torch.randn(b, heads, s, d, generator=gen, dtype=torch.float64)
                               for heads in (h, h_kv, h_kv, h))
        ref = _attend(lambda q, k, v, c: reference.attention(q, k, v, c), q64, k64, v64, do64, causal)
        ours_local = _attend(
            lambda q, k, v, c, layout=layout: ring_attention(q, k, v, group, causal=c, layout=layout),
            *(shard_sequence(t.to(dtype), rank, world, 2, layout) for t in (q64, k64, v64)),
            shard_sequence(do64, rank, world, 2, layout), causal)
        ours = {key: _gather_seq(val, layout, group) for key, val in ours_local.items()}
        if dtype == torch.float64:
            eager = None
        else:
            eager = _attend(lambda q, k, v, c: reference.attention_sdpa_math(q, k, v, c), q64.to(dtype),
                            k64.to(dtype), v64.to(dtype), do64, causal)
        for key in ("out", "dq", "dk", "dv"):
            r = {"name": f"{name}/{key}", "ours_err": _err(ours[key], ref[key]),
                 "shape_ok": tuple(ours[key].shape) == tuple(ref[key].shape),
                 "finite": bool(torch.isfinite(ours[key]).all())}
            if eager is None:
                r["bound"] = 1e-12 * max(1.0, float(ref[key].abs().max()))
            else:
                r["eager_err"] = _err(eager[key], ref[key])
                r["bound"] = Tolerance().bound(r["eager_err"], float(ref[key].abs().max()), dtype)
            results.append(r)
    return results


def main() -> None:
    wanted = sys.argv[2].split(",") if len(sys.argv) > 2 else None
    with process_group(sys.argv[1]) as (rank, world):
        results = _checks([c for c in CASES if not wanted or any(c[0].startswith(w) for w in wanted)], None, rank,
                          world)
        if world == 4:
            # Two context-parallel groups of 2 ({0, 1}, {2, 3}): ring neighbours are group ranks mapped to global.
            groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
            results += _checks([SUBGROUP_CASE], groups[rank // 2], rank % 2, 2)
        report(results, sys.argv[1])


if __name__ == "__main__":
    main()
