"""Every registered op x case x dtype, forward and backward, against the float64 reference.

The rule (wavefront.ops._spec.Tolerance): our max error <= 2 x eager PyTorch's error in the same dtype
plus one ulp at the reference's largest magnitude. Slow cases run with `pytest -m slow`.
"""

from __future__ import annotations

import pytest
import torch

from wavefront.ops import REGISTRY
from wavefront.ops._spec import dtype_name
from wavefront.workbench.bench.correctness import check_case


def _params():
    for spec in REGISTRY.values():
        for case in spec.cases:
            for dtype in spec.dtypes:
                marks = [pytest.mark.slow] if case.slow else []
                yield pytest.param(spec, case, dtype, id=f"{spec.name}-{case.name}-{dtype_name(dtype)}", marks=marks)


@pytest.mark.parametrize(("spec", "case", "dtype"), list(_params()))
def test_matches_reference(spec, case, dtype, device):
    result = check_case(spec, case, dtype, device)
    assert result.error is None, result.error
    assert result.checks, "nothing was compared"
    if spec.has_backward:
        assert any(c.mode == "bwd" for c in result.checks), "no gradient was compared"
    failed = [c for c in result.checks if not c.passed]
    assert not failed, "\n".join(
        f"{c.what} ({c.mode}): ours {c.err_ours:.3g} > bound {c.bound:.3g} (eager {c.err_eager:.3g})" for c in failed)


def test_registry_cases_have_reasons_and_unique_names():
    for spec in REGISTRY.values():
        names = [c.name for c in spec.cases]
        assert len(names) == len(set(names)), spec.name
        assert all(c.reason for c in (*spec.cases, *spec.bench_cases)), spec.name
        assert spec.bench_cases, f"{spec.name} has no benchmark shapes"
        for case in (*spec.cases, *spec.bench_cases):
            for mode in ("fwd", "bwd") if spec.has_backward else ("fwd",):
                assert spec.flops(case, mode) >= 0
                assert spec.min_bytes(case, torch.bfloat16, mode) > 0
