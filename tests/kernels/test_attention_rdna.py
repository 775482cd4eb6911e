"""The gfx1100 (RDNA3, wave32) attention entries computed through the interpreter: each head dim's
forward, dK/dV and dQ candidates (column splits and transposed copies included) give the float64
reference's result, so the table's least-spilling shapes are also correct ones. Their machine code
(registers, spills) is checked by tests/ops/test_matrix_instructions.py."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from wavefront import reference, runtime
from wavefront.kernels import attention as kernels
from wavefront.kernels.attention_config import attention_candidates


@pytest.mark.parametrize("head_dim", [pytest.param(64, marks=pytest.mark.slow), 128,
                                      pytest.param(256, marks=pytest.mark.slow)])
def test_gfx1100_entries_under_the_interpreter(head_dim):
    rdna = runtime.get_arch("gfx1100")
    # waves_per_eu is an AMD compile option the interpreter refuses; the tile, warps, d_split and transposed
    # copies are what is exercised.
    cands = {kind: [dataclasses.replace(c, waves_per_eu=0) for c in attention_candidates(kind, head_dim, torch.bfloat16,
                                                                                          rdna)]
             for kind in ("fwd", "bwd_dkdv", "bwd_dq")}
    for i in range(max(map(len, cands.values()))):  # every candidate: the default and the recomputing ones
        _check({kind: c[min(i, len(c) - 1)] for kind, c in cands.items()}, head_dim, runtime.get_arch("cpu"))


def _check(cfgs, head_dim, cpu):
    gen = torch.Generator().manual_seed(0)
    # 40 rows: several key tiles of every entry (and query tiles of all but the 64-row forward), the causal
    # diagonal and a ragged tail.
    q, k, v, dout = (torch.randn(1, 2, 40, head_dim, generator=gen).to(torch.bfloat16) for _ in range(4))
    scale = head_dim ** -0.5
    o, lse2 = kernels.attention_fwd(q, k, v, True, scale, arch=cpu, config=cfgs["fwd"])
    dq, dk, dv = kernels.attention_bwd(dout, q, k, v, o, lse2, True, scale, arch=cpu,
                                       dkdv_config=cfgs["bwd_dkdv"], dq_config=cfgs["bwd_dq"])
    ref = [t.double().requires_grad_() for t in (q, k, v)]
    o_ref = reference.attention(*ref, causal=True)
    o_ref.backward(dout.double())
    eps = torch.finfo(torch.bfloat16).eps
    for got, want in zip((o, dq, dk, dv), (o_ref.detach(), *(t.grad for t in ref)), strict=True):
        # Two ulps of the largest magnitude: one for the final rounding, one for the bf16 P/dS operands.
        assert float((got.double() - want).abs().max()) <= 2 * eps * float(want.abs().max())
