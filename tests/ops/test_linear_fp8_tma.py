"""The FP8 GEMM on the persistent, warp-specialized TMA kernels (one per scale form: ``_fp8_gemm_tma_kernel``,
``_fp8_block_gemm_tma_kernel``, ``_mx_gemm_tma_kernel``; opt-in with ``WAVEFRONT_FP8_TMA=1``) under the
interpreter, which runs tensor descriptors (zero-filled past the edge) and the persistent grid (2 programs here,
so each walks several tiles), with memcheck on:

- every recipe (tensorwise, rowwise, 1x128 / 128x128 blocks, the dW product's per-column blocks, MXFP8 on
  the per-block path and on sm_100's tl.dot_scaled) against the float64 product of the dequantized
  operands, with partial tiles in M, N and K, bias and residual; and bit-identical to the cp.async kernels
  on the same quantized operands (same K blocks, same order);
- the op forward and backward with the flag set, every recipe, sm_90 and sm_100 assumed (their own tiles);
- the dispatch rule: the flag, the target (no TMA on AMD), descriptor alignment (K % 16), ``tma=True``.

The machine code (TMA in the producer's loop, setmaxnreg) is asserted by test_fp8_machine_code.py.
"""

from __future__ import annotations

import pytest
import torch

from wavefront import ops, runtime
from wavefront.kernels import linear_fp8 as kernels
from wavefront.kernels import quantize as kq
from wavefront.kernels._launch import recording
from wavefront.ops._spec import Case
from wavefront.runtime import get_arch
from wavefront.workbench.bench.correctness import check_case

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
CPU = get_arch("cpu")

# (scaling of A, of B, group_k, rows of B per scale, power-of-two scales, B's format)
RECIPES = {
    "tensorwise": ("tensorwise", "tensorwise", 0, 1, False, E5M2),
    "rowwise": ("rowwise", "rowwise", 0, 1, True, E4M3),
    "blockwise": ("block1x128", "block128x128", 128, 128, False, E4M3),
    "blockwise_dw": ("block1x128", "block1x128", 128, 1, False, E4M3),
    "mxfp8": ("block1x32", "block1x32", 32, 1, True, E4M3),
}


#: The TMA kernel of each recipe's scale form where the matrix unit has no MX scaling (sm_90, the interpreter).
TMA_KERNEL = {"tensorwise": "_fp8_gemm_tma_kernel", "rowwise": "_fp8_gemm_tma_kernel",
              "blockwise": "_fp8_block_gemm_tma_kernel", "blockwise_dw": "_fp8_block_gemm_tma_kernel",
              "mxfp8": "_fp8_block_gemm_tma_kernel"}


def _operands(M, N, K, recipe, seed=0, device="cpu"):
    sa_kind, sb_kind, group_k, b_rows, pow2, fb = RECIPES[recipe]
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(M, K, generator=gen).bfloat16().to(device)
    b = (torch.randn(N, K, generator=gen) * K ** -0.5).bfloat16().to(device)
    qa, sa = kq.quantize(a, E4M3, sa_kind, pow2)
    qb, sb = kq.quantize(b, fb, sb_kind, pow2)
    if sa_kind == "rowwise":
        sa, sb = sa.view(M, 1), sb.view(N, 1)
    return qa, sa, qb, sb, group_k, b_rows


def _dequant(q, s, group_k, rows):
    """float64 q / s with s broadcast over its (rows x group_k) block (group_k 0: per row or one scale)."""
    x = q.double()
    if group_k == 0:
        return x / (s.double() if s.dim() == 0 else s.double().view(-1, 1))
    full = s.double().repeat_interleave(rows, 0)[: x.shape[0]].repeat_interleave(group_k, 1)[:, : x.shape[1]]
    return x / full


@pytest.mark.parametrize("recipe", list(RECIPES))
@pytest.mark.parametrize(("M", "N", "K", "extras"), [
    (40, 50, 96, False),  # ragged M and N over 32x32 tiles, K under one BLOCK_K (zero-filled by the descriptor)
    (70, 36, 272, True),  # three K blocks, the last partial; bias and residual in the epilogue
])
def test_tma_kernel_matches_float64_and_the_cp_async_kernel(device, recipe, M, N, K, extras):
    """On a GPU (sm_90+) the same test runs the kernel compiled for it, at its own tiles: the first check that
    switching the flag on would need."""
    if device == "cuda" and torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("no TMA before sm_90")
    arch = CPU if device == "cpu" else runtime.arch(torch.device(device))
    qa, sa, qb, sb, group_k, b_rows = _operands(M, N, K, recipe, device=device)
    gen = torch.Generator().manual_seed(1)
    bias = torch.randn(N, generator=gen).to(device) if extras else None
    residual = torch.randn(M, N, generator=gen).to(device) if extras else None
    with recording() as launches:
        ours = kernels.fp8_gemm(qa, qb, sa, sb, bias, torch.float32, group_k, b_rows, arch=arch, residual=residual,
                                tma=True)
    native = kernels.mx_native(arch, group_k, b_rows, qa.dtype, qb.dtype)
    assert [la.name for la in launches] == ["_mx_gemm_tma_kernel" if native else TMA_KERNEL[recipe]]
    cfg = launches[0].constexprs
    tiles = -(-M // cfg["BLOCK_M"]) * -(-N // cfg["BLOCK_N"])
    assert launches[0].grid == (min(tiles, runtime.sm_count(qa.device)),)
    if device == "cpu":
        assert tiles > launches[0].grid[0]  # the persistent loop walks several tiles per program
    want = _dequant(qa, sa, group_k, 1) @ _dequant(qb, sb, group_k, b_rows).T
    want = want + (0 if bias is None else bias.double()) + (0 if residual is None else residual.double())
    # fp32 accumulation of K products of fp8 values: a few fp32 ulps of the largest partial sum
    tol = 8 * K * torch.finfo(torch.float32).eps * float(want.abs().max())
    assert (ours.double() - want).abs().max() <= tol
    pointer = kernels.fp8_gemm(qa, qb, sa, sb, bias, torch.float32, group_k, b_rows, arch=arch, residual=residual,
                               tma=False)
    if device == "cpu":
        assert torch.equal(ours, pointer)  # same K blocks, same order (the MMAs of a GPU may sum differently)
    else:
        assert (ours - pointer).abs().max() <= tol


def test_native_mx_on_the_tma_kernel_matches_the_per_block_form():
    """sm_100 assumed: the TMA kernel's tl.dot_scaled step (BLOCK_K = 128, four E8M0 groups per step) against
    sm_90's per-block TMA kernel (BLOCK_K = 32); ragged M, N and a partial last group."""
    qa, sa, qb, sb, group_k, b_rows = _operands(37, 50, 80, "mxfp8")
    with recording() as launches:
        native = kernels.fp8_gemm(qa, qb, sa, sb, None, torch.float32, 32, 1, arch=get_arch("sm_100"), tma=True)
        per_block = kernels.fp8_gemm(qa, qb, sa, sb, None, torch.float32, 32, 1, arch=get_arch("sm_90"), tma=True)
    assert [la.name for la in launches] == ["_mx_gemm_tma_kernel", "_fp8_block_gemm_tma_kernel"]
    assert native.abs().max() > 0
    # The interpreter's dot_scaled dequantizes each group exactly; the sums differ only in order (fp32).
    assert (native - per_block).abs().max() <= 4 * torch.finfo(torch.float32).eps * per_block.abs().max()


@pytest.mark.parametrize("target", ["sm_90", "sm_100"])
@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise", "blockwise", "mxfp8"])
def test_op_forward_and_backward_with_the_flag(monkeypatch, target, recipe):
    """The registry's case for the recipe, forward and both gradients, with the target's own TMA tiles: every
    product (y, dx, dW) runs the TMA kernel, tensorwise and rowwise included (the flag makes the auto provider
    ours)."""
    monkeypatch.setenv(kernels.TMA_ENV_FLAG, "1")
    spec = ops.get_spec("linear_fp8")
    # M, N, K multiples of 16 so that every product's reduction rows are 16-byte aligned (the registry's cases
    # are ragged: their products fall back to the cp.async kernels, test_dispatch_rule); K over two blocks.
    case = Case(recipe, "every product on the TMA kernel", {"M": 48, "N": 80, "K": 160},
                {"recipe": recipe, "bias": True})
    with runtime.assume_target(target, 132), recording() as launches:
        result = check_case(spec, case, torch.bfloat16)
    assert result.passed, result.as_dict()
    gemms = [la.name for la in launches if "gemm" in la.name]
    want = "_mx_gemm_tma_kernel" if (recipe, target) == ("mxfp8", "sm_100") else TMA_KERNEL[recipe]
    assert gemms == [want] * 3, gemms  # y, dx, dW


@pytest.mark.parametrize(("target", "flag", "K", "want"), [
    ("sm_90", "0", 64, "_fp8_gemm_kernel"),  # off by default
    ("sm_90", "1", 64, "_fp8_block_gemm_tma_kernel"),
    ("sm_100", "1", 64, "_fp8_block_gemm_tma_kernel"),
    ("sm_90", "1", 72, "_fp8_gemm_kernel"),  # rows of 72 B: not 16-byte aligned, no descriptor
    ("gfx942", "1", 64, "_fp8_gemm_kernel"),  # no TMA on AMD
])
def test_dispatch_rule(monkeypatch, target, flag, K, want):
    monkeypatch.setenv(kernels.TMA_ENV_FLAG, flag)
    fmt = torch.float8_e4m3fnuz if target.startswith("gfx") else E4M3
    qa, qb = torch.zeros(64, K, dtype=fmt), torch.zeros(48, K, dtype=fmt)
    with recording(execute=False) as launches:
        kernels.fp8_gemm(qa, qb, torch.ones(64, -(-K // 128)), torch.ones(1, -(-K // 128)), None, torch.bfloat16,
                         128, 128, arch=get_arch(target))
    assert [la.name for la in launches] == [want]


def test_flag_makes_the_auto_provider_ours_on_tma_targets(monkeypatch):
    sm90 = get_arch("sm_90")
    assert kernels.fp8_gemm_provider("tensorwise", sm90, torch.bfloat16, 64, 64, 64).provider == "vendor"
    monkeypatch.setenv(kernels.TMA_ENV_FLAG, "1")
    assert kernels.fp8_gemm_provider("tensorwise", sm90, torch.bfloat16, 64, 64, 64).provider == "wavefront"
    assert kernels.fp8_gemm_provider("rowwise", get_arch("sm_100"), torch.bfloat16, 64, 64, 64).provider == "wavefront"
    # no TMA on sm_89 or gfx942: the rule without the flag
    assert kernels.fp8_gemm_provider("tensorwise", get_arch("gfx942"), torch.bfloat16, 64, 64, 64).provider == "vendor"


def test_tma_true_refuses_what_a_descriptor_cannot_take():
    qa, qb = torch.zeros(32, 72, dtype=E4M3), torch.zeros(32, 72, dtype=E4M3)
    with pytest.raises(ValueError, match="tma=True.*16-byte aligned"):
        kernels.fp8_gemm(qa, qb, torch.ones(()), torch.ones(()), None, torch.bfloat16, 0, 1, arch=CPU, tma=True)
    with pytest.raises(ValueError, match="tma=True.*gfx942"):
        kernels.fp8_gemm(torch.zeros(32, 64, dtype=E4M3), torch.zeros(32, 64, dtype=E4M3), torch.ones(()),
                         torch.ones(()), None, torch.bfloat16, 0, 1, arch=get_arch("gfx942"), tma=True)
