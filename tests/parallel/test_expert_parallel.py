"""Expert parallelism on 2 gloo processes, CPU, Triton interpreter (one torchrun for the module, _ep_worker.py):
one MoE layer with its experts split over the ranks against float64 in one process (accuracy rule, forward and
backward), a one-layer Mixtral trained 3 AdamW steps with EP2 and with EP2 x FSDP2 against one process (derived
tolerance, as tests/patching/test_convergence.py), full-weight state dicts; plus single-process argument errors.
Slow: 4 processes as a (dp 2, ep 2) mesh with FSDP2 over all of them."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from _torchrun import by_name, run_worker, run_worker_once

from wavefront.nn import MoE
from wavefront.parallel import ExpertParallelExperts, all_to_all_rows, expert_parallel

pytest.importorskip("transformers")

LAYER = [f"layer/{k}" for k in ("out", "dx", "d_router", "d_gate_up", "d_down")] + ["skewed/out"]
KEYS = ["model.layers.0.mlp.experts.gate_up_proj", "model.layers.0.mlp.experts.down_proj",
        "model.layers.0.mlp.gate.weight", "model.layers.0.self_attn.q_proj.weight", "lm_head.weight"]
TRAIN = [f"{run}/{what}" for run in ("train", "fsdp") for what in [f"loss{s}" for s in range(3)] + KEYS]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> dict:
    return by_name(run_worker_once("_ep_worker.py", tmp_path_factory, 2))


@pytest.mark.parametrize("name", LAYER + TRAIN)
def test_two_ranks_match_one_process(two_ranks, name):
    per_rank = two_ranks[name]
    assert set(per_rank) == {0, 1}
    for rank, r in per_rank.items():
        assert r["shape_ok"] and r["finite"], (rank, r)
        assert r["ours_err"] <= r["bound"], (rank, r)


@pytest.mark.parametrize("name", ["layer/converted", "layer/grad_scale", "layer/errors", "skewed/backward",
                                  "train/state_dict_roundtrip"])
def test_two_ranks_structure(two_ranks, name):
    assert all(r["ok"] for r in two_ranks[name].values()), two_ranks[name]


@pytest.mark.slow
def test_ep_by_fsdp2_on_a_two_dimensional_mesh(tmp_path):
    """4 ranks as (dp 2, ep 2): experts split over ep, their gradients averaged over dp, FSDP2 over all 4."""
    checks = by_name(run_worker("_ep_worker.py", tmp_path, 4))
    names = [f"mesh/loss{s}" for s in range(3)] + [f"mesh/{k}" for k in KEYS]
    assert set(checks) == set(names)
    for name in names:
        assert set(checks[name]) == set(range(4))
        for rank, r in checks[name].items():
            assert r["shape_ok"] and r["finite"] and r["ours_err"] <= r["bound"], (name, rank, r)


def test_expert_parallel_needs_a_process_group():
    if dist.is_initialized():
        pytest.skip("a default process group exists in this process")
    with pytest.raises(RuntimeError, match="expert_parallel: torch.distributed is not initialized"):
        expert_parallel(MoE(8, 4, 4, 2))
    with pytest.raises(RuntimeError, match="ExpertParallelExperts: torch.distributed is not initialized"):
        ExpertParallelExperts(4, 8, 4)


def test_all_to_all_rows_checks_the_splits():
    with pytest.raises(ValueError, match="'in_splits' must sum to x.shape\\[0\\] \\(3\\)"):
        all_to_all_rows(torch.zeros(3, 2), [1, 2], [1, 1])
