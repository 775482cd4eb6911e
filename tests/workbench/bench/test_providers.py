"""Bench providers beyond wavefront and eager: the vendor-BLAS row (ops called with provider="vendor") and
the attention peers (SDPA's flash / cuDNN backends, flash-attn)."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from wavefront import reference
from wavefront.kernels._launch import recording
from wavefront.ops import REGISTRY
from wavefront.workbench.bench.providers import BASELINES, PROVIDERS, QUACK, ProviderSet, Unavailable, _sdpa

SPEC = REGISTRY["linear"]


def test_bench_vendor_provider():
    """`wavefront bench` has a vendor-BLAS provider row for linear (the op with provider="vendor"), unavailable
    elsewhere; it is also a baseline of the report's speedup table."""
    assert "vendor" in PROVIDERS and "vendor" in BASELINES
    providers = ProviderSet(torch.device("cpu"))
    vendor = providers.resolve("vendor", SPEC)
    assert isinstance(providers.resolve("vendor", REGISTRY["rms_norm"]), Unavailable)
    gen = torch.Generator().manual_seed(0)
    x, w, b, r = (torch.randn(*shape, generator=gen) for shape in ((24, 32), (40, 32), (40,), (24, 40)))
    with recording() as launches:
        got = vendor(x, w, b, activation="silu", residual=r)
    assert launches == []
    torch.testing.assert_close(got, reference.linear(x, w, b, "silu", r), rtol=1e-5, atol=1e-5)


def test_attention_peer_adapters():
    """The SDPA peer adapter maps wavefront.ops.attention's arguments (GQA, causal, scale) onto
    F.scaled_dot_product_attention: checked with SDPA's math backend on CPU against our reference; the GPU
    peers say why they cannot run on a CPU, and only attention has them."""
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(2, 4, 33, 16, generator=gen)
    k, v = (torch.randn(2, 2, 33, 16, generator=gen) for _ in range(2))
    got = _sdpa("MATH")()(q, k, v, causal=True, scale=0.3)
    want = reference.attention(q.double(), k.double(), v.double(), True, 0.3, None, None)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    providers = ProviderSet(torch.device("cpu"))
    for peer in ("sdpa_flash", "sdpa_cudnn", "flash_attn"):
        assert "GPU" in providers.resolve(peer, REGISTRY["attention"]).reason
        assert isinstance(providers.resolve(peer, SPEC), Unavailable)


def _fake_quack(monkeypatch, calls):
    """A stand-in for quack-kernels with its public signatures, recording each call's shapes and options and
    computing the reference result (the adapters' reshaping is then checked by value too)."""
    pkg, rms_module = types.ModuleType("quack"), types.ModuleType("quack.rmsnorm")

    def softmax(x):
        calls.append(("softmax", tuple(x.shape)))
        return torch.softmax(x, -1)

    def rmsnorm(x, weight=None, bias=None, residual=None, out_dtype=None, residual_dtype=None, eps=1e-6,
                prenorm=False):
        calls.append(("rmsnorm", tuple(x.shape), eps))
        return reference.rms_norm(x, weight, eps, cast="gemma")

    def layernorm_fwd(x, weight, bias=None, eps=1e-6, return_rstd=False, return_mean=False):
        calls.append(("layernorm_fwd", tuple(x.shape), weight.dtype, eps))
        assert x.dim() == 2 and weight.dtype == torch.float32 and (bias is None or bias.dtype == torch.float32)
        return torch.nn.functional.layer_norm(x, x.shape[-1:], weight, bias, eps)

    def cross_entropy(x, target, lse_partial=None, weight=None, ignore_index=-100, reduction="mean",
                      inplace_backward=False):
        calls.append(("cross_entropy", tuple(x.shape), tuple(target.shape), ignore_index, reduction,
                      inplace_backward))
        return torch.nn.functional.cross_entropy(x, target, ignore_index=ignore_index, reduction=reduction)

    pkg.softmax, pkg.rmsnorm, pkg.cross_entropy = softmax, rmsnorm, cross_entropy
    rms_module.layernorm_fwd = layernorm_fwd
    monkeypatch.setitem(sys.modules, "quack", pkg)
    monkeypatch.setitem(sys.modules, "quack.rmsnorm", rms_module)


def test_quack_peer_is_unavailable_with_its_reason_without_quack(monkeypatch):
    """quack-kernels (CuTe DSL, NVIDIA sm_90/sm_100): on a CPU, on other ops, and on a GPU without the package,
    the provider says why it cannot run; it is a provider and a baseline of the report."""
    assert "quack" in PROVIDERS and "quack" in BASELINES
    assert "NVIDIA GPUs only" in ProviderSet(torch.device("cpu")).resolve("quack", REGISTRY["softmax"]).reason
    gpu = ProviderSet(torch.device("cuda"))  # a device object only: nothing runs on it
    assert "no quack-kernels counterpart" in gpu.resolve("quack", REGISTRY["attention"]).reason
    monkeypatch.setitem(sys.modules, "quack", None)  # import quack raises ImportError
    for op in QUACK:
        reason = ProviderSet(torch.device("cuda")).resolve("quack", REGISTRY[op]).reason
        assert "quack-kernels is not installed" in reason and "nvidia-cutlass-dsl" in reason, reason
    monkeypatch.setitem(sys.modules, "quack", types.ModuleType("quack"))  # a version without the function
    reason = ProviderSet(torch.device("cuda")).resolve("quack", REGISTRY["softmax"]).reason
    assert reason == "the installed quack-kernels has no quack.softmax"


def test_quack_peer_call_shapes_with_a_fake_module(monkeypatch):
    """Each adapter maps wavefront's call onto quack's: [M, N] rows (3-D inputs flattened and the result
    reshaped back), the eps passed through, fp32 LayerNorm weights, cross-entropy never in place; options
    quack lacks are refused by name rather than silently dropped."""
    calls: list = []
    _fake_quack(monkeypatch, calls)
    peers = ProviderSet(torch.device("cuda"))
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(2, 3, 16, generator=gen)
    w, b = torch.randn(16, generator=gen), torch.randn(16, generator=gen)

    got = peers.resolve("quack", REGISTRY["softmax"])(x)
    assert calls[-1] == ("softmax", (6, 16)) and got.shape == x.shape
    torch.testing.assert_close(got, reference.softmax(x))

    rms = peers.resolve("quack", REGISTRY["rms_norm"])
    torch.testing.assert_close(rms(x, w, 1e-5), reference.rms_norm(x, w, 1e-5, cast="gemma"))
    assert calls[-1] == ("rmsnorm", (2, 3, 16), 1e-5)
    for bad, match in (({"offset": 1.0}, "offset"), ({"cast": "input"}, "input-dtype"),
                       ({"quantize": "rowwise"}, "FP8")):
        with pytest.raises(NotImplementedError, match=match):
            rms(x, w, 1e-5, **bad)

    ln = peers.resolve("quack", REGISTRY["layer_norm"])
    got = ln(x.bfloat16(), w.bfloat16(), b.bfloat16(), 1e-5)
    assert calls[-1] == ("layernorm_fwd", (6, 16), torch.float32, 1e-5) and got.shape == x.shape
    with pytest.raises(NotImplementedError, match="weight"):
        ln(x, None, None)

    ce = peers.resolve("quack", REGISTRY["cross_entropy"])
    target = torch.randint(0, 16, (2, 3), generator=gen)
    got = ce(x, target, ignore_index=5, reduction="sum", inplace_backward=True)
    assert calls[-1] == ("cross_entropy", (6, 16), (6,), 5, "sum", False)
    torch.testing.assert_close(got, reference.cross_entropy(x.double(), target, ignore_index=5,
                                                            reduction="sum").float())
    n_calls = len(calls)
    for bad in ({"z_loss": 1e-4}, {"return_token_accuracy": True}, {"weight": torch.ones(16)}):
        with pytest.raises(NotImplementedError, match=next(iter(bad))):
            ce(x, target, **bad)
    assert len(calls) == n_calls  # refused before quack is called
