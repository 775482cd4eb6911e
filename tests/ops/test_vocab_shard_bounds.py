"""The vocabulary-parallel kernels with targets outside the shard and outside the vocabulary (negative, past V,
far out): nothing is read or written outside the shard's logits, the weights or the outputs (memcheck), a target
outside [0, V) that is not ignore_index gives NaN statistics (as the reference does) and a NaN gradient row."""

from __future__ import annotations

import pytest
import torch

from wavefront import reference
from wavefront.kernels import cross_entropy as ce_kernels
from wavefront.kernels import vocab_parallel as kernels

V, V_R = 24, 8  # three shards of 8 classes
TARGETS = torch.tensor([3, 10, 23, -1, 24, 10 ** 9, -(2 ** 40), -100])


@pytest.mark.parametrize("col_offset", [0, 8, 16])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_shard_stats_with_targets_out_of_range(col_offset, smoothing):
    from wavefront.memcheck import checking

    logits = torch.randn(TARGETS.numel(), V_R, generator=torch.Generator().manual_seed(0))
    weight = torch.rand(V, generator=torch.Generator().manual_seed(1))
    kw = dict(ignore_index=-100, label_smoothing=smoothing, softcap=None, col_offset=col_offset, n_classes=V)
    with checking():
        got = kernels.vocab_shard_stats(logits, TARGETS, weight, **kw)
    expect = reference.vocab_shard_stats(logits, TARGETS, weight, **kw)
    torch.testing.assert_close(got, expect, equal_nan=True)
    bad = (TARGETS != -100) & ((TARGETS < 0) | (TARGETS >= V))
    assert torch.isnan(got[bad, 2]).all() and not torch.isnan(got[~bad]).any()


@pytest.mark.parametrize("col_offset", [0, 16])
def test_shard_gradient_with_targets_out_of_range(col_offset):
    from wavefront.memcheck import checking

    logits = torch.randn(TARGETS.numel(), V_R, generator=torch.Generator().manual_seed(2))
    stats = torch.stack([logits.max(1).values, torch.zeros(TARGETS.numel())], 1) + 1.0
    grad = torch.empty_like(logits)
    with checking():
        ce_kernels.cross_entropy_rows(logits, TARGETS, None, ignore_index=-100, label_smoothing=0.0, z_loss=0.0,
                                      softcap=None, stats=stats, grad=grad, scale=torch.ones(()),
                                      col_offset=col_offset, n_classes=V)
    ref = torch.empty_like(logits)
    reference.cross_entropy_rows(logits, TARGETS, None, ignore_index=-100, label_smoothing=0.0, z_loss=0.0,
                                 softcap=None, stats=stats, grad=ref, scale=torch.ones(()), col_offset=col_offset,
                                 n_classes=V)
    # A target outside [0, V) (not ignore_index): the kernel's gradient row is NaN, like its loss. (The
    # reference's cross_entropy_rows gives such a row a finite softmax instead; the ops refuse such targets
    # before either runs.) Every other row, the ignored one included, matches the reference.
    bad = (TARGETS != -100) & ((TARGETS < 0) | (TARGETS >= V))
    assert torch.isnan(grad[bad]).all()
    torch.testing.assert_close(grad[~bad], ref[~bad])
