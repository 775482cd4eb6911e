"""LargestTensorMeter: the largest tensor an op returns inside the region; inputs made before it do not count."""

from __future__ import annotations

import torch

from wavefront.workbench.bench.live_bytes import LargestTensorMeter


def test_counts_op_outputs_not_inputs():
    a, b = torch.ones(4, 8), torch.ones(8, 16)  # b (512 B) exists before the region
    with LargestTensorMeter() as meter:
        (a @ b).sum()
    assert meter.max_bytes == 4 * 16 * 4  # the product; the sum is 4 B


def test_every_output_of_a_tuple_counts_with_its_element_size():
    x = torch.randn(3, 5)
    with LargestTensorMeter() as meter:
        x.max(dim=1)
    assert meter.max_bytes == 3 * 8  # int64 indices outweigh the fp32 values (12 B)
