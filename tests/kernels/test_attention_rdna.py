"""The gfx1100 (RDNA3, wave32) attention entries computed through the interpreter: each head dim's
forward, dK/dV and dQ candidates (column splits, transposed copies and head-dim chunks included) give the
float64 reference's result, so the table's spill-free shapes are also correct ones. The forward runs the
pointer-load path gfx1100 compiles (the interpreter would otherwise take the TMA path, which ignores
d_chunk). Their machine code (registers, spills) is checked by tests/ops/test_matrix_instructions.py."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from wavefront import reference, runtime
from wavefront.kernels import attention as kernels
from wavefront.kernels.attention_config import AttentionConfig as _T
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


def test_every_spilling_row_is_chunked():
    """The rows whose full-width tiles spilled on gfx1100 (forward d256, dQ d128/d256, dK/dV d256) default to
    the chunked score products."""
    rdna = runtime.get_arch("gfx1100")
    for kind, head_dim in (("fwd", 256), ("bwd_dq", 128), ("bwd_dq", 256), ("bwd_dkdv", 256)):
        assert attention_candidates(kind, head_dim, torch.bfloat16, rdna)[0].d_chunk == 64, (kind, head_dim)


@pytest.mark.parametrize(("causal", "deterministic"), [(True, True), (False, True), (True, False)])
def test_chunks_with_a_padded_head_dim(causal, deterministic):
    """head_dim 80 in a 128-wide tile with 32-column chunks: the third chunk straddles HEAD_DIM (masked
    columns) and the fourth lies wholly in the padding (skipped); GQA (4 query heads on 2 K/V heads). The
    atomic-dQ backward (deterministic=False) runs the chunked dK/dV kernel, as it does on RDNA."""
    chunked = {kind: dataclasses.replace(c, waves_per_eu=0, d_chunk=32) for kind, c in
               (("fwd", _T(16, 16, 4, 1, "")), ("bwd_dkdv", _T(16, 32, 4, 1, "")), ("bwd_dq", _T(32, 16, 4, 1, "")))}
    _check(chunked, 80, runtime.get_arch("cpu"), causal=causal, n_kv_heads=2, deterministic=deterministic)


def _check(cfgs, head_dim, cpu, causal=True, n_kv_heads=None, deterministic=True):
    gen = torch.Generator().manual_seed(0)
    # 40 rows: several key tiles of every entry (and query tiles of all but the 64-row forward), the causal
    # diagonal and a ragged tail.
    q, dout = (torch.randn(1, 4 if n_kv_heads else 2, 40, head_dim, generator=gen).to(torch.bfloat16)
               for _ in range(2))
    k, v = (torch.randn(1, n_kv_heads or 2, 40, head_dim, generator=gen).to(torch.bfloat16) for _ in range(2))
    scale = head_dim ** -0.5
    o, lse2 = kernels.attention_fwd(q, k, v, causal, scale, arch=cpu, config=cfgs["fwd"], tma=False)
    dq, dk, dv = kernels.attention_bwd(dout, q, k, v, o, lse2, causal, scale, arch=cpu,
                                       dkdv_config=cfgs["bwd_dkdv"], dq_config=cfgs["bwd_dq"],
                                       deterministic=deterministic)
    ref = [t.double().requires_grad_() for t in (q, k, v)]
    o_ref = reference.attention(*ref, causal=causal)
    o_ref.backward(dout.double())
    eps = torch.finfo(torch.bfloat16).eps
    for got, want in zip((o, dq, dk, dv), (o_ref.detach(), *(t.grad for t in ref)), strict=True):
        # Two ulps of the largest magnitude: one for the final rounding, one for the bf16 P/dS operands.
        assert float((got.double() - want).abs().max()) <= 2 * eps * float(want.abs().max())
