"""Vocabulary-parallel cross-entropy and linear cross-entropy on 2 gloo processes (CPU, Triton interpreter):
the accuracy rule against the float64 reference of the unsharded loss, forward and backward, every option;
no rank ever holds a tensor the size of the whole logits. One torchrun for the module (_vocab_worker.py),
then one test per check; plus the single-process argument errors."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from _torchrun import by_name, run_worker_once

from wavefront.parallel import vocab_parallel_cross_entropy, vocab_parallel_linear_cross_entropy

WORLD = 2


@pytest.fixture(scope="module")
def checks(tmp_path_factory) -> dict:
    return by_name(run_worker_once("_vocab_worker.py", tmp_path_factory, WORLD))


ACCURACY = [f"ce/{case}/{dtype}/{what}"
            for case in ("plain", "options", "sum_divisor", "none", "all_ignored", "max_on_one_rank", "wide_blocks",
                         "padded_vocab")
            for dtype in ("float32", "bfloat16") for what in ("loss", "dlogits")]
ACCURACY += [f"{case}/{dtype}/{what}"
             for case, grads in (("lce_chunks_bias", ("dhidden", "dweight", "dbias")),
                                 ("lce_options", ("dhidden", "dweight")), ("lce_none", ("dhidden", "dweight")))
             for dtype in ("float32", "bfloat16") for what in ("loss", *grads)]


@pytest.mark.parametrize("name", ACCURACY)
def test_accuracy_rule_against_unsharded(checks, name):
    per_rank = checks[name]
    assert set(per_rank) == set(range(WORLD))
    for rank, r in per_rank.items():
        assert r["finite"], (rank, r)
        assert r["ours_err"] <= r["bound"], (rank, r)


def test_every_rank_sees_the_same_loss(checks):
    # The loss is replicated: the same float64 error on every rank means the same value.
    for name, per_rank in checks.items():
        if name.endswith("/loss"):
            assert per_rank[0]["ours_err"] == per_rank[1]["ours_err"], name


def test_no_rank_holds_the_whole_logits(checks):
    ce = checks["memory/ce"]
    lce = checks["memory/lce"]
    for rank in range(WORLD):
        # cross_entropy: the largest tensor is the shard's own size (its gradient), half the whole logits.
        assert ce[rank]["max_bytes"] <= ce[rank]["shard_bytes"] < ce[rank]["full_bytes"]
        # linear cross-entropy: not even the shard's logits; the chunk buffer or an input is the largest.
        bound = max(lce[rank]["chunk_bytes"], lce[rank]["largest_input_bytes"])
        assert lce[rank]["max_bytes"] <= bound < lce[rank]["shard_bytes"]


def test_collectives_are_the_statistics_and_the_hidden_gradient(checks):
    for rank in range(WORLD):
        ce, lce = checks["collectives/ce"][rank], checks["collectives/lce"][rank]
        # Forward: all-reduce MAX of the row max, all-reduce SUM of the [N, 3] sums; nothing else. The first call
        # of a signature also all-gathers the ranks' sizes and options (the agreement check), once.
        assert ce["forward"] == lce["forward"] == ["allreduce_.default"] * 2
        assert ce["first_forward"] == lce["first_forward"] == ["allgather_.default"] + ["allreduce_.default"] * 2
        # Backward: the logits' gradient needs no collective; dhidden needs one all-reduce.
        assert ce["backward"] == []
        assert lce["backward"] == ["allreduce_.default"]
        # The predicted tokens (and the accuracy, z-loss): the raw maximum rides in the MAX all-reduce, one MIN
        # all-reduce picks the first column of it; the backward is unchanged.
        ce, lce = checks["collectives/ce_outputs"][rank], checks["collectives/lce_outputs"][rank]
        assert ce["forward"] == lce["forward"] == ["allreduce_.default"] * 3
        assert ce["backward"] == []
        assert lce["backward"] == ["allreduce_.default"]


OUTPUTS = [f"outputs/ce/{rule}/{dtype}/{what}" for rule in ("token", "weighted") for dtype in ("float32", "bfloat16")
           for what in ("loss", "z_loss")]
OUTPUTS += [f"outputs/lce/{dtype}/z_loss" for dtype in ("float32", "bfloat16")]


@pytest.mark.parametrize("name", OUTPUTS)
def test_returned_values_by_the_accuracy_rule(checks, name):
    for rank, r in checks[name].items():
        assert r["finite"], (rank, r)
        assert r["ours_err"] <= r["bound"], (rank, r)


@pytest.mark.parametrize("name", [f"outputs/ce/{rule}/{dtype}/exact" for rule in ("token", "weighted")
                                  for dtype in ("float32", "bfloat16")]
                         + [f"outputs/lce/{dtype}/exact" for dtype in ("float32", "bfloat16")])
def test_predicted_tokens_accuracy_and_unchanged_gradients(checks, name):
    for rank, r in checks[name].items():
        assert r["predicted"] and r["accuracy"], (rank, r)
        assert r["hits"] > 0, (rank, r)  # the targets include argmax hits: the accuracy is not trivially 0
        assert r["grad_same"] and r["no_grad_fields"], (rank, r)


ERRORS = {
    # check: (exception, words the message must hold)
    "target_out_of_range": ("ValueError", ("'target'", "outside [0, 16)")),
    "class_weight_shard": ("ValueError", ("'weight'", "16")),
    "label_smoothing": ("ValueError", ("'label_smoothing'", "[0, 1)")),
    "lce_weight_hidden": ("ValueError", ("'weight'", "[vocab / 2, 16]")),
    "lce_bias_shard": ("ValueError", ("'bias'", "bias shard")),
    "group_type": ("TypeError", ("'group'", "ProcessGroup")),
}


@pytest.mark.parametrize("name", sorted(ERRORS))
def test_bad_arguments_are_named(checks, name):
    kind, words = ERRORS[name]
    for rank in range(WORLD):
        r = checks[f"errors/{name}"][rank]
        assert r["type"] == kind, r
        for word in words:
            assert word in r["message"], (word, r["message"])


def test_needs_an_initialized_process_group():
    if dist.is_initialized():
        pytest.skip("a process group exists in this process")
    with pytest.raises(RuntimeError, match="vocab_parallel_cross_entropy: torch.distributed is not initialized"):
        vocab_parallel_cross_entropy(torch.randn(4, 8), torch.zeros(4, dtype=torch.long))
    with pytest.raises(RuntimeError, match="vocab_parallel_linear_cross_entropy: torch.distributed"):
        vocab_parallel_linear_cross_entropy(torch.randn(4, 8), torch.randn(16, 8), torch.zeros(4, dtype=torch.long))
