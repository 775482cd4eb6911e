"""The opt-in FP8 GEMM on the persistent TMA kernel (``WAVEFRONT_FP8_TMA=1``) as an inspect variant: planned at
linear_fp8's bench shapes on sm_90 and sm_100 only, its rows beside the default ones (which it leaves as they
are), and compiled for both with TMA in the loop and warp specialization, so the static gate keeps it."""

from __future__ import annotations

import os

import pytest
import torch

from wavefront.kernels import linear_fp8 as fp8_kernels
from wavefront.ops import REGISTRY
from wavefront.workbench.hardware import gpu_for_target
from wavefront.workbench.static import variants
from wavefront.workbench.static.inspect import compile_jobs, plan

SPEC = REGISTRY["linear_fp8"]
TMA = fp8_kernels.TMA_KERNELS


def test_fp8_tma_variant_is_planned_beside_the_default_rows(monkeypatch):
    monkeypatch.delenv(fp8_kernels.TMA_ENV_FLAG, raising=False)
    (variant,) = [v for v in variants.VARIANTS if v.name == "fp8_tma"]
    assert variant.targets == ("sm_90", "sm_100") and variant.interpreted
    planned = plan([SPEC], ["sm_90", "sm_100"], torch.bfloat16)
    tma = [p for p in planned if p.kernel in TMA]
    assert sorted((p.target, p.case.name) for p in tma) == sorted(
        (t, c.name) for t in ("sm_90", "sm_100") for c in SPEC.bench_cases)  # one forward product per case
    assert {p.mode for p in tma} == {"fwd"}
    for p in tma:  # persistent: one program per SM (thousands of tiles at these shapes)
        assert p.launch.grid == (gpu_for_target(p.target).sm_count,)
    kernel = {(p.target, p.case.name): p.kernel for p in tma}  # one TMA kernel per scale form
    assert kernel[("sm_100", "llama3-8b_down_mxfp8")] == "_mx_gemm_tma_kernel"  # tl.dot_scaled on sm_100
    assert kernel[("sm_90", "llama3-8b_down_mxfp8")] == "_fp8_block_gemm_tma_kernel"
    assert kernel[("sm_90", "llama3-8b_up_rowwise")] == kernel[("sm_90", "llama3-8b_qkv_tensorwise")] == (
        "_fp8_gemm_tma_kernel")
    assert os.environ.get(fp8_kernels.TMA_ENV_FLAG) is None  # the flag does not leak out of the variant
    # The variant adds only its kernel's rows: without it, sm_90's plan is the same rows in the same order.
    monkeypatch.setattr(variants, "VARIANTS", ())
    default = plan([SPEC], ["sm_90"], torch.bfloat16)
    assert [(p.case.name, p.mode, p.kernel) for p in default] == [
        (p.case.name, p.mode, p.kernel) for p in planned if p.target == "sm_90" and p.kernel not in TMA]


@pytest.mark.parametrize(("target", "case", "mma"), [
    ("sm_90", "llama3-8b_down_blockwise", "wgmma"),
    pytest.param("sm_100", "llama3-8b_down_mxfp8", "tcgen05", marks=pytest.mark.slow),
])
def test_fp8_tma_variant_compiles_with_tma_and_warp_specialization(target, case, mma):
    planned = plan([SPEC], [target], torch.bfloat16,
                   cases=lambda spec: [c for c in spec.bench_cases if c.name == case])
    (p,) = [p for p in planned if p.kernel in TMA]
    res = compile_jobs([p.job])[p.key]
    assert res.ok, res.error
    code = res.code
    assert code.spill_bytes == 0 and code.spill_count == 0
    assert code.tma_ops > 0 and code.setmaxnreg > 0  # TMA loads in the producer, setmaxnreg between roles
    assert code.matrix_families == [mma]
