"""Ring attention on 2 gloo processes (4 in a slow test), CPU: float64 cases check the ring's bookkeeping
(zig-zag and contiguous layouts, causal and not, GQA and MQA) to rounding level; float32 and bfloat16 cases
run wavefront.ops.attention's kernels under the Triton interpreter and pass the accuracy rule against
unsharded attention, forward and backward. One torchrun per world size (_ring_worker.py); plus the
single-process sharding helpers and argument errors."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from _torchrun import by_name, run_worker, run_worker_once

from wavefront.parallel import ring_attention, shard_sequence, unshard_sequence, zigzag_shard, zigzag_unshard

CASES = ["f64_zigzag_causal_gqa", "f64_contiguous_causal", "f64_zigzag_full_mqa", "f32_zigzag_causal_gqa",
         "bf16_zigzag_causal_gqa", "bf16_contiguous_full"]
NAMES = [f"{case}/{what}" for case in CASES for what in ("out", "dq", "dk", "dv")]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> dict:
    return by_name(run_worker_once("_ring_worker.py", tmp_path_factory, 2))


def _assert_rule(per_rank: dict, world: int) -> None:
    assert set(per_rank) == set(range(world))
    for rank, r in per_rank.items():
        assert r["shape_ok"] and r["finite"], (rank, r)
        assert r["ours_err"] <= r["bound"], (rank, r)


@pytest.mark.parametrize("name", NAMES)
def test_two_ranks_match_unsharded_attention(two_ranks, name):
    _assert_rule(two_ranks[name], 2)


@pytest.mark.parametrize("name", [n for n in NAMES if not n.startswith("f64")])
def test_two_ranks_within_twice_eager_without_the_ulp_floor(two_ranks, name):
    """The rule's one-ulp floor is not what passes the ring: delta (the backward's sum_d dO O) comes from the
    fp32 merged output, not from the output rounded to bf16 (with the rounded one, bf16 zig-zag causal GQA's
    dK error is 2.7x eager's)."""
    for rank, r in two_ranks[name].items():
        assert r["ours_err"] <= 2 * r["eager_err"], (rank, r)


@pytest.mark.slow
def test_four_ranks_match_unsharded_attention(tmp_path):
    checks = by_name(run_worker("_ring_worker.py", tmp_path, 4))
    # Plus a ring inside each of two groups of 2 ranks (group ranks mapped to global ones for send/recv).
    names = NAMES + [f"subgroup_f64_zigzag_causal_gqa/{what}" for what in ("out", "dq", "dk", "dv")]
    assert set(checks) == set(names)
    for name in names:
        _assert_rule(checks[name], 4)


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("layout", ["zigzag", "contiguous"])
def test_shard_and_unshard_are_inverse(world, layout):
    x = torch.arange(2 * 24).reshape(2, 24)
    shards = [shard_sequence(x, r, world, 1, layout) for r in range(world)]
    assert all(s.shape == (2, 24 // world) for s in shards)
    assert torch.equal(unshard_sequence(shards, 1, layout), x)
    # Every position is held by exactly one rank.
    assert sorted(torch.cat(shards, 1)[0].tolist()) == list(range(24))


def test_zigzag_pairs_an_early_and_a_late_chunk():
    pos = torch.arange(8)
    assert zigzag_shard(pos, 0, 2, 0).tolist() == [0, 1, 6, 7]
    assert zigzag_shard(pos, 1, 2, 0).tolist() == [2, 3, 4, 5]
    assert torch.equal(zigzag_unshard([zigzag_shard(pos, r, 2, 0) for r in range(2)], 0), pos)


def test_sharding_errors_name_the_argument():
    with pytest.raises(ValueError, match="multiple of 4"):
        zigzag_shard(torch.zeros(6), 0, 2, 0)
    with pytest.raises(ValueError, match="'layout'"):
        shard_sequence(torch.zeros(8), 0, 2, 0, "striped")
    with pytest.raises(ValueError, match="'rank'"):
        shard_sequence(torch.zeros(8), 2, 2, 0)


def test_ring_attention_checks_before_communicating():
    q = torch.randn(1, 4, 8, 16)
    with pytest.raises(ValueError, match="multiple of the number of k/v heads"):
        ring_attention(q, torch.randn(1, 3, 8, 16), torch.randn(1, 3, 8, 16), causal=True)
    with pytest.raises(ValueError, match="'layout'"):
        ring_attention(q, q, q, layout="striped")
    if not dist.is_initialized():
        with pytest.raises(RuntimeError, match="ring_attention: torch.distributed is not initialized"):
            ring_attention(q, q, q, causal=True)
