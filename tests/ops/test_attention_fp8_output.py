"""The FP8 output of wavefront.ops.attention (``quantize=``): O quantized in the forward's epilogue must be bit
for bit what ``ops.quantize`` makes of O's [batch, seq, heads * head_dim] view (the o_proj input), on every
forward path of the kernel; the option leaves O and the gradients unchanged; what the epilogue cannot compute
(a scale group across heads) is refused by name."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from wavefront import ops, reference, runtime
from wavefront.kernels import attention as kernels
from wavefront.kernels import attention_fwd
from wavefront.kernels._launch import recording
from wavefront.kernels.attention_config import attention_config
from wavefront.ops import REGISTRY


def _qkv(B, H, H_kv, S, D, dtype=torch.bfloat16, seed=0, spread=0.0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, S, D, generator=gen).to(dtype)
    k = torch.randn(B, H_kv, S, D, generator=gen).to(dtype)
    v = torch.randn(B, H_kv, S, D, generator=gen)
    if spread:
        # Head-dim columns over 2 * spread decades: the groups of one row get different scales and the small
        # ones reach the FP8 subnormals.
        v = v * torch.logspace(-spread, spread, D)
    return q, k, v.to(dtype)


def _unfused(out, scaling, fp8_dtype, pow2_scale):
    B, H, S, D = out.shape
    return ops.quantize(out.transpose(1, 2).reshape(B, S, H * D), dtype=fp8_dtype, scaling=scaling,
                        pow2_scale=pow2_scale)


def _assert_bits(got, want):
    assert got.dtype == want.dtype and got.shape == want.shape
    if got.dtype.itemsize == 1:
        got, want = got.view(torch.uint8), want.view(torch.uint8)
    assert torch.equal(got, want), f"{int((got != want).sum())} of {got.numel()} elements differ"


# (B, H, H_kv, S, D, causal, dtype, fp8 format, scaling, pow2): each row a regime, together every input dtype,
# every format, both scalings, GQA, causal, ragged tails, a padded head dim.
CASES = [
    pytest.param(2, 4, 2, 40, 64, True, torch.bfloat16, "e4m3", "block1x32", True, id="bf16-e4m3-mx-gqa-causal"),
    pytest.param(1, 2, 2, 21, 96, False, torch.float16, "e5m2", "block1x32", False, id="fp16-e5m2-1x32-d96-padded"),
    pytest.param(1, 2, 1, 33, 128, True, torch.float32, "e4m3fnuz", "block1x128", False,
                 id="fp32-e4m3fnuz-1x128-gqa-causal"),
    pytest.param(1, 2, 2, 24, 128, False, torch.bfloat16, "e5m2fnuz", "block1x128", True, id="bf16-e5m2fnuz-1x128"),
]


@pytest.mark.parametrize(("B", "H", "H_kv", "S", "D", "causal", "dtype", "fp8_dtype", "scaling", "pow2"), CASES)
def test_fp8_output_is_ops_quantize_of_the_output(B, H, H_kv, S, D, causal, dtype, fp8_dtype, scaling, pow2):
    q, k, v = _qkv(B, H, H_kv, S, D, dtype, spread=2.0)
    out, out_fp8, out_scale = ops.attention(q, k, v, causal=causal, quantize=scaling, fp8_dtype=fp8_dtype,
                                            pow2_scale=pow2)
    _assert_bits(out, ops.attention(q, k, v, causal=causal))
    want_fp8, want_scale = _unfused(out, scaling, fp8_dtype, pow2)
    _assert_bits(out_fp8, want_fp8)
    _assert_bits(out_scale, want_scale)
    assert out_fp8.shape == (B, S, H * D) and out_scale.shape == (B, S, H * D // int(scaling.removeprefix("block1x")))
    if pow2:
        assert torch.equal(out_scale, torch.exp2(torch.log2(out_scale).floor()))


def test_packed_sequences_and_transposed_views():
    """Packed (varlen) rows land at their token's row; q/k/v as views of [batch, seq, heads, dim] (so O is
    stored that way too) change nothing in the FP8 layout."""
    lengths = [17, 0, 1, 22]
    q, k, v = _qkv(1, 4, 2, sum(lengths), 128)
    cu = torch.tensor([0, 17, 17, 18, 40], dtype=torch.int32)
    out, out_fp8, out_scale = ops.attention(q, k, v, causal=True, cu_seqlens=cu, max_seqlen=22,
                                            quantize="block1x128", fp8_dtype="e4m3")
    want_fp8, want_scale = _unfused(out, "block1x128", "e4m3", False)
    _assert_bits(out_fp8, want_fp8)
    _assert_bits(out_scale, want_scale)

    qt, kt, vt = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in _qkv(2, 2, 2, 19, 64, seed=3))
    out, out_fp8, out_scale = ops.attention(qt, kt, vt, quantize="block1x32", pow2_scale=True)
    assert out.transpose(1, 2).is_contiguous()
    want_fp8, want_scale = _unfused(out, "block1x32", "e4m3", True)
    _assert_bits(out_fp8, want_fp8)
    _assert_bits(out_scale, want_scale)


@pytest.mark.parametrize(("tma", "warp_specialize", "pipeline"),
                         [(True, True, False), (True, False, True)], ids=["tma-warp-specialized", "tma-pipelined"])
def test_every_forward_path_quantizes_the_same(tma, warp_specialize, pipeline):
    """The sm_90/sm_100 forms (tensor descriptors, one masked key loop; the hand-pipelined loop), with packed
    causal sequences whose programs run past their sequence's end: the pointer path's FP8 output bit for bit."""
    cpu = runtime.get_arch("cpu")
    cfg = dataclasses.replace(attention_config("fwd", 64, torch.bfloat16, cpu), BLOCK_M=16, BLOCK_N=16,
                              warp_specialize=warp_specialize, pipeline_qk=pipeline)
    q, k, v = _qkv(1, 2, 1, 45, 64, seed=5)
    cu = torch.tensor([0, 30, 45], dtype=torch.int32)
    fp8 = dict(fp8_dtype=torch.float8_e4m3fn, fp8_group=32, fp8_pow2=False)
    args = (q, k, v, True, 64 ** -0.5, cu, 30)
    with recording() as launches:
        o, _, o8, s8 = kernels.attention_fwd(*args, arch=cpu, config=cfg, tma=tma, **fp8)
    assert launches[0].name == ("_attn_fwd_tma_kernel" if tma else "_attn_fwd_kernel")
    assert launches[0].constexprs["WARP_SPECIALIZE"] == warp_specialize
    assert launches[0].constexprs["PIPELINE"] == pipeline
    pointers = dataclasses.replace(cfg, warp_specialize=False, pipeline_qk=False)
    o_ptr, _, o8_ptr, s8_ptr = kernels.attention_fwd(*args, arch=cpu, config=pointers, tma=False, **fp8)
    _assert_bits(o, o_ptr)
    _assert_bits(o8, o8_ptr)
    _assert_bits(s8, s8_ptr)
    want_fp8, want_scale = _unfused(o, "block1x32", "e4m3", False)
    _assert_bits(o8, want_fp8)
    _assert_bits(s8, want_scale)


def test_option_off_launches_the_original_specialization():
    """quantize=None passes no FP8 pointers and FP8_GROUP 0: the kernel compiles without the epilogue (the
    machine code of the option-off path is unchanged; docs/fp8.md has the inspect comparison)."""
    q, k, v = _qkv(1, 2, 2, 16, 64)
    with recording(execute=False) as launches:
        ops.attention(q, k, v)
        ops.attention(q, k, v, quantize="block1x32")
    off, on = launches
    assert off.constexprs["FP8_GROUP"] == 0 and not off.constexprs["FP8_POW2"]
    # FP8_MAX is not a flag: the epilogue reads it off q8_ptr's element type.
    assert on.constexprs["FP8_GROUP"] == 32 and "FP8_MAX" not in on.constexprs
    named = dict(zip(attention_fwd._attn_fwd_kernel.arg_names, off.args, strict=False))
    assert named["q8_ptr"] is None and named["s8_ptr"] is None


def test_gradients_ignore_the_fp8_output():
    q, k, v = _qkv(1, 4, 2, 24, 64, seed=1)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(2)).to(q.dtype)
    grads = []
    for kw in ({}, {"quantize": "block1x32", "pow2_scale": True}):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        res = ops.attention(*leaves, causal=True, **kw)
        out = res[0] if kw else res
        if kw:
            assert out.requires_grad and not res[1].requires_grad and not res[2].requires_grad
        out.backward(dout)
        grads.append([t.grad for t in leaves])
    for a, b in zip(*grads, strict=True):
        _assert_bits(a, b)


def test_reference_path_and_empty_input(monkeypatch):
    """Off the Triton path (a CPU run without the interpreter) and on empty input: the reference attention,
    then reference.fp8_quantize, in the same layout."""
    q, k, v = _qkv(1, 2, 1, 9, 64)
    got = ops.attention(q, k, v, causal=True, quantize="block1x32", fp8_dtype="e5m2")
    monkeypatch.setattr(runtime, "uses_triton", lambda device: False)
    ref = ops.attention(q, k, v, causal=True, quantize="block1x32", fp8_dtype="e5m2")
    want = reference.fp8_quantize(ref[0].transpose(1, 2).reshape(1, 9, 128), dtype="e5m2", scaling="block1x32")
    for a, b in zip(ref[1:], want, strict=True):
        _assert_bits(a, b)
    assert [t.shape for t in got] == [t.shape for t in ref]
    monkeypatch.undo()
    q0, k0, v0 = _qkv(2, 2, 2, 0, 128)
    out, out_fp8, out_scale = ops.attention(q0, k0, v0, quantize="block1x128")
    assert out_fp8.shape == (2, 0, 256) and out_scale.shape == (2, 0, 2) and out_fp8.dtype == torch.float8_e4m3fn


def test_torch_compile_fullgraph():
    q, k, v = _qkv(1, 2, 1, 20, 64, seed=4)

    def f(q, k, v):
        out, out_fp8, out_scale = ops.attention(q, k, v, causal=True, quantize="block1x32", pow2_scale=True)
        return out, out_fp8, out_scale

    eager = f(q, k, v)
    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")(q, k, v)
    for a, b in zip(eager, compiled, strict=True):
        _assert_bits(a, b)


@pytest.mark.parametrize(("kw", "exc", "match"), [
    ({"quantize": "rowwise"}, ValueError, "amax over every head of a token"),
    ({"quantize": "tensorwise"}, ValueError, "every head of a token and every token"),
    ({"quantize": "block128x128"}, ValueError, "'quantize' must be one of"),
    ({"quantize": "block1x128"}, ValueError, "head_dim divisible by 128.*got head_dim 64"),
    ({"quantize": "block1x32", "fp8_dtype": "fp8"}, ValueError, "'fp8_dtype' must be one of"),
    ({"quantize": "block1x32", "pow2_scale": 1}, TypeError, "'pow2_scale' must be a bool"),
])
def test_bad_fp8_options(kw, exc, match):
    q, k, v = _qkv(1, 2, 2, 8, 64)
    with pytest.raises(exc, match=match):
        ops.attention(q, k, v, **kw)


def test_fp64_with_quantize_is_refused():
    q, k, v = _qkv(1, 2, 2, 8, 64, torch.float64)
    with pytest.raises(TypeError, match="quantize needs q/k/v of dtype float32, bfloat16 or float16"):
        ops.attention(q, k, v, quantize="block1x32")


def test_fp8_cases_are_inspected_only_where_fp8_compiles():
    """The registry's FP8-output bench cases compile for sm_90/sm_100/AMD, and are skipped (not failed) on
    sm_80, which has no FP8; the plain cases still run there."""
    from wavefront.workbench.static.inspect import plan

    spec = REGISTRY["attention"]
    fused = [c for c in spec.bench_cases if c.options.get("quantize")]
    assert {c.options["quantize"] for c in fused} == {"block1x128", "block1x32"}
    plain = next(c for c in spec.bench_cases if not c.options.get("quantize"))
    planned = plan([spec], ["sm_80", "gfx942"], torch.bfloat16, cases=lambda s: [fused[0], plain])
    fwd = {(p.case.name, p.target) for p in planned if p.mode == "fwd"}
    assert fwd == {(fused[0].name, "gfx942"), (plain.name, "gfx942"), (plain.name, "sm_80")}


# ---------------------------------------------------------------------------------------------------
# Traffic (instrumented interpreter, bytes each kernel loads and stores): the fused epilogue adds only the
# FP8 copy's writes; the unfused path (attention, then ops.quantize of O) also reads O back.


def _traffic(spec_name, case):
    from wavefront.workbench.static.traffic import measure_case

    count, _ = measure_case(REGISTRY[spec_name], case, torch.bfloat16, ("fwd",), eager=False)["fwd"]
    return count.kernel_bytes + count.host_bytes, count.unique_bytes


def traffic_table(batch, heads, kv_heads, seq, head_dim, options):
    """{(what, scaling): (requested bytes, unique bytes)} for the fused forward, the plain forward, and
    ops.quantize on O's [batch * seq, heads * head_dim] view (the unfused second pass)."""
    from wavefront.ops.attention import _case as attention_case
    from wavefront.ops.quantize import _case as quantize_case

    out = {}
    for scaling, pow2 in options:
        fused = attention_case("fused", "traffic", batch, heads, kv_heads, seq, head_dim, causal=True,
                               quantize=scaling, pow2_scale=pow2)
        out["fused", scaling] = _traffic("attention", fused)
        out["quantize", scaling] = _traffic("quantize", quantize_case(
            "o_proj_input", "traffic", batch * seq, heads * head_dim, scaling=scaling, pow2_scale=pow2))
    out["plain", None] = _traffic("attention", attention_case("plain", "traffic", batch, heads, kv_heads, seq,
                                                              head_dim, causal=True))
    return out


def test_fused_traffic_is_the_plain_forward_plus_the_fp8_writes():
    """Exactly: the fused forward moves the plain forward's bytes plus one byte per element of O and four per
    scale group (no padded column, no row past a sequence written), and the unfused path moves O's read on top
    (2 bytes per element in bf16: the saving)."""
    B, H, H_kv, S, D = 1, 2, 1, 24, 64
    table = traffic_table(B, H, H_kv, S, D, [("block1x32", True)])
    elems = B * H * S * D
    fp8_writes = elems + 4 * elems // 32
    fused, plain, quant = table["fused", "block1x32"], table["plain", None], table["quantize", "block1x32"]
    assert fused[0] == plain[0] + fp8_writes
    assert fused[1] == plain[1] + fp8_writes
    assert quant[0] == 2 * elems + fp8_writes  # ops.quantize: read O once, write the same FP8 copy
    assert plain[0] + quant[0] - fused[0] == 2 * elems


if __name__ == "__main__":
    # The docs/fp8.md table: Llama-3-8B's attention (32 q heads, 8 k/v heads, head_dim 128), causal, 256 tokens.
    # TRITON_INTERPRET=1 python tests/ops/test_attention_fp8_output.py
    shape = dict(batch=1, heads=32, kv_heads=8, seq=256, head_dim=128)
    table = traffic_table(**shape, options=[("block1x128", False), ("block1x32", True)])
    plain = table["plain", None]
    print(f"shape {shape}, bf16; bytes requested (cache-less) / unique (footprint)")
    print(f"attention (no FP8 output): {plain[0]:,} / {plain[1]:,}")
    for scaling in ("block1x128", "block1x32"):
        fused, quant = table["fused", scaling], table["quantize", scaling]
        sep = (plain[0] + quant[0], plain[1] + quant[1])
        print(f"{scaling}: fused {fused[0]:,} / {fused[1]:,}; attention + ops.quantize {sep[0]:,} / {sep[1]:,} "
              f"(quantize {quant[0]:,}); saved {sep[0] - fused[0]:,} B = {(sep[0] - fused[0]) / sep[0]:.1%} / "
              f"{(sep[1] - fused[1]) / sep[1]:.1%}")
