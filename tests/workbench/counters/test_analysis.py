"""Roofline placement, matching to inspect/traffic predictions, gaps, and counter A/B."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from wavefront.workbench.counters.analysis import BYTES_GAP, place, same_registers
from wavefront.workbench.counters.load import load
from wavefront.workbench.counters.model import CountersLoadError
from wavefront.workbench.hardware import get_gpu
from wavefront.workbench.jobs import counters as job

DATA = Path(__file__).resolve().parents[2] / "data" / "counters"
NCU_A, NCU_B = DATA / "ncu_raw_h100_a.csv", DATA / "ncu_raw_h100_b.csv"
V3, PERF = DATA / "rocprofv3_counter_collection_mi300x.csv", DATA / "pmc_perf_mi300x.csv"
INSPECT, TRAFFIC = DATA / "inspect_rms_norm.json", DATA / "traffic_rms_norm.json"


def test_compute_bound_launch_sits_under_the_matrix_roof():
    h100 = get_gpu("h100")
    la = load(NCU_A).launches[6]
    row = place(la, h100)
    achieved = la.flops / (la.duration_ns * 1e-9) / 1e12
    assert row.roof == "matrix" and row.peak_tflops == h100.bf16_tflops
    assert row.achieved_tflops == pytest.approx(achieved)
    assert row.intensity_dram == pytest.approx(la.flops / la.dram_bytes)
    assert row.bound == "compute" and row.attainable_tflops == h100.bf16_tflops  # right of the ridge
    assert row.pct_of_roof == pytest.approx(achieved / h100.bf16_tflops * 100)
    assert row.intensity_l2 == pytest.approx(la.flops / la.l2_bytes)
    assert row.intensity_l1 == pytest.approx(la.flops / la.l1_bytes)


def test_memory_bound_launch_sits_under_the_bandwidth_roof():
    h100 = get_gpu("h100")
    la = load(NCU_A).launches[0]
    row = place(la, h100)
    intensity = la.flops / la.dram_bytes
    assert row.roof == "vector" and row.bound == "memory" and intensity < h100.fp32_tflops / h100.hbm_tbps
    assert row.attainable_tflops == pytest.approx(intensity * h100.hbm_tbps)
    assert row.dram_tbps == pytest.approx(la.dram_bytes / (la.duration_ns * 1e-9) / 1e12)
    assert row.pct_hbm == pytest.approx(row.dram_tbps / h100.hbm_tbps * 100)


def test_unmeasured_counters_leave_the_roofline_fields_empty(tmp_path):
    text = NCU_A.read_text().replace('"dram__bytes_read.sum","dram__bytes_write.sum"',
                                     '"dram__other_read.sum","dram__other_write.sum"')
    f = tmp_path / "nodram.csv"
    f.write_text(text)
    row = place(load(f).launches[0], get_gpu("h100"))
    assert row.dram_bytes is None and row.intensity_dram is None and row.pct_of_roof is None and row.bound is None


def _result(path, device=None):
    return job.counters(job.CountersRequest(path, device, INSPECT, TRAFFIC))


def test_matched_to_inspect_and_traffic_by_name_and_shape():
    rows = _result(NCU_A).rows
    fwd, bwd, attn = rows[0], rows[5], rows[6]
    p = fwd.predicted
    assert (p.op, p.mode, p.case, p.inspect_match) == ("rms_norm", "fwd", "llama3-8b_hidden", "name+shape")
    assert (p.regs, p.occupancy, p.spill_bytes, p.shared_bytes) == (34, 0.75, 0, 1056)
    traffic = json.loads(TRAFFIC.read_text())
    k = next(r for r in traffic["rows"] if r["key"] == "rms_norm/fwd/llama3-8b_hidden")["kernels"][0]
    assert p.traffic_match == "scaled per block"
    assert p.bytes == pytest.approx((k["loaded_bytes"] + k["stored_bytes"]) / k["grid"][0] * 32768)
    assert fwd.gaps == []  # DRAM within [1/2, 2]x, occupancy above half, registers equal
    assert len(bwd.gaps) == 3 and bwd.gaps[0].startswith("DRAM bytes 6.99x")
    assert "72 registers measured, 60 predicted" in bwd.gaps[2]
    assert attn.predicted.inspect_match == "none" and attn.predicted.traffic_match == "none" and attn.gaps == []
    assert (fwd.predicted.source, attn.predicted.source) == ("kernels/norm.py", "kernels/attention_fwd.py")


def test_a_kernel_that_is_not_ours(tmp_path):
    f = tmp_path / "foreign.csv"
    f.write_text(NCU_A.read_text().replace('"_attn_fwd_kernel"', '"void at::native::reduce_kernel<512, 1>(int)"'))
    row = job.counters(job.CountersRequest(f, inspect=INSPECT)).rows[6]
    assert row.kernel.startswith("void at::native") and row.predicted.source is None
    assert row.predicted.inspect_match == "none"


def test_same_grid_traffic_is_compared_as_is(tmp_path):
    traffic = json.loads(TRAFFIC.read_text())
    for r in traffic["rows"]:
        for k in r["kernels"]:
            if k["kernel"] == "_norm_fwd_kernel":
                k["grid"] = [32768]
    f = tmp_path / "traffic.json"
    f.write_text(json.dumps(traffic))
    row = job.counters(job.CountersRequest(NCU_A, traffic=f)).rows[0]
    assert row.predicted.traffic_match == "same grid"
    assert row.predicted.dram_over_predicted == pytest.approx(row.dram_bytes / (1048576 + 524544))
    assert row.gaps and f"outside [1/{BYTES_GAP:g}" in row.gaps[0]  # 537 MB measured vs 1.6 MB predicted


def test_amd_registers_compare_in_allocation_granules():
    mi300x = get_gpu("mi300x")
    assert same_registers(39, 40, mi300x) and not same_registers(39, 48, mi300x)
    assert not same_registers(39, 40, get_gpu("h100"))
    row = _result(V3, "mi300x").rows[0]
    assert row.predicted.regs == 39 and row.registers == 40 and row.gaps == []
    lim = mi300x.limits
    assert row.achieved_occupancy == pytest.approx(1838592000 / 252000 / mi300x.sm_count
                                                   / (lim.max_warps_per_sm * lim.simds_per_cu))


def test_device_from_the_profile_or_the_request():
    assert _result(NCU_A).device.key == "h100"
    assert _result(NCU_A, "h200").device.key == "h200"
    with pytest.raises(job.RequestError, match="names no device"):
        job.counters(job.CountersRequest(V3))
    with pytest.raises(job.RequestError, match="unknown GPU 'z80'"):
        job.counters(job.CountersRequest(V3, "z80"))


def test_prediction_documents_are_checked(tmp_path):
    with pytest.raises(job.RequestError, match="is not a wavefront.inspect/1 document"):
        job.counters(job.CountersRequest(NCU_A, inspect=TRAFFIC))
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(job.RequestError, match="cannot read JSON document"):
        job.counters(job.CountersRequest(NCU_A, traffic=bad))


def test_document():
    doc = _result(NCU_A).as_dict()
    assert doc["schema"] == job.SCHEMA == "wavefront.counters/1"
    assert doc["n_launches"] == 7 and doc["n_gaps"] == 1 and doc["device"] == "h100"
    assert doc["kernels"][0]["predicted"]["op"] == "rms_norm"
    json.dumps(doc, allow_nan=False)


def test_ab_uses_the_compare_statistics_where_launches_repeat():
    from wavefront.workbench import stats

    result = job.compare(job.CompareRequest(NCU_A, NCU_B))
    d = next(x for x in result.deltas if x.kernel == "_norm_fwd_kernel" and x.metric == "duration_us")
    a = [la.duration_ns / 1e3 for la in load(NCU_A).launches[:5]]
    b = [la.duration_ns / 1e3 for la in load(NCU_B).launches[:5]]
    ref = stats.compare(a, b)
    assert d.method == "stats" and (d.ratio, d.ci_low, d.ci_high, d.p_value) == (ref.ratio, ref.ci_low,
                                                                                  ref.ci_high, ref.p_value)
    assert ref.verdict == "faster" and d.verdict == "lower"
    occ = next(x for x in result.deltas if x.kernel == "_norm_fwd_kernel" and x.metric == "achieved_occupancy")
    assert occ.verdict == "higher"


def test_ab_without_repeats_is_a_labelled_plain_delta():
    result = job.compare(job.CompareRequest(NCU_A, NCU_B))
    d = next(x for x in result.deltas if x.kernel == "_norm_bwd_kernel" and x.metric == "duration_us")
    assert (d.method, d.n_a, d.n_b, d.verdict, d.p_value) == ("delta", 1, 1, "", None)
    assert d.delta == pytest.approx(371.9 - 402.7) and d.ratio == pytest.approx(371.9 / 402.7)
    assert result.as_dict()["schema"] == job.COMPARE_SCHEMA == "wavefront.counters.compare/1"


def test_ab_across_tools_marks_what_one_side_did_not_measure():
    result = job.compare(job.CompareRequest(NCU_A, V3))  # the same launch shape of _norm_fwd_kernel
    occ = next(x for x in result.deltas if x.metric == "achieved_occupancy")
    assert occ.method == "not measured" and occ.median_b is None  # AMD occupancy needs a device
    assert "_attn_fwd_kernel [4096 x 256]" in result.only_a


def test_ab_with_nothing_in_common(tmp_path):
    lines = PERF.read_text().splitlines()
    attn_only = tmp_path / "attn.csv"
    attn_only.write_text("\n".join([lines[0], lines[2]]) + "\n")
    with pytest.raises(CountersLoadError, match="share no kernel launch"):
        job.compare(job.CompareRequest(V3, attn_only))



def _inspect_with(tmp_path, rows: list[dict]) -> Path:
    f = tmp_path / "inspect.json"
    f.write_text(json.dumps({"schema": "wavefront.inspect/1", "rows": rows}))
    return f


def _row(case: str, grid: int, regs: int, occupancy: float) -> dict:
    return {"op": "rms_norm", "mode": "fwd", "case": case, "kernel": "_norm_fwd_kernel", "target": "sm_90",
            "ok": True, "grid": [grid], "threads_per_block": 256, "regs": regs, "spill_bytes": 0,
            "occupancy": occupancy, "shared_bytes": 1056}


def test_name_only_and_ambiguous_matches_are_labelled(tmp_path):
    other_shape = _inspect_with(tmp_path, [_row("small", 64, 34, 0.75)])
    p = job.counters(job.CountersRequest(NCU_A, inspect=other_shape)).rows[0].predicted
    assert (p.inspect_match, p.case) == ("name", "small")
    two = _inspect_with(tmp_path, [_row("x", 32768, 30, 1.0), _row("y", 32768, 31, 0.75)])
    p = job.counters(job.CountersRequest(NCU_A, inspect=two)).rows[0].predicted
    assert p.inspect_match == "ambiguous:2"  # neither has the 34 registers measured, and they disagree
    picked = _inspect_with(tmp_path, [_row("x", 32768, 30, 1.0), _row("y", 32768, 34, 0.75)])
    p = job.counters(job.CountersRequest(NCU_A, inspect=picked)).rows[0].predicted
    assert (p.inspect_match, p.case) == ("name+shape", "y")  # the measured registers pick the compilation
    other_target = _inspect_with(tmp_path, [_row("x", 32768, 34, 1.0) | {"target": "gfx942"}])
    assert job.counters(job.CountersRequest(NCU_A, inspect=other_target)).rows[0].predicted.inspect_match == "none"


def test_theoretical_occupancy_checks_the_occupancy_model(tmp_path):
    rows = job.counters(job.CountersRequest(NCU_A, inspect=INSPECT)).rows
    assert (rows[0].theoretical_occupancy, rows[0].occupancy_limiter) == (pytest.approx(0.75), "registers")
    assert rows[0].predicted.occupancy_limiter == "registers" and rows[0].gaps == []
    wrong_model = _inspect_with(tmp_path, [_row("x", 32768, 34, 1.0) | {"occupancy_limiter": "warps"}])
    gaps = job.counters(job.CountersRequest(NCU_A, inspect=wrong_model)).rows[0].gaps
    assert gaps == ["theoretical occupancy 0.75 by the profiler, 1.00 predicted (limiter registers vs warps): the "
                    "occupancy model is off for this launch"]
    assert job.counters(job.CountersRequest(V3, "mi300x")).rows[0].theoretical_occupancy is None
