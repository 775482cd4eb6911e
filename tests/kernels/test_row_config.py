"""Launch configuration as pure functions of (n_cols, dtype, arch): tested without a GPU."""

from __future__ import annotations

import pytest
import torch

from wavefront.kernels.row_config import ROW_TABLES, row_config
from wavefront.runtime import ARCHS


@pytest.mark.parametrize("arch_name", ["sm_80", "sm_90", "sm_100", "gfx90a", "gfx942", "gfx1100", "cpu"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n_cols", [1, 7, 1000, 4096, 16384, 16385, 65536, 262144])
def test_configs_respect_the_architecture(arch_name, dtype, n_cols):
    arch = ARCHS[arch_name]
    cfg = row_config(n_cols, dtype, arch)
    assert cfg.num_warps <= arch.max_num_warps
    assert cfg.num_warps * arch.warp_size <= arch.max_threads_per_block
    assert cfg.BLOCK_N & (cfg.BLOCK_N - 1) == 0, "blocks are powers of two"
    table = ROW_TABLES[arch.family]
    assert cfg.single_pass == (n_cols <= table.max_single_pass_cols)
    if cfg.single_pass:
        assert n_cols <= cfg.BLOCK_N
    # Each thread moves whole 16-byte vectors whenever the block is wide enough to give it one.
    itemsize = torch.empty((), dtype=dtype).element_size()
    lanes = cfg.num_warps * arch.warp_size
    if cfg.BLOCK_N * itemsize >= 16 * lanes:
        assert (cfg.BLOCK_N // lanes) * itemsize % 16 == 0


def test_wave64_gets_half_the_warps_of_wave32_for_the_same_row():
    nv = row_config(4096, torch.bfloat16, ARCHS["sm_90"])
    amd = row_config(4096, torch.bfloat16, ARCHS["gfx942"])
    assert nv.BLOCK_N == amd.BLOCK_N == 4096
    assert nv.num_warps == 2 * amd.num_warps


def test_bad_width_is_rejected():
    with pytest.raises(ValueError, match="n_cols"):
        row_config(0, torch.float32, ARCHS["sm_90"])
