"""Terminal tables never cut a number, at 80 and at 120 columns, and hide always-empty columns."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from wavefront.cli import inspect as cli_inspect
from wavefront.workbench.hardware import get_gpu
from wavefront.workbench.static.inspect import InspectReport, KernelRow
from wavefront.workbench.static.roofline import roofline
from wavefront.workbench.static.traffic import TrafficReport, TrafficRow


def render(renderable, width: int) -> str:
    out = io.StringIO()
    Console(file=out, width=width, force_terminal=False, color_system=None).print(renderable)
    return out.getvalue()


def _inspect_report() -> InspectReport:
    rows = [KernelRow("linear_cross_entropy", "fwd_bwd", "llama3-70b_128k_vocab", "bf16",
                      "_linear_cross_entropy_fwd_bwd_kernel#2", target, [128], True, num_warps=8, regs=255, sgprs=104,
                      agprs=128, spill_bytes=1024, spill_count=12, shared_bytes=229_376, widest_load_bits=128,
                      widest_store_bits=64, occupancy=0.1875, active=12, occupancy_limiter="registers",
                      matrix_families=["wgmma", "mma"]) for target in ("sm_90", "gfx1100")]
    return InspectReport(rows, ["sm_90", "gfx1100"], "bf16", {})


def _traffic_report() -> TrafficReport:
    row = TrafficRow("linear_cross_entropy", "fwd_bwd", "llama3-70b_hidden", "bf16",
                     {"n_rows": 16384, "n_cols": 262144, "hidden": 8192}, [], 1_048_576_123, 1_000_000, 7_340_032,
                     1_048_576_000, 12_884_901_888, marginal_ratio=1.0125)
    return TrafficReport([row], "bf16")


@pytest.mark.parametrize("width", [80, 120])
def test_inspect_table_keeps_every_number(width):
    text = render(cli_inspect.inspect_table(_inspect_report()), width)
    assert "…" not in text
    # Too wide for 80 columns: the low-value columns (warps, smem) go; the rest stays whole.
    for number in ("255v 104s 128a", "1024", "19% regs", "128", "64", *(["229376"] if width >= 120 else [])):
        assert number in text, (number, text)
    assert max(len(line) for line in text.splitlines()) <= width


@pytest.mark.parametrize("width", [80, 120])
def test_traffic_table_keeps_every_number(width):
    text = render(cli_inspect.traffic_table(_traffic_report()), width)
    assert "…" not in text
    for number in ("1,055,916,155", "1,048,576,000", "1.01", *(["16384x262144x8192"] if width >= 120 else [])):
        assert number in text, (number, text)
    assert max(len(line) for line in text.splitlines()) <= width


@pytest.mark.parametrize("width", [80, 120])
def test_roofline_table_tells_cases_apart_and_hides_empty_columns(width):
    report = roofline(get_gpu("mi300x"), ["rms_norm"], matrix_ops=())
    text = render(cli_inspect.roofline_table(report), width)
    assert "…" not in text
    for p in report.points:
        assert p.case in text.replace("\n", " ") or p.case[:20] in text, p.case
        assert f"{p.attainable_us:.1f}" in text
    # No traffic document and no measured time: those columns are empty in every row, so hidden.
    assert "kernel us" not in text and "measured us" not in text and "% of roof" not in text
    assert max(len(line) for line in text.splitlines()) <= width


@pytest.mark.parametrize("width", [80, 120])
def test_bench_prints_failures_whole(width):
    """The bench summary's failure table: the case, the errors against their bounds, and why (markup-safe)."""
    from wavefront.cli import bench as cli_bench
    from wavefront.workbench.bench.correctness import CaseCheck, TensorCheck

    bad = CaseCheck("linear_cross_entropy", "llama3-70b_128k_vocab", "", "bf16", "cpu", "cpu-interpreter",
                    [TensorCheck("out0", "fwd", 1.234e-2, 1.0e-3, 2.5e-3, 10.0)])
    broken = CaseCheck("softmax", "npow2", "", "fp16", "cpu", "cpu-interpreter", error="ValueError: shape [3] bad")
    text = render(cli_bench._failures_table([bad, broken]), width)
    assert "…" not in text and "1.23e-02" in text and "ValueError: shape [3] bad" in " ".join(text.split())
