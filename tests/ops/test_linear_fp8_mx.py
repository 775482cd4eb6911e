"""sm_100's native MXFP8 GEMM (``_mx_gemm_kernel``, ``tl.dot_scaled``) under the interpreter, which runs
``dot_scaled`` (Triton 3.9 decodes the E8M0 bytes and multiplies in fp32):

- at the per-block kernel's tiles (BLOCK_K = 32, one group per step) it is bit-identical to the per-block
  kernel, over scales spanning 2^-40 to 2^40 and both OCP formats: the in-kernel fp32 -> E8M0 conversion and
  the scale layout are exact;
- at its own sm_100 tiles (BLOCK_K = 128: the MMA sums four groups before adding to the accumulator) the op
  passes the registry's accuracy rule forward and backward with sm_100 assumed;
- dispatch: the native kernel only on sm_100 and only for MXFP8 operands; sm_90 and gfx942 keep the
  per-block kernel.

The machine code (UTCQMMA with tensor-memory scale operands) is asserted by test_fp8_machine_code.py.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from wavefront import ops, runtime
from wavefront.kernels import linear_fp8 as kernels
from wavefront.kernels import quantize as kq
from wavefront.kernels._launch import recording
from wavefront.runtime import get_arch
from wavefront.workbench.bench.correctness import check_case

SM100 = get_arch("sm_100")


def _operands(M, N, K, fa, fb, seed=0):
    """MXFP8 operands whose 1x32 groups span magnitudes 2^-40 .. 2^40 (so do their scales)."""
    gen = torch.Generator().manual_seed(seed)
    groups = -(-K // 32)
    mag_a = torch.exp2(torch.randint(-40, 41, (M, groups), generator=gen).float()).repeat_interleave(32, 1)[:, :K]
    mag_b = torch.exp2(torch.randint(-40, 41, (N, groups), generator=gen).float()).repeat_interleave(32, 1)[:, :K]
    a = (torch.randn(M, K, generator=gen) * mag_a).bfloat16()
    b = (torch.randn(N, K, generator=gen) * mag_b).bfloat16()
    qa, sa = kq.quantize(a, fa, "block1x32", True)
    qb, sb = kq.quantize(b, fb, "block1x32", True)
    return qa, sa, qb, sb


E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


@pytest.mark.parametrize(("M", "N", "K", "fa", "fb", "extras"), [
    (24, 40, 96, E4M3, E4M3, False),
    (37, 50, 72, E5M2, E4M3, True),  # ragged M, N and a partial last group; e5m2 gradients x e4m3
    (70, 20, 160, E4M3, E5M2, True),
])
def test_native_mx_is_bit_identical_to_the_per_block_kernel(monkeypatch, M, N, K, fa, fb, extras):
    tiles = dataclasses.replace(kernels.MX_NATIVE_CONFIGS["sm_100"], BLOCK_M=64, BLOCK_N=64, BLOCK_K=32)
    monkeypatch.setitem(kernels.MX_NATIVE_CONFIGS, "sm_100", tiles)
    qa, sa, qb, sb = _operands(M, N, K, fa, fb)
    gen = torch.Generator().manual_seed(1)
    bias = torch.randn(N, generator=gen) if extras else None
    residual = torch.randn(M, N, generator=gen) if extras else None
    with recording() as launches:
        native = kernels.fp8_gemm(qa, qb, sa, sb, bias, torch.float32, 32, 1, arch=SM100, residual=residual)
        per_block = kernels.fp8_gemm(qa, qb, sa, sb, bias, torch.float32, 32, 1, arch=get_arch("sm_90"),
                                     residual=residual)
    assert [la.name for la in launches] == ["_mx_gemm_kernel", "_fp8_gemm_kernel"]
    assert native.abs().max() > 0 and torch.isfinite(native).all()
    assert torch.equal(native, per_block)


def test_op_forward_and_backward_bit_identical_to_the_per_block_path(monkeypatch):
    """The whole op (y, dx, dW, db, d residual) with sm_100 assumed, the native kernel at BLOCK_K = 32,
    against sm_90's per-block kernel: the three products' operands and scale layouts are wired right."""
    tiles = dataclasses.replace(kernels.MX_NATIVE_CONFIGS["sm_100"], BLOCK_M=64, BLOCK_N=64, BLOCK_K=32)
    monkeypatch.setitem(kernels.MX_NATIVE_CONFIGS, "sm_100", tiles)
    gen = torch.Generator().manual_seed(3)
    x0 = torch.randn(2, 20, 96, generator=gen).bfloat16()
    w0 = (torch.randn(48, 96, generator=gen) * 0.1).bfloat16()
    b0 = torch.randn(48, generator=gen).bfloat16()
    r0 = torch.randn(2, 20, 48, generator=gen).bfloat16()
    dy = torch.randn(2, 20, 48, generator=gen).bfloat16()
    outs = {}
    for target in ("sm_100", "sm_90"):
        x, w, b, r = (t.clone().requires_grad_() for t in (x0, w0, b0, r0))
        with runtime.assume_target(target, 100), recording() as launches:
            y = ops.linear_fp8(x, w, b, residual=r, recipe="mxfp8")
            y.backward(dy)
        gemms = [la.name for la in launches if "gemm" in la.name]
        assert gemms == ["_mx_gemm_kernel" if target == "sm_100" else "_fp8_gemm_kernel"] * 3
        outs[target] = (y, x.grad, w.grad, b.grad, r.grad)
    for native, per_block in zip(outs["sm_100"], outs["sm_90"], strict=True):
        assert torch.equal(native, per_block)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_native_mx_passes_the_accuracy_rule_on_sm100(dtype):
    """The registry's mxfp8 case, forward and both gradients, at sm_100's own tiles (BLOCK_K = 128)."""
    spec = ops.get_spec("linear_fp8")
    case = next(c for c in spec.cases if c.name == "mxfp8")
    with runtime.assume_target("sm_100", 148), recording() as launches:
        result = check_case(spec, case, dtype)
    assert result.passed, result.as_dict()
    gemms = [la.name for la in launches if "gemm" in la.name]
    assert gemms == ["_mx_gemm_kernel"] * 3, gemms  # y, dx, dW


@pytest.mark.parametrize(("target", "recipe", "native"), [
    ("sm_100", "mxfp8", True),
    ("sm_100", "blockwise", False),  # fp32 scales over 1x128 / 128x128: no MX format
    ("sm_90", "mxfp8", False),  # Hopper's wgmma takes no block scales
    ("gfx942", "mxfp8", False),  # FNUZ operands, no MX MFMA on MI300
])
def test_native_mx_is_chosen_only_for_mxfp8_on_sm100(target, recipe, native):
    x = torch.randn(16, 64).bfloat16()
    w = torch.randn(32, 64).bfloat16()
    with runtime.assume_target(target, 100), recording(execute=False) as launches:
        ops.linear_fp8(x, w, recipe=recipe)
    gemm = [la.name for la in launches if "gemm" in la.name]
    assert gemm == ["_mx_gemm_kernel" if native else "_fp8_gemm_kernel"]


def test_mx_native_rule():
    assert kernels.mx_native(SM100, 32, 1, E4M3, E5M2)
    assert not kernels.mx_native(SM100, 32, 1, torch.float8_e4m3fnuz, E4M3)  # FNUZ: not an MX element format
    assert not kernels.mx_native(SM100, 128, 1, E4M3, E4M3)
    assert not kernels.mx_native(SM100, 32, 128, E4M3, E4M3)
    assert not kernels.mx_native(get_arch("sm_90"), 32, 1, E4M3, E4M3)
    cfg = kernels.fp8_gemm_config(8192, 4096, 14336, 32, 1, SM100, native_mx=True)
    assert cfg.BLOCK_K % 128 == 0 and "tcgen05" in cfg.reason
