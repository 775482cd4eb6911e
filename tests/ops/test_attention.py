"""wavefront.ops.attention beyond the registry's accuracy cases (tests/ops/test_accuracy.py): properties that
pin the semantics (packed sequences, GQA, causality, one token), the GPU tile shapes run through the
interpreter, the launch configuration tables, the module forms, torch.compile, and bad input."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from wavefront import nn as wnn
from wavefront import ops, reference, runtime
from wavefront.kernels import attention as kernels
from wavefront.kernels import attention_common
from wavefront.kernels._launch import recording
from wavefront.kernels.attention_config import ATTENTION_TABLES, attention_candidates, attention_config, table_key


def _qkv(B, H, H_kv, S, D, dtype=torch.bfloat16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, S, D, generator=gen).to(dtype)
    k = torch.randn(B, H_kv, S, D, generator=gen).to(dtype)
    v = torch.randn(B, H_kv, S, D, generator=gen).to(dtype)
    return q, k, v


def _fwd_bwd(q, k, v, dout, **kw):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out = ops.attention(q, k, v, **kw)
    out.backward(dout)
    return out.detach(), q.grad, k.grad, v.grad


def test_packed_sequences_equal_separate_calls():
    """Each packed sequence is computed exactly as if it were alone: tiles start at each sequence's first
    row, so the arithmetic and the rounding are identical, bit for bit."""
    lengths = [5, 30, 1, 17]
    q, k, v = _qkv(1, 4, 2, sum(lengths), 64)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(1)).to(q.dtype)
    cu = torch.tensor([0, 5, 35, 36, 53], dtype=torch.int32)
    packed = _fwd_bwd(q, k, v, dout, causal=True, cu_seqlens=cu)
    for s, e in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True):
        alone = _fwd_bwd(q[:, :, s:e], k[:, :, s:e], v[:, :, s:e], dout[:, :, s:e], causal=True)
        for got, want in zip(packed, alone, strict=True):
            assert torch.equal(got[:, :, s:e], want), (s, e)


def test_strided_cu_seqlens():
    q, k, v = _qkv(1, 2, 1, 30, 64)
    every_other = torch.tensor([0, -1, 12, -1, 30], dtype=torch.int32)[::2]
    assert not every_other.is_contiguous()
    want = ops.attention(q, k, v, causal=True, cu_seqlens=torch.tensor([0, 12, 30], dtype=torch.int32))
    assert torch.equal(ops.attention(q, k, v, causal=True, cu_seqlens=every_other), want)


def test_gqa_equals_repeated_heads():
    """GQA on 2 k/v heads == MHA on k/v repeated per group; dk/dv are the group sums of the MHA grads."""
    q, k, v = _qkv(1, 6, 2, 37, 64, torch.float32)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(2))
    out, dq, dk, dv = _fwd_bwd(q, k, v, dout, causal=True)
    rep = [t.repeat_interleave(3, dim=1) for t in (k, v)]
    out_m, dq_m, dk_m, dv_m = _fwd_bwd(q, *rep, dout, causal=True)
    torch.testing.assert_close(out, out_m, rtol=0, atol=1e-6)
    torch.testing.assert_close(dq, dq_m, rtol=0, atol=1e-5)
    torch.testing.assert_close(dk, dk_m.view(1, 2, 3, 37, 64).sum(2), rtol=0, atol=1e-5)
    torch.testing.assert_close(dv, dv_m.view(1, 2, 3, 37, 64).sum(2), rtol=0, atol=1e-5)


def test_causal_rows_ignore_the_future():
    """Changing keys/values after position t leaves outputs up to t unchanged, bit for bit."""
    q, k, v = _qkv(1, 2, 2, 50, 64)
    t = 21
    out = ops.attention(q, k, v, causal=True)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, t + 1:] = 100.0
    v2[:, :, t + 1:] = -100.0
    out2 = ops.attention(q, k2, v2, causal=True)
    assert torch.equal(out[:, :, : t + 1], out2[:, :, : t + 1])
    assert not torch.equal(out[:, :, t + 1:], out2[:, :, t + 1:])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_single_token(dtype):
    """One key: P = 1 exactly, so O = V and dV = dO exactly; dQ and dK vanish in exact arithmetic and
    here are cancellation noise of dP - delta, bounded by a few fp32 ulps of |dP| (eager autograd happens
    to get exact zeros, which is why this case is not in the registry's 2x-eager rule)."""
    q, k, v = _qkv(3, 2, 2, 1, 64, dtype)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(3)).to(dtype)
    out, dq, dk, dv = _fwd_bwd(q, k, v, dout, causal=True)
    assert torch.equal(out, v)
    assert torch.equal(dv, dout)
    dp = (dout.float() * v.float()).sum(-1).abs().max()
    scale = 64 ** -0.5
    magnitude = float(k.float().abs().max() + q.float().abs().max())
    bound = 8 * torch.finfo(torch.float32).eps * float(dp) * scale * magnitude
    assert float(dq.float().abs().max()) <= bound
    assert float(dk.float().abs().max()) <= bound


def test_fp64_and_empty_use_the_reference():
    q, k, v = _qkv(1, 2, 1, 9, 32, torch.float64)
    torch.testing.assert_close(ops.attention(q, k, v, causal=True), reference.attention(q, k, v, True), rtol=0, atol=0)
    q0, k0, v0 = _qkv(2, 2, 2, 0, 64)
    assert ops.attention(q0, k0, v0).shape == (2, 2, 0, 64)


@pytest.mark.parametrize(("arch_name", "D", "S"), [("sm_90", 128, 200), ("gfx942", 128, 200), ("gfx942", 64, 136)])
def test_gpu_tile_shapes_under_the_interpreter(arch_name, D, S):
    """The NVIDIA and AMD default tiles (128-row query tiles, not the interpreter's small ones) computed
    through the interpreter: S rows cross tiles (CDNA's dK/dV: 16-row query blocks against 128-key tiles),
    the diagonal and a ragged tail."""
    arch = runtime.get_arch(arch_name)
    cpu = runtime.get_arch("cpu")
    cfgs = {kind: dataclasses.replace(attention_config(kind, D, torch.bfloat16, arch), waves_per_eu=0,
                                      matrix_instr_nonkdim=0, kpack=1) for kind in ("fwd", "bwd_dkdv", "bwd_dq")}
    q, k, v = _qkv(1, 2, 1, S, D)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(4)).to(q.dtype)
    o, lse2 = kernels.attention_fwd(q, k, v, True, D ** -0.5, arch=cpu, config=cfgs["fwd"])
    dq, dk, dv = kernels.attention_bwd(dout, q, k, v, o, lse2, True, D ** -0.5, arch=cpu,
                                       dkdv_config=cfgs["bwd_dkdv"], dq_config=cfgs["bwd_dq"])
    ref = [t.double().requires_grad_() for t in (q, k, v)]
    o_ref = reference.attention(*ref, causal=True)
    o_ref.backward(dout.double())
    eps = torch.finfo(torch.bfloat16).eps
    for got, want in zip((o, dq, dk, dv), (o_ref.detach(), *(t.grad for t in ref)), strict=True):
        # Two ulps of the largest magnitude: one for the final rounding, one for the bf16 P/dS operands.
        assert float((got.double() - want).abs().max()) <= 2 * eps * float(want.abs().max())


@pytest.mark.parametrize(("tma", "warp_specialize"), [(False, False), (True, False), (True, True)])
def test_forward_paths_under_the_interpreter(tma, warp_specialize):
    """Pointer loads (sm_80, AMD), tensor descriptors with the two-loop split, and the warp-specialized one
    loop (sm_90/sm_100, masking every block): packed causal sequences with ragged tails, a padded head dim
    (48 in 64-wide tiles) and GQA, each against float64."""
    cfg = dataclasses.replace(attention_config("fwd", 48, torch.bfloat16, runtime.get_arch("cpu")), BLOCK_M=16,
                              BLOCK_N=16, warp_specialize=warp_specialize)
    lengths = [37, 5, 20]
    q, k, v = _qkv(1, 4, 2, sum(lengths), 48)
    cu = torch.tensor([0, 37, 42, 62], dtype=torch.int32)
    o, lse2 = kernels.attention_fwd(q, k, v, True, 48 ** -0.5, cu, max(lengths), arch=runtime.get_arch("cpu"),
                                    config=cfg, tma=tma)
    eps = torch.finfo(torch.bfloat16).eps
    for s, e in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True):
        ref = reference.attention(*(t[:, :, s:e].double() for t in (q, k, v)), causal=True, scale=48 ** -0.5)
        assert float((o[:, :, s:e].double() - ref).abs().max()) <= 2 * eps * float(ref.abs().max()), (s, e)
    assert torch.isfinite(lse2).all()


def test_pipelined_forward_equals_the_one_loop_forward():
    """The hand-pipelined key loop (QK^T of block j+1 before the softmax of block j; sm_90's second
    candidate) computes the same products in the same order as the warp-specialized one loop: bit for bit,
    on packed causal sequences with a padded head dim, and with lse2."""
    cpu = runtime.get_arch("cpu")
    cfg = dataclasses.replace(attention_config("fwd", 48, torch.bfloat16, cpu), BLOCK_M=16, BLOCK_N=16)
    q, k, v = _qkv(1, 4, 2, 62, 48)
    cu = torch.tensor([0, 37, 42, 62], dtype=torch.int32)
    args = (q, k, v, True, 48 ** -0.5, cu, 37)
    with recording() as launches:
        piped = kernels.attention_fwd(*args, arch=cpu, config=dataclasses.replace(cfg, pipeline_qk=True), tma=True)
    assert launches[0].constexprs["PIPELINE"] and not launches[0].constexprs["WARP_SPECIALIZE"]
    one_loop = kernels.attention_fwd(*args, arch=cpu, config=dataclasses.replace(cfg, warp_specialize=True), tma=True)
    assert torch.equal(piped[0], one_loop[0]) and torch.equal(piped[1], one_loop[1])


@pytest.mark.parametrize(("d_split", "transposed"), [(1, True), (2, False), (4, True)])
def test_backward_operand_layouts_under_the_interpreter(d_split, transposed):
    """The dK/dV and dQ accumulators split over programs by head-dim columns (sm_90/sm_100 at head_dim 256)
    and the sequence-contiguous Q^T/dO^T/K^T/V^T copies (AMD) give the gradients of the plain kernels."""
    cpu = runtime.get_arch("cpu")
    q, k, v = _qkv(1, 2, 1, 40, 64)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(5)).to(q.dtype)
    cfg = {kind: attention_config(kind, 64, torch.bfloat16, cpu) for kind in ("fwd", "bwd_dkdv", "bwd_dq")}
    o, lse2 = kernels.attention_fwd(q, k, v, True, 0.125, arch=cpu)
    plain = kernels.attention_bwd(dout, q, k, v, o, lse2, True, 0.125, arch=cpu)
    o_t, lse2_t = kernels.attention_fwd(q, k, v, True, 0.125, arch=cpu, tma=False,
                                        config=dataclasses.replace(cfg["fwd"], transposed=transposed))
    assert torch.equal(o_t, o) and torch.equal(lse2_t, lse2)
    split = kernels.attention_bwd(dout, q, k, v, o, lse2, True, 0.125, arch=cpu,
                                  dkdv_config=dataclasses.replace(cfg["bwd_dkdv"], d_split=d_split,
                                                                  transposed=transposed),
                                  dq_config=dataclasses.replace(cfg["bwd_dq"], d_split=d_split, transposed=transposed))
    for got, want in zip(split, plain, strict=True):
        assert torch.equal(got, want)  # same products in the same order: bit for bit


def test_tma_only_where_the_descriptor_rules_hold():
    q, k, v = _qkv(1, 2, 2, 64, 64)
    sm90, sm80, mi300 = (runtime.get_arch(a) for a in ("sm_90", "sm_80", "gfx942"))
    assert attention_common._use_tma(sm90, q, k, v) and attention_common._use_tma(runtime.get_arch("sm_100"), q, k, v)
    assert not attention_common._use_tma(sm80, q, k, v) and not attention_common._use_tma(mi300, q, k, v)
    odd = torch.randn(1, 2, 64, 68).to(torch.bfloat16)[..., :60]  # row stride 68 elements = 136 B
    assert not attention_common._use_tma(sm90, odd, k, v)
    with recording(execute=False) as launches:
        kernels.attention_fwd(q, k, v, True, 0.125, arch=sm90)
        kernels.attention_fwd(q, k, v, True, 0.125, arch=sm80)
    assert [la.name for la in launches] == ["_attn_fwd_tma_kernel", "_attn_fwd_kernel"]
    assert launches[0].constexprs["WARP_SPECIALIZE"] is True


def test_lse_is_the_log_sum_exp():
    q, k, v = _qkv(2, 2, 2, 45, 64, torch.float32)
    _, lse2 = kernels.attention_fwd(q, k, v, False, 0.125)
    want = torch.logsumexp((q.double() @ k.double().transpose(-1, -2)) * 0.125, -1) / torch.log(torch.tensor(2.0))
    torch.testing.assert_close(lse2.double(), want.double(), rtol=0, atol=1e-5)


@pytest.mark.parametrize("deterministic", [True, False])
def test_fp32_grads_are_the_gradients_before_their_rounding(deterministic):
    # Ring attention sums per-block partial gradients: fp32_grads hands them over unrounded. Rounded to
    # bf16 they must be bit-identical to the default bf16 gradients (same kernels, only the store differs).
    import wavefront.ops.attention  # noqa: F401

    q, k, v = _qkv(1, 4, 2, 40, 64)
    do = torch.randn(q.shape, generator=torch.Generator().manual_seed(1)).to(q.dtype)
    o, lse2 = torch.ops.wavefront.attention_fwd(q, k, v, None, -1, True, 0.125)
    g16 = torch.ops.wavefront.attention_bwd(do, q, k, v, o, lse2, None, -1, True, 0.125, deterministic)
    g32 = torch.ops.wavefront.attention_bwd(do, q, k, v, o, lse2, None, -1, True, 0.125, deterministic, True)
    for a, b in zip(g16, g32, strict=True):
        assert a.dtype == torch.bfloat16 and b.dtype == torch.float32
        assert torch.equal(b.to(torch.bfloat16), a)
        assert not torch.equal(b, a.float())  # really unrounded


def test_launches_record_config_and_program_order():
    q, k, v = _qkv(2, 4, 2, 70, 64)
    with recording(execute=False) as launches:
        kernels.attention_fwd(q, k, v, True, 0.125, arch=runtime.get_arch("gfx942"))
    (launch,) = launches
    cfg = attention_config("fwd", 64, torch.bfloat16, runtime.get_arch("gfx942"))
    assert launch.constexprs["NUM_XCDS"] == 8
    assert launch.constexprs["BLOCK_M"] == cfg.BLOCK_M
    assert launch.options["waves_per_eu"] == cfg.waves_per_eu
    assert launch.grid == ((70 + cfg.BLOCK_M - 1) // cfg.BLOCK_M * 2 * 4,)
    with recording(execute=False) as launches:
        kernels.attention_fwd(q, k, v, True, 0.125, arch=runtime.get_arch("sm_90"))
    assert launches[0].constexprs["NUM_XCDS"] == 1
    assert set(launches[0].options) == {"num_warps", "num_stages"}, "AMD-only options reached an NVIDIA launch"


@pytest.mark.parametrize("arch_name", ["sm_80", "sm_90", "sm_100", "gfx90a", "gfx942", "gfx1100", "cpu"])
@pytest.mark.parametrize("head_dim", [32, 64, 96, 128, 256])
def test_attention_configs(arch_name, head_dim):
    arch = runtime.get_arch(arch_name)
    for kind in ("fwd", "bwd_dkdv", "bwd_dq"):
        cands = attention_candidates(kind, head_dim, torch.bfloat16, arch)
        assert 1 <= len(cands) <= 4, "the candidate list stays short"
        wide = attention_candidates(kind, head_dim, torch.float32, arch)
        for cfg, cfg32 in zip(cands, wide, strict=True):
            assert cfg.reason
            assert min(cfg.BLOCK_M, cfg.BLOCK_N, cfg32.BLOCK_M, cfg32.BLOCK_N) >= 16, "tl.dot needs 16-wide tiles"
            if arch.family != "cpu":
                # fp32 tiles hold no more bytes than the verified 16-bit entry (unless already at 16 rows).
                assert cfg32.BLOCK_M * 4 <= cfg.BLOCK_M * 2 or cfg32.BLOCK_M == 16
                assert cfg32.BLOCK_N * 4 <= cfg.BLOCK_N * 2 or cfg32.BLOCK_N == 16
            opts = cfg.options(arch)
            assert opts["num_warps"] <= arch.max_num_warps
            assert ("waves_per_eu" in opts) == arch.family.startswith("amd")
            assert ("matrix_instr_nonkdim" in opts) == (arch.family == "amd-cdna")


def test_every_table_entry_has_a_reason():
    for kind, table in ATTENTION_TABLES.items():
        for key, by_dim in table.items():
            assert table.reason(key), (kind, key)
            for entries in (by_dim or {}).values():
                assert all(e.reason for e in entries), (kind, key)


def test_table_keys_cover_every_target():
    """Every compile target reads a row of every kernel's table (sm_90 and sm_100 their own), and the atomic
    kernel's row is its own only where the dQ share changed the tiles."""
    for kind, table in ATTENTION_TABLES.items():
        assert {table_key(runtime.get_arch(a)) for a in runtime.ARCHS} <= set(table), kind
    assert set(ATTENTION_TABLES["bwd_atomic"].differs()) == {"sm_90", "sm_100", "amd-cdna"}
    assert ATTENTION_TABLES["bwd_dkdv"]["sm_90"] is ATTENTION_TABLES["bwd_dkdv"]["sm_100"]


def test_head_dim_too_large_is_refused():
    with pytest.raises(ValueError, match="head_dim"):
        attention_candidates("fwd", 512, torch.bfloat16, runtime.get_arch("sm_90"))


def test_module_forms():
    q, k, v = _qkv(1, 4, 2, 20, 64)
    mod = wnn.ScaledDotProductAttention(causal=True)
    assert torch.equal(mod(q, k, v), ops.attention(q, k, v, causal=True))
    assert not list(mod.parameters())

    class FakeHFAttention(torch.nn.Module):
        is_causal = True

    out, weights = wnn.hf_attention_forward(FakeHFAttention(), q, k, v, None, scaling=0.2)
    assert weights is None
    assert out.shape == (1, 20, 4, 64) and out.is_contiguous()
    assert torch.equal(out, ops.attention(q, k, v, causal=True, scale=0.2).transpose(1, 2))
    with pytest.raises(NotImplementedError, match="attention_mask"):
        wnn.hf_attention_forward(FakeHFAttention(), q, k, v, torch.zeros(1, 1, 20, 20))
    with pytest.raises(NotImplementedError, match="dropout"):
        wnn.hf_attention_forward(FakeHFAttention(), q, k, v, None, dropout=0.1)


def test_torch_compile_fullgraph():
    q, k, v = _qkv(1, 4, 2, 33, 64)
    cu = torch.tensor([0, 13, 33], dtype=torch.int32)

    def f(q, k, v):
        return ops.attention(q, k, v, causal=True, cu_seqlens=cu, max_seqlen=20).float().square().sum()

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    args = [t.clone().requires_grad_() for t in (q, k, v)]
    args_c = [t.clone().requires_grad_() for t in (q, k, v)]
    f(*args).backward()
    compiled(*args_c).backward()
    for a, b in zip(args, args_c, strict=True):
        assert torch.equal(a.grad, b.grad)


# ---------------------------------------------------------------------------------------------------
# Bad input: every message names the argument and what was expected.

def _bad(**overrides):
    q, k, v = _qkv(1, 4, 2, 16, 64)
    args = {"q": q, "k": k, "v": v}
    kwargs = {}
    for name, value in overrides.items():
        (args if name in args else kwargs)[name] = value
    return args, kwargs


@pytest.mark.parametrize(("overrides", "exc", "match"), [
    ({"k": torch.zeros(1, 2, 16, 32, dtype=torch.bfloat16), "v": torch.zeros(1, 2, 16, 32, dtype=torch.bfloat16)},
     ValueError, "head_dim of 'k'/'v' \\(32\\) must equal head_dim of 'q' \\(64\\)"),
    ({"k": torch.zeros(1, 3, 16, 64, dtype=torch.bfloat16), "v": torch.zeros(1, 3, 16, 64, dtype=torch.bfloat16)},
     ValueError, "multiple of the number of k/v heads"),
    ({"q": torch.zeros(4, 16, 64, dtype=torch.bfloat16)}, ValueError, "'q' must have 4 dims"),
    ({"v": torch.zeros(1, 2, 16, 48, dtype=torch.bfloat16)}, ValueError, "'k' and 'v' must have the same shape"),
    ({"k": torch.zeros(1, 2, 8, 64, dtype=torch.bfloat16), "v": torch.zeros(1, 2, 8, 64, dtype=torch.bfloat16)},
     ValueError, "same sequence length"),
    ({"k": torch.zeros(2, 2, 16, 64, dtype=torch.bfloat16), "v": torch.zeros(2, 2, 16, 64, dtype=torch.bfloat16)},
     ValueError, "batch"),
    ({"v": torch.zeros(1, 2, 16, 64, dtype=torch.float16)}, TypeError, "'v' must have the dtype of 'q'"),
    ({"q": torch.zeros(1, 4, 16, 64, dtype=torch.int32)}, TypeError, "'q' must have dtype in"),
    ({"v": torch.zeros(1, 2, 16, 64, dtype=torch.bfloat16, device="meta")}, ValueError, "one device"),
    ({"q": torch.zeros(1, 4, 16, 512), "k": torch.zeros(1, 4, 16, 512), "v": torch.zeros(1, 4, 16, 512)},
     ValueError, "head_dim must be in"),
    ({"scale": -1.0}, ValueError, "'scale' must be a positive"),
    ({"causal": 1}, TypeError, "'causal' must be a bool"),
    ({"max_seqlen": 8}, ValueError, "'max_seqlen' is only meaningful"),
    ({"cu_seqlens": torch.tensor([0.0, 16.0])}, TypeError, "'cu_seqlens' must have dtype in"),
    ({"cu_seqlens": torch.tensor([16], dtype=torch.int32)}, ValueError, "at least two offsets"),
    ({"cu_seqlens": torch.tensor([0, 16], dtype=torch.int32), "max_seqlen": -2}, ValueError, "'max_seqlen' must be"),
])
def test_bad_input(overrides, exc, match):
    args, kwargs = _bad(**overrides)
    with pytest.raises(exc, match=match):
        ops.attention(args["q"], args["k"], args["v"], **kwargs)


@pytest.mark.parametrize(("cu", "max_seqlen", "match"), [
    ([0, 10, 15], None, "end at the packed length 16"),
    ([1, 10, 16], None, "must start at 0"),
    ([0, 10, 4, 16], None, "never decrease"),
    ([0, 10, 16], 7, "'max_seqlen' \\(7\\) is smaller than the longest sequence"),
])
def test_cu_seqlens_inconsistent_with_the_tensor(cu, max_seqlen, match):
    q, k, v = _qkv(1, 4, 2, 16, 64)
    with pytest.raises(ValueError, match=match):
        ops.attention(q, k, v, cu_seqlens=torch.tensor(cu, dtype=torch.int32), max_seqlen=max_seqlen)


def test_packed_needs_batch_one():
    q, k, v = _qkv(2, 4, 2, 16, 64)
    with pytest.raises(ValueError, match=r"\[1, heads, total, head_dim\]"):
        ops.attention(q, k, v, cu_seqlens=torch.tensor([0, 16], dtype=torch.int32))


@pytest.mark.slow
def test_torch_compile_inductor():
    """The default backend (inductor) around the custom ops, forward and backward."""
    q, k, v = _qkv(1, 4, 2, 33, 64)

    def f(q, k, v):
        return ops.attention(q, k, v, causal=True).float().square().sum()

    args = [t.clone().requires_grad_() for t in (q, k, v)]
    args_c = [t.clone().requires_grad_() for t in (q, k, v)]
    f(*args).backward()
    torch.compile(f, fullgraph=True)(*args_c).backward()
    for a, b in zip(args, args_c, strict=True):
        assert torch.equal(a.grad, b.grad)


def test_varlen_with_max_seqlen_checks_cu_seqlens_on_the_device_without_a_host_sync():
    """On a GPU, varlen attention given max_seqlen reads nothing on the host (the device form runs here on the
    CPU, forced); a malformed cu_seqlens or a sequence longer than max_seqlen still fails, through the
    device assert."""
    from _host_sync import host_syncs

    from wavefront.ops.attention import _resolve_max_seqlen

    good = torch.tensor([0, 3, 7, 12], dtype=torch.int32)
    with host_syncs() as calls:
        assert _resolve_max_seqlen(good, 5, 12, on_device=True) == 5
    assert calls == [], calls
    for bad, longest in (([0, 3, 2, 12], 9), ([1, 3, 7, 12], 5), ([0, 3, 7, 11], 5), ([0, 3, 7, 12], 4)):
        with pytest.raises(RuntimeError, match="cu_seqlens"):
            _resolve_max_seqlen(torch.tensor(bad), longest, 12, on_device=True)
    # Without max_seqlen the host path runs (one read) and names the problem.
    with host_syncs() as calls, pytest.raises(ValueError, match="must start at 0"):
        _resolve_max_seqlen(torch.tensor([0, 3, 2, 12]), -1, 12)
    assert calls and all("tolist" in c for c in calls)
