"""The dK/dV kernel's TMA path (sm_90, sm_100; the interpreter runs tensor descriptors, so it runs here too):
K and V by TMA once per program, Q and dO streamed through 3-D tensor descriptors over the GQA group inside
one loop over (query head, query tile), prefetched by the loop's software pipeline.

Numerics: the path changes how the operands arrive, not the products or their order, so its dK, dV (and
atomic dQ) must equal the pointer path's bit for bit under the interpreter, and meet the float64 accuracy
rule. Machine code: compiled ahead of time for sm_90 and sm_100, the default (deterministic, d128) dK/dV
kernel must issue its Q and dO copies (UTMALDG) inside the main loop, spill nothing, and keep the block-wide
barriers per iteration at the figures docs/kernels-attention-gemm.md quotes."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from wavefront import reference, runtime
from wavefront.kernels import attention as kernels
from wavefront.kernels._launch import recording
from wavefront.kernels.attention_config import attention_config
from wavefront.ops._spec import Tolerance

CPU = runtime.get_arch("cpu")


def _inputs(H, H_kv, S, D, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, h, S, D, generator=gen).to(torch.bfloat16) for h in (H, H_kv, H_kv, H))


def _bwd(q, k, v, dout, causal, cu, max_len, **kw):
    scale = q.shape[-1] ** -0.5
    o, lse2 = kernels.attention_fwd(q, k, v, causal, scale, cu, max_len, arch=CPU)
    with recording() as launches:
        grads = kernels.attention_bwd(dout, q, k, v, o, lse2, causal, scale, cu, max_len, arch=CPU, **kw)
    (dkdv,) = [la for la in launches if la.name.startswith("_attn_bwd_dkdv")]
    return grads, dkdv


@pytest.mark.parametrize(("causal", "lengths", "head_dim", "heads", "deterministic"), [
    # packed causal sequences (one shorter than a tile), ragged tails, padded head dim (48 -> 64), GQA 2:1
    (True, (37, 5, 20), 48, (4, 2), True),
    # dense, non-causal, a partial last tile, GQA 4:1, atomic dQ (the dQ^T share form under the interpreter)
    (False, (40,), 32, (4, 1), False),
    # dense causal MHA, atomic dQ
    (True, (29,), 64, (2, 2), False),
])
def test_tma_path_equals_pointer_path_and_meets_accuracy(causal, lengths, head_dim, heads, deterministic):
    q, k, v, dout = _inputs(*heads, sum(lengths), head_dim)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32) if len(lengths) > 1 else None
    max_len = max(lengths) if cu is not None else 0
    tma, launch = _bwd(q, k, v, dout, causal, cu, max_len, deterministic=deterministic, tma=True)
    assert launch.name == "_attn_bwd_dkdv_tma_kernel" and launch.constexprs["NUM_STAGES"] >= 1
    assert launch.constexprs["ATOMIC_DQ"] is not deterministic
    ptr, launch = _bwd(q, k, v, dout, causal, cu, max_len, deterministic=deterministic, tma=False)
    assert launch.name == ("_attn_bwd_dkdv_kernel" if deterministic else "_attn_bwd_dkdv_atomic_kernel")
    for a, b in zip(tma, ptr, strict=True):
        assert torch.equal(a, b)

    # Against float64, with eager (math SDPA in bf16) as the yardstick: the accuracy rule.
    scale = head_dim ** -0.5
    ref = [t.double().requires_grad_() for t in (q, k, v)]
    reference.attention(*ref, causal=causal, scale=scale, cu_seqlens=cu).backward(dout.double())
    eager = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    reference.attention_sdpa_math(*eager, causal=causal, scale=scale, cu_seqlens=cu).backward(dout)
    for ours, e, r in zip(tma, eager, ref, strict=True):
        want = r.grad
        bound = Tolerance().bound(float((e.grad.double() - want).abs().max()), float(want.abs().max()), q.dtype)
        assert float((ours.double() - want).abs().max()) <= bound


def test_tma_path_with_a_two_stage_ring_and_wide_key_tile():
    """The sm_90/sm_100 entry's shape in miniature: BLOCK_N > BLOCK_M (a key tile spans several query tiles,
    so the causal start lo is not a multiple of BLOCK_N), a two-deep ring, several heads per group."""
    q, k, v, dout = _inputs(3, 1, 70, 32, seed=1)
    cfg = dataclasses.replace(attention_config("bwd_dkdv", 32, torch.bfloat16, CPU), BLOCK_M=16, BLOCK_N=32,
                              tma_stages=2)
    tma, launch = _bwd(q, k, v, dout, True, None, 0, dkdv_config=cfg, tma=True)
    assert launch.constexprs["NUM_STAGES"] == 2
    ptr, _ = _bwd(q, k, v, dout, True, None, 0, dkdv_config=cfg, tma=False)
    for a, b in zip(tma, ptr, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("arch_name", ["sm_90", "sm_100", "sm_80", "gfx942", "gfx1100"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_which_targets_take_the_tma_path(arch_name, head_dim):
    """sm_90/sm_100 take it wherever the entry reads Q and dO as stored at full width (d_split 1: head_dim
    <= 128), with a ring of two tiles; d256 (d_split 4), sm_80 and AMD keep the pointer path, whose launch
    options are unchanged."""
    arch = runtime.get_arch(arch_name)
    q = torch.empty(1, 4, 256, head_dim, dtype=torch.bfloat16)
    kv = torch.empty(1, 2, 256, head_dim, dtype=torch.bfloat16)
    lse = torch.empty(1, 4, 256)
    for deterministic in (True, False):
        with recording(execute=False) as launches:
            kernels.attention_bwd(q, q, kv, kv, q, lse, True, 0.1, arch=arch, deterministic=deterministic)
        (dkdv,) = [la for la in launches if la.name.startswith("_attn_bwd_dkdv")]
        expected = arch_name in ("sm_90", "sm_100") and head_dim <= 128
        pointer = "_attn_bwd_dkdv_kernel" if deterministic else "_attn_bwd_dkdv_atomic_kernel"
        assert dkdv.name == ("_attn_bwd_dkdv_tma_kernel" if expected else pointer)
        assert dkdv.constexprs.get("NUM_STAGES") == (2 if expected else None)


def test_strides_tma_cannot_address_keep_the_pointer_path():
    """A row stride that is not a multiple of 16 bytes (a head dim of 36 in a packed view) cannot be a TMA
    descriptor's stride: the launcher falls back to pointer loads."""
    arch = runtime.get_arch("sm_90")
    q = torch.empty(1, 4, 256, 37, dtype=torch.bfloat16)[..., :36]
    kv = torch.empty(1, 2, 256, 36, dtype=torch.bfloat16)
    with recording(execute=False) as launches:
        kernels.attention_bwd(q, q, kv, kv, q, torch.empty(1, 4, 256), True, 0.1, arch=arch)
    (dkdv,) = [la for la in launches if la.name.startswith("_attn_bwd_dkdv")]
    assert dkdv.name == "_attn_bwd_dkdv_kernel"


#: Block-wide barriers per main-loop iteration of the default d128 dK/dV kernel (Triton 3.9), the figures
#: docs/kernels-attention-gemm.md explains; the pointer path had 5 (sm_90) and 15 (sm_100). The opt-in Gluon
#: sm_100 kernel has 4 (tests/kernels/test_attention_bwd_gluon.py).
LOOP_BARRIERS = {"sm_90": 6, "sm_100": 8}


@pytest.mark.parametrize("target", [pytest.param("sm_90", marks=pytest.mark.slow), "sm_100"])
def test_machine_code_streams_q_and_do_by_tma_inside_the_loop(target):
    """About 15 s per target (an ahead-of-time compile at Llama-3-8B's shape); sm_90 under ``-m slow``."""
    from wavefront.workbench.static.inspect import compile_jobs, job_for
    from wavefront.workbench.static.parse import sass_tma_loads_by_loop

    q = torch.empty(1, 32, 8192, 128, dtype=torch.bfloat16)
    kv = torch.empty(1, 8, 8192, 128, dtype=torch.bfloat16)
    with recording(execute=False) as launches:
        kernels.attention_bwd(q, q, kv, kv, q, torch.empty(1, 32, 8192), True, 0.1, arch=runtime.get_arch(target))
    (dkdv,) = [la for la in launches if la.name == "_attn_bwd_dkdv_tma_kernel"]
    job = job_for(dkdv, target, keep_asm=True)
    (res,) = compile_jobs([job]).values()
    assert res.ok, res.error
    code = res.code
    assert code.spill_bytes == 0 and code.spill_count == 0
    assert res.shared_bytes <= runtime.get_arch(target).shared_mem_per_block
    # K and V before the loop (with the pipeline's prologue copies of the first Q/dO tiles), and one Q and
    # one dO copy per iteration inside it, 3-D copies from the group descriptors.
    before, inside, after = sass_tma_loads_by_loop(res.asm["sass"])
    assert inside == 2 and before >= 2 and after == 0
    assert "cp.async.bulk.tensor.3d" in res.asm["ptx"]
    # No pointer load of a Q/dO/K/V tile is left: the only plain global loads are lse2 and delta (32-bit).
    assert set(code.load_widths) <= {32}
    assert code.loop_barriers is not None and code.loop_barriers <= LOOP_BARRIERS[target]
