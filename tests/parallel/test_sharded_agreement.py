"""The sharded helpers check that every rank calls them alike: one small all-gather of sizes and options per
new call signature, and on disagreement the same clear ValueError on every rank, never a plausible wrong loss
or an abort inside gloo. 2 gloo processes (_agree_worker.py)."""

from __future__ import annotations

import pytest
from _torchrun import by_name, run_worker_once

WORLD = 2


@pytest.fixture(scope="module")
def checks(tmp_path_factory) -> dict:
    return by_name(run_worker_once("_agree_worker.py", tmp_path_factory, WORLD))


@pytest.mark.parametrize(("name", "words"), [
    ("ce/shard_widths_differ", ["shard width", "rank 0: 8", "rank 1: 6"]),
    ("ce/rows_differ", ["rows", "rank 0: 5", "rank 1: 4"]),
    ("ce/ignore_index_differs", ["options fingerprint"]),
    ("lce/shard_rows_differ", ["shard rows", "rank 0: 5", "rank 1: 7"]),
    ("ce/bad_on_one_rank", ["shard width", "rank 0: 8", "rank 1: 0"]),
    ("ring/lengths_differ", ["q's local sequence length", "rank 0: 4", "rank 1: 6"]),
    ("ring/empty_on_one_rank", ["q's local sequence length", "rank 0: 0", "rank 1: 4"]),
    ("ring/heads_differ", ["shape fingerprint"]),
    ("ep/num_experts_differ", ["num_experts", "rank 0: 4", "rank 1: 2"]),
])
def test_disagreement_raises_the_same_error_on_every_rank(checks, name, words):
    per_rank = checks[name]
    assert set(per_rank) == set(range(WORLD))
    messages = {r["message"] for r in per_rank.values()}
    assert {r["error"] for r in per_rank.values()} == {"ValueError"}, per_rank
    assert len(messages) == 1, messages
    (message,) = messages
    assert "every rank of the group must pass the same" in message
    for w in words:
        assert w in message, message


def test_empty_shards_on_every_rank_give_empty_attention(checks):
    for r in checks["ring/empty_on_every_rank"].values():
        assert r["error"] is None, r
        assert r["out_shape"] == [1, 2, 0, 8]
        assert r["grad_shapes"] == [[1, 2, 0, 8]] * 3


@pytest.mark.parametrize("name", ["ep/invalid_indices", "ep/counts_disagree"])
def test_expert_parallel_exchange_follows_the_indices(checks, name):
    # Before: counts that disagree with the rows moe_permute placed made one rank's all-to-all refuse its split
    # sizes while the other waited (or, with a matching total, sent rows to the wrong rank).
    for rank, r in checks[name].items():
        assert r["error"] is None, r
        assert r["finite"] and r["err"] < 1e-5, r
        assert r["dropped"] == r["full_dropped"] == (2 if name == "ep/invalid_indices" and rank == 0 else 0), r


def test_agreed_call_checks_once_then_is_cached(checks):
    per_rank = checks["ce/agreed_then_cached"]
    assert per_rank[0]["loss"] == per_rank[1]["loss"]
    for r in per_rank.values():
        assert r["error"] is None and r["same"]
        assert r["checks_first"] == 1 and r["checks_second"] == 0, r


def test_cache_is_per_group_and_forgets_a_destroyed_one(tmp_path, monkeypatch):
    import torch
    import torch.distributed as dist

    from wavefront.parallel import _agree

    if dist.is_initialized():
        pytest.skip("a process group is already set up in this process")
    calls = []
    real = dist.all_gather
    monkeypatch.setattr(dist, "all_gather", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    for round_ in range(2):
        dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store{round_}", rank=0, world_size=1)
        try:
            for _ in range(3):
                _agree.check_agreement("op", None, torch.device("cpu"), {"rows": 5})
            assert len(calls) == round_ + 1  # checked once per group, not per call
        finally:
            dist.destroy_process_group()
        import gc

        gc.collect()
        assert not [k for k in _agree._AGREED if k[0] == "op"]  # forgotten with its group
