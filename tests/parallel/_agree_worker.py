"""Worker for tests/parallel/test_sharded_agreement.py, run under torchrun (gloo, CPU, 2 ranks): the sharded
helpers called with arguments that differ between ranks. Each case records, per rank, the error it raised (or
none) and, where the call is valid, what it returned. Rank 0 writes the results as JSON to argv[1]."""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from _torchrun import process_group, report  # this folder is on sys.path: torchrun runs the worker as a script

from wavefront.nn import MoEExperts
from wavefront.parallel import (
    ExpertParallelExperts,
    ring_attention,
    vocab_parallel_cross_entropy,
    vocab_parallel_linear_cross_entropy,
)


def _outcome(name: str, call) -> dict:
    try:
        out = call()
    except Exception as e:  # noqa: BLE001 - the test asserts on the type and message
        return {"name": name, "error": type(e).__name__, "message": str(e)}
    return {"name": name, "error": None, **(out or {})}


def _ce(rank: int, rows: int, width: int, **kw):
    gen = torch.Generator().manual_seed(rank)
    logits = torch.randn(rows, width, generator=gen)
    target = torch.randint(0, 16, (rows,), generator=torch.Generator().manual_seed(9))
    return vocab_parallel_cross_entropy(logits, target, **kw)


def _ring(rank: int, seq: int, heads: int = 2, seq_k: int | None = None):
    gen = torch.Generator().manual_seed(rank)
    q = torch.randn(1, heads, seq, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, heads, seq if seq_k is None else seq_k, 8, generator=gen, dtype=torch.float64,
                    requires_grad=True)
    v = torch.randn(k.shape, generator=gen, dtype=torch.float64, requires_grad=True)
    out = ring_attention(q, k, v, causal=True)
    out.sum().backward()
    return {"out_shape": list(out.shape), "grad_shapes": [list(t.grad.shape) for t in (q, k, v)]}


def _ep(rank: int, n_experts: int = 4, bad: bool = True, wrong_counts: bool = False):
    """Expert parallelism with invalid indices (dropped: zero contribution) and given counts that disagree with
    the indices (ignored): the same output as the one-process experts on the same rows."""
    torch.manual_seed(0)
    full = MoEExperts(n_experts, 8, 6)
    ep = ExpertParallelExperts.from_experts(full)
    gen = torch.Generator().manual_seed(10 + rank)
    x = torch.randn(6, 8, generator=gen)
    idx = torch.rand(6, n_experts, generator=gen).argsort(-1)[:, :2]
    if bad and rank == 0:
        idx[1, 0], idx[4, 1] = n_experts, -1
    w = torch.rand(6, 2, generator=gen)
    counts = torch.full((n_experts,), 5, dtype=torch.int32) if wrong_counts else None
    got = ep(x, idx, w, counts)
    expect = full(x, idx, w)
    return {"err": float((got - expect).abs().max()), "finite": bool(torch.isfinite(got).all()),
            "dropped": int(ep.dropped_assignments), "full_dropped": int(full.dropped_assignments)}


def _checks(rank: int) -> list[dict]:
    calls = 0
    real_all_gather = dist.all_gather

    def counting(*args, **kwargs):
        nonlocal calls
        calls += 1
        return real_all_gather(*args, **kwargs)

    dist.all_gather = counting
    results = [
        _outcome("ce/shard_widths_differ", lambda: _ce(rank, 5, 8 if rank == 0 else 6)),
        _outcome("ce/rows_differ", lambda: _ce(rank, 5 if rank == 0 else 4, 8)),
        _outcome("ce/ignore_index_differs", lambda: _ce(rank, 5, 8, ignore_index=-100 if rank == 0 else -1)),
        _outcome("lce/shard_rows_differ", lambda: vocab_parallel_linear_cross_entropy(
            torch.randn(4, 6), torch.randn(5 if rank == 0 else 7, 6), torch.zeros(4, dtype=torch.int64))),
        # One rank's arguments are also locally invalid: the others would wait in the collective.
        _outcome("ce/bad_on_one_rank", lambda: _ce(rank, 5, 8 if rank == 0 else 0)),
        _outcome("ring/lengths_differ", lambda: _ring(rank, 4 if rank == 0 else 6)),
        _outcome("ring/empty_on_one_rank", lambda: _ring(rank, 0 if rank == 0 else 4)),
        _outcome("ring/empty_on_every_rank", lambda: _ring(rank, 0)),
        _outcome("ring/heads_differ", lambda: _ring(rank, 4, heads=2 if rank == 0 else 4)),
        # Before the agreed EP calls: a rank whose call signature was already agreed skips the check (cached),
        # so a disagreement after it would not be seen by that rank (docs/parallel.md).
        _outcome("ep/num_experts_differ", lambda: _ep(rank, n_experts=4 if rank == 0 else 2, bad=False)),
        _outcome("ep/invalid_indices", lambda: _ep(rank)),
        _outcome("ep/counts_disagree", lambda: _ep(rank, bad=False, wrong_counts=True)),
    ]
    # After the errors the group still works: an agreed call, then the same call again (no second check).
    before = calls
    first = _ce(rank, 5, 8)
    after_first = calls
    second = _ce(rank, 5, 8)
    results.append({"name": "ce/agreed_then_cached", "error": None, "loss": float(first),
                    "same": bool(torch.equal(first, second)), "checks_first": after_first - before,
                    "checks_second": calls - after_first})
    dist.all_gather = real_all_gather
    return results


def main() -> None:
    with process_group(sys.argv[1]) as (rank, world):
        report(_checks(rank), sys.argv[1])


if __name__ == "__main__":
    main()
