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


def _design_rows() -> list[KernelRow]:
    """Three cases of one kernel (one warp-specialized TMA kernel) and a second op, on two targets."""
    rows = []
    for case, regs, occ in (("llama3-8b_s8192_causal_fp8out_1x128", 168, 0.1875), ("gpt3-175b_s2048", 232, 0.125),
                            ("qwen2.5-7b_s4096_causal", 200, 0.25)):
        rows.append(KernelRow("attention", "fwd", case, "bf16", "_attn_fwd_kernel", "sm_90", [128], True, num_warps=12,
                              regs=regs, shared_bytes=197_632, widest_load_bits=0, widest_store_bits=32,
                              occupancy=occ, occupancy_limiter="registers", matrix_families=["wgmma"], tma_ops=6,
                              setmaxnreg=8, mma_wait_depth=1))
        rows.append(KernelRow("attention", "fwd", case, "bf16", "_attn_fwd_kernel", "gfx942", [128], True,
                              num_warps=8, regs=174, sgprs=90, shared_bytes=32_768, widest_load_bits=128,
                              widest_store_bits=64, occupancy=0.25, occupancy_limiter="registers",
                              matrix_families=["mfma"]))
    rows.append(KernelRow("linear_cross_entropy", "fwd_bwd", "llama3-70b_128k_vocab", "bf16",
                          "_linear_cross_entropy_partial_reduction_kernel#2", "sm_90", [1], True, num_warps=8,
                          regs=40, widest_load_bits=128, widest_store_bits=128, occupancy=0.75,
                          occupancy_limiter="registers"))
    return rows


@pytest.mark.parametrize("width", [80, 120])
def test_inspect_table_one_line_per_kernel_and_target_with_the_design(width):
    """Default view: one row per kernel x target (its worst case over the op's cases), never wrapped, with
    the design fields (TMA, setmaxnreg, wait depth) and a legend for '-'."""
    report = InspectReport(_design_rows(), ["sm_90", "gfx942"], "bf16", {})
    text = render(cli_inspect.inspect_table(report), width)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= width, text
    for header in ("tma", "nreg", "wait", "regs", "occ", "ld/st"):
        assert header in lines[1].split(), (header, text)
    data = [ln for ln in lines if ln.startswith("  ")]
    assert len(data) == 3, text  # attn_fwd on two targets, the partial reduction on one: no case rows, no wrap
    sm90 = next(ln for ln in data if "sm_90" in ln and "attn_fwd" in ln).split()
    # The worst case: most registers (232), least occupancy (12%); TMA 6, setmaxnreg 8, wait depth 1.
    assert "232" in sm90 and sm90[-7:] == ["12%", "regs", "-/32", "wgmma", "6", "8", "1"], text
    assert any(ln.strip() == "linear_cross_entropy fwd_bwd" for ln in lines), text
    partial = next(ln for ln in data if "attn" not in ln).split()[0]
    assert partial == "linear_cross_entropy_partial_reduction#2" or (partial.endswith("…") and len(partial) >= 16)
    from wavefront.workbench.static.inspect import LEGEND

    legend = " ".join(render(LEGEND, width).split())
    assert legend.startswith("-: none (ld/st: no plain global load/store") and "nreg: setmaxnreg" in legend


@pytest.mark.parametrize("width", [80, 120])
def test_inspect_table_all_rows_one_line_per_case(width):
    report = InspectReport(_design_rows(), ["sm_90", "gfx942"], "bf16", {})
    text = render(cli_inspect.inspect_table(report, all_rows=True), width)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= width, text
    assert len([ln for ln in lines if ln.startswith("  ")]) == 7, text
    assert "174v 90s" in text  # every register file on AMD in the per-case view


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
