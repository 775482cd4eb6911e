"""Bench providers beyond wavefront and eager: the vendor-BLAS row (ops called with provider="vendor") and
the attention peers (SDPA's flash / cuDNN backends, flash-attn)."""

from __future__ import annotations

import torch

from wavefront import reference
from wavefront.kernels._launch import recording
from wavefront.ops import REGISTRY
from wavefront.workbench.bench.providers import BASELINES, PROVIDERS, ProviderSet, Unavailable, _sdpa

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
