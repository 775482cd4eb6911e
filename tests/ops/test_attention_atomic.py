"""The non-deterministic attention backward (``deterministic=False``): dK, dV and the atomic dQ shares formed
in one pass. Under the interpreter the atomics run in program order, so these runs are repeatable; what they
pin is the arithmetic: dK and dV bit for bit equal to the deterministic kernels' (same products, same
order), dQ within the accuracy rule against float64, and the launch (one pass, no dQ kernel)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from wavefront import ops, reference, runtime
from wavefront.kernels import attention as kernels
from wavefront.kernels._launch import recording
from wavefront.kernels.attention_config import attention_candidates, attention_config
from wavefront.ops._spec import Tolerance

CPU = runtime.get_arch("cpu")


def _inputs(H, H_kv, S, D, dtype=torch.bfloat16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, k, v, dout = (torch.randn(1, h, S, D, generator=gen).to(dtype) for h in (H, H_kv, H_kv, H))
    return q, k, v, dout


def _grads(fn, q, k, v, dout, **kw):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    fn(q, k, v, **kw).backward(dout)
    return q.grad, k.grad, v.grad


@pytest.mark.parametrize(("causal", "lengths", "head_dim", "block_m", "d_split", "transposed"), [
    # packed causal sequences, ragged tails, padded head dim; 16 query rows: the share formed as dQ^T (sm_90)
    (True, (37, 5, 20), 48, 16, 1, False),
    # 64 query rows: the share formed as dQ; columns split over two programs, AMD's operand copies
    (False, (40,), 64, 64, 2, True),
])
def test_atomic_dq_matches_the_deterministic_kernels(causal, lengths, head_dim, block_m, d_split, transposed):
    q, k, v, dout = _inputs(2, 1, sum(lengths), head_dim)  # GQA: two query heads per k/v head
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    scale = head_dim ** -0.5
    o, lse2 = kernels.attention_fwd(q, k, v, causal, scale, cu, max(lengths), arch=CPU)
    cfg = dataclasses.replace(attention_config("bwd_atomic", head_dim, q.dtype, CPU), BLOCK_M=block_m,
                              d_split=d_split, transposed=transposed)
    with recording() as launches:
        dq, dk, dv = kernels.attention_bwd(dout, q, k, v, o, lse2, causal, scale, cu, max(lengths), arch=CPU,
                                           dkdv_config=cfg, deterministic=False)
    # Under the interpreter the entry without operand copies or split columns takes the TMA kernel.
    tma = d_split == 1 and not transposed
    assert [la.name for la in launches] == [
        "_attn_bwd_delta_kernel", "_attn_bwd_dkdv_tma_kernel" if tma else "_attn_bwd_dkdv_atomic_kernel"]
    if tma:
        assert launches[1].constexprs["ATOMIC_DQ"] is True
    assert launches[1].constexprs["DQ_TRANSPOSED"] == (block_m < 64)
    # The deterministic kernels with the same dK/dV tile: the same dK/dV products in the same order.
    want = kernels.attention_bwd(dout, q, k, v, o, lse2, causal, scale, cu, max(lengths), arch=CPU,
                                 dkdv_config=cfg)
    assert torch.equal(dk, want[1]) and torch.equal(dv, want[2])
    assert dq.dtype == q.dtype and dq.shape == q.shape

    # dQ against float64: the accuracy rule, with eager (math SDPA in bf16) as the yardstick.
    ref = [t.double().requires_grad_() for t in (q, k, v)]
    reference.attention(*ref, causal=causal, scale=scale, cu_seqlens=cu).backward(dout.double())
    eager = _grads(reference.attention_sdpa_math, q, k, v, dout, causal=causal, scale=scale, cu_seqlens=cu)
    dq_ref = ref[0].grad
    bound = Tolerance().bound(float((eager[0].double() - dq_ref).abs().max()), float(dq_ref.abs().max()), q.dtype)
    assert float((dq.double() - dq_ref).abs().max()) <= bound
    assert float((want[0].double() - dq_ref).abs().max()) <= bound


def test_op_option_reaches_the_backward_and_compiles():
    """ops.attention(..., deterministic=False): one backward pass with atomic dQ, the same gradients as the
    default within rounding, and the same under torch.compile(fullgraph=True)."""
    q, k, v, dout = _inputs(2, 1, 24, 32)

    def f(q, k, v, deterministic):
        return ops.attention(q, k, v, causal=True, deterministic=deterministic)

    with recording() as launches:
        fast = _grads(f, q, k, v, dout, deterministic=False)
    names = [la.name for la in launches]
    assert "_attn_bwd_dq_kernel" not in names and sum(n.startswith("_attn_bwd_dkdv") for n in names) == 1
    exact = _grads(f, q, k, v, dout, deterministic=True)
    assert torch.equal(fast[1], exact[1]) and torch.equal(fast[2], exact[2])
    eps = torch.finfo(torch.bfloat16).eps
    assert float((fast[0].float() - exact[0].float()).abs().max()) <= 2 * eps * float(exact[0].abs().max())

    compiled = _grads(torch.compile(f, fullgraph=True, backend="aot_eager"), q, k, v, dout, deterministic=False)
    for a, b in zip(compiled, fast, strict=True):
        assert torch.equal(a, b)


def test_deterministic_must_be_a_bool():
    q, k, v, _ = _inputs(2, 2, 8, 16)
    with pytest.raises(TypeError, match="'deterministic' must be a bool"):
        ops.attention(q, k, v, deterministic=1)


@pytest.mark.parametrize("arch_name", ["sm_80", "sm_90", "sm_100", "gfx90a", "gfx942", "gfx1100", "cpu"])
def test_every_target_has_an_atomic_config(arch_name):
    """Every family serves the atomic kernel: its own entries on sm_90/sm_100 and CDNA (whose 32x32 dK/dV tiles
    spill with the dQ share), else its dK/dV tiles."""
    arch = runtime.get_arch(arch_name)
    for head_dim in (64, 128, 256):
        (cfg,) = attention_candidates("bwd_atomic", head_dim, torch.bfloat16, arch)
        assert cfg.reason and min(cfg.BLOCK_M, cfg.BLOCK_N) >= 16
        if arch_name not in ("sm_90", "sm_100", "gfx90a", "gfx942"):
            assert cfg == attention_config("bwd_dkdv", head_dim, torch.bfloat16, arch)
