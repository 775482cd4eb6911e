"""The predicted-fraction-of-peak model (workbench/static/predict.py) and its table in docs/predicted-peak.md.

Hand-made rows with answers worked out by hand, monotonicity in the facts that must never predict a faster
kernel, and the doc's table equal to what the script prints from the committed static baseline.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from wavefront.workbench.jobs import predict
from wavefront.workbench.jobs.predict import _key_stationary, _query_stationary
from wavefront.workbench.jobs.request import RequestError
from wavefront.workbench.static import predict as pm

ROOT = Path(__file__).resolve().parents[3]
DOC = ROOT / "docs" / "predicted-peak.md"
BEGIN, END = "<!-- predicted-peak table: begin -->", "<!-- predicted-peak table: end -->"


def _traffic(min_bytes: int, moved: int, unique: int, host: int = 0) -> dict:
    return {"min_bytes": min_bytes, "bytes_moved": moved, "unique_bytes": unique, "host_bytes": host, "error": None}


# ---------------------------------------------------------------------------------------------------
# Memory-bound rows.


@pytest.mark.parametrize("target", list(pm.TARGETS))
def test_ideal_memory_row_predicts_the_ceiling(target):
    row = pm.predict_memory("op", "fwd", "c", target, _traffic(1000, 1000, 1000))
    assert row.predicted == pytest.approx(pm.TARGETS[target].hbm_ceiling)
    assert row.predicted_high == pytest.approx(pm.TARGETS[target].hbm_ceiling)
    assert row.label == pm.LABEL == "predicted (model), not measured"


@pytest.mark.parametrize("target", list(pm.TARGETS))
def test_two_hbm_passes_predict_half(target):
    # Both the cache-less count and the footprint are twice the minimum: two real passes over HBM.
    row = pm.predict_memory("op", "fwd", "c", target, _traffic(1000, 2000, 2000))
    assert row.predicted == pytest.approx(pm.TARGETS[target].hbm_ceiling / 2)
    assert row.predicted_high == pytest.approx(pm.TARGETS[target].hbm_ceiling / 2)


def test_a_reread_spans_half_to_the_ceiling():
    # The input read twice by the kernel (requested 2x), but the footprint is the minimum: the second read
    # may hit cache, so the model gives the range.
    row = pm.predict_memory("op", "fwd", "c", "sm_90", _traffic(1000, 2000, 1000))
    assert row.predicted == pytest.approx(0.45)
    assert row.predicted_high == pytest.approx(0.90)


def test_host_bytes_count_against_the_op():
    row = pm.predict_memory("op", "bwd", "c", "sm_90", _traffic(1000, 1500, 1000, host=500))
    assert row.predicted == pytest.approx(0.90 / 1.5)
    assert row.predicted_high == pytest.approx(0.90 / 1.5)


def test_launch_cost_weighs_only_on_small_ops():
    t = _traffic(1000, 1000, 1000)
    big = pm.predict_memory("op", "fwd", "c", "sm_90", t, [{}], bench_min_bytes=1 << 30)
    small = pm.predict_memory("op", "fwd", "c", "sm_90", t, [{}], bench_min_bytes=1 << 20)
    two = pm.predict_memory("op", "fwd", "c", "sm_90", t, [{}, {}], bench_min_bytes=1 << 20)
    # 1 GiB at 3.35 TB/s x 0.9 is ~356 us against 3 us of launch; 1 MiB is ~0.35 us against 3 us.
    ideal_us = (1 << 30) / 3.35e6
    assert big.predicted == pytest.approx(ideal_us / (ideal_us / 0.9 + pm.LAUNCH_US))
    assert small.predicted < 0.15 < 0.85 < big.predicted < 0.90
    assert two.predicted < small.predicted


def test_spills_and_traffic_case_are_flagged_and_errors_not_modelled():
    row = pm.predict_memory("op", "fwd", "c", "gfx942", _traffic(1000, 1000, 1000), [{"spill_bytes": 52}], "other")
    assert any("spills 52 B" in f for f in row.flags) and any("other" in f for f in row.flags)
    bad = pm.predict_memory("op", "fwd", "c", "sm_90", {"error": "boom"})
    assert bad.predicted is None and any("boom" in f for f in bad.flags)
    with pytest.raises(ValueError, match="target must be one of"):
        pm.predict_memory("op", "fwd", "c", "sm_80", _traffic(1000, 1000, 1000))


# ---------------------------------------------------------------------------------------------------
# Matrix-unit kernels.

#: One CTA per SM on sm_90 (12 warps of 64 resident), two consumer warpgroups.
BASE = {"ok": True, "num_warps": 12, "occupancy": 12 / 64, "consumer_warpgroups": 2, "pingpong": False,
        "mma_wait_depth": 1, "mma_overlap_depth": 0, "loop_barriers": 0, "loop_mask_ops": 0, "spill_bytes": 0}


def _loop(valu: float = 0.0, iters: float = 8, tiles: int = 132) -> pm.LoopShape:
    # 4096 x 1000 FLOPs: 1,000 clk of tensor time per iteration on sm_90.
    return pm.LoopShape(tensor_flop=4096 * 1000, valu_ops=valu, mufu_ops=0, iterations_per_tile=iters, tiles=tiles)


def test_tensor_bound_loop_known_answer():
    row = pm.predict_compute("op", "fwd", "c", "k", "sm_90", BASE, _loop())
    # loop 1.0; tile = 8,000 / (8,000 + 2,000) = 0.8; one full wave; ceiling 0.80.
    assert row.terms["loop"] == pytest.approx(1.0)
    assert row.terms["tile"] == pytest.approx(0.8)
    assert row.terms["waves"] == pytest.approx(1.0)
    assert row.predicted == pytest.approx(0.80 * 0.8)


def test_serialized_loop_known_answer():
    inspect = BASE | {"mma_wait_depth": 0, "loop_barriers": 2}
    row = pm.predict_compute("op", "fwd", "c", "k", "sm_90", inspect, _loop(valu=128 * 500))
    # t_iter = 1,000 tensor + 500 FP32 + 2 x 32 barriers + 128 / 2 drain = 1,628 clk.
    assert row.terms["t_iter"] == pytest.approx(1628)
    assert row.terms["loop"] == pytest.approx(1000 / 1628)


def test_overlap_hides_the_other_work_under_the_tensor_time():
    over = pm.predict_compute("op", "fwd", "c", "k", "sm_90", BASE | {"pingpong": True}, _loop(valu=128 * 500))
    assert over.terms["t_iter"] == pytest.approx(1000)


def test_one_extra_tile_costs_a_wave():
    row = pm.predict_compute("op", "fwd", "c", "k", "sm_90", BASE, _loop(tiles=133))
    assert row.terms["waves"] == pytest.approx(133 / 264)


def test_two_resident_ctas_overlap_each_other():
    assert pm.ctas_per_sm(BASE, "sm_90") == 1
    assert pm.ctas_per_sm({"num_warps": 4, "occupancy": 0.25}, "gfx942") == 2  # 2 waves/SIMD x 4 SIMDs / 4
    two = pm.loop_terms({"num_warps": 4, "occupancy": 0.25}, _loop(valu=64 * 500), "gfx942")
    assert two["overlapped"] == 1.0


MONOTONE = [
    ("loop_barriers", [0, 1, 3, 8, 15]),
    ("loop_mask_ops", [0, 80, 198, 400]),
]


@pytest.mark.parametrize("target", list(pm.TARGETS))
@pytest.mark.parametrize("field,values", MONOTONE)
@pytest.mark.parametrize("extra", [{}, {"pingpong": True}, {"mma_wait_depth": 0}])
def test_more_barriers_or_mask_ops_never_predict_faster(target, field, values, extra):
    preds = [pm.predict_compute("op", "fwd", "c", "k", target, BASE | extra | {field: v},
                                _loop(valu=256 * 300)).predicted for v in values]
    assert all(b <= a for a, b in zip(preds, preds[1:], strict=False)), preds
    if field == "loop_barriers" or not extra.get("pingpong"):
        # Mask instructions under ping-pong are hidden while the other work fits under the tensor time.
        assert preds[-1] < preds[0]


@pytest.mark.parametrize("target", list(pm.TARGETS))
@pytest.mark.parametrize("valu", [0.0, 128 * 300, 128 * 2000])
def test_wait_depth_zero_and_no_pingpong_never_predict_faster(target, valu):
    loop = _loop(valu=valu)
    drained = pm.predict_compute("op", "fwd", "c", "k", target, BASE | {"mma_wait_depth": 0}, loop).predicted
    deep = pm.predict_compute("op", "fwd", "c", "k", target, BASE | {"mma_overlap_depth": 1}, loop).predicted
    ping = pm.predict_compute("op", "fwd", "c", "k", target, BASE | {"pingpong": True}, loop).predicted
    plain = pm.predict_compute("op", "fwd", "c", "k", target, BASE, loop).predicted
    assert drained < plain <= deep and plain <= ping


def test_combine_times_kernels_one_after_another():
    a = pm.PredictedRow("attention", "bwd", "c", "dkdv", "sm_90", "compute", "x", 0.5)
    b = pm.PredictedRow("attention", "bwd", "c", "dq", "sm_90", "compute", "x", 0.25)
    row = pm.combine("attention", "bwd", "c", "sm_90", [(a, 4.0), (b, 3.0)], 5.0, "x")
    assert row.predicted == pytest.approx(5 / (4 / 0.5 + 3 / 0.25))
    missing = pm.combine("attention", "bwd", "c", "sm_90", [(a, 4.0), (pm.PredictedRow(
        "attention", "bwd", "c", "dq", "sm_90", "compute", "x", None), 3.0)], 5.0, "x")
    assert missing.predicted is None


def test_the_model_module_imports_no_torch():
    code = "import sys, wavefront.workbench.static.predict; sys.exit('torch' in sys.modules or 'triton' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0


# ---------------------------------------------------------------------------------------------------
# The job over the committed baseline, and the doc.


@pytest.fixture(scope="module")
def report():
    return predict.predict(predict.PredictRequest(baseline=str(ROOT / predict.PredictRequest.baseline)))


def test_causal_geometry_counts_the_diagonal():
    iters, useful = _query_stationary(8192, 128, 128, causal=True)
    assert iters == pytest.approx(32.5) and useful == pytest.approx(8193 / (8192 + 128))
    assert _query_stationary(8192, 128, 64, causal=False) == (128, 1.0)
    k_iters, k_useful = _key_stationary(8192, 64, 128, causal=True)
    assert k_useful < 1 and k_iters == pytest.approx(sum(128 - 2 * j for j in range(64)) / 64)


def test_every_row_is_labelled_a_prediction(report):
    doc = report.as_dict()
    assert doc["schema"] == "wavefront.predict/1" and doc["label"] == pm.LABEL
    assert doc["rows"] and all(r["label"] == pm.LABEL for r in doc["rows"])
    modelled = [r for r in doc["rows"] if r["predicted"] is not None]
    assert modelled and all(0 < r["predicted"] <= 0.9 for r in modelled)


def test_fa3_forward_agrees_with_the_hand_model_in_the_attention_doc(report):
    # docs/kernels-attention-gemm.md: "predicted about 0.70 of peak for the causal d128 forward at S 8192".
    (row,) = [r for r in report.rows if r.key == "attention/fwd/llama3-8b_s8192_causal/_attn_fwd_sm90_fa3@sm_90"]
    assert row.predicted == pytest.approx(0.70, abs=0.03)
    # The default kernel's row, under either of its names (_attn_fwd_tma_kernel since the operand-path split).
    (default,) = [r for r in report.rows if r.kernel in predict.ATTENTION_KINDS and r.target == "sm_90"
                  and (r.mode, r.case) == ("fwd", "llama3-8b_s8192_causal")]
    assert default.predicted < row.predicted


def test_doc_table_is_the_verbs_output_on_the_committed_baseline(report):
    text = DOC.read_text()
    assert BEGIN in text and END in text, f"{DOC} lacks the table markers"
    table = text.split(BEGIN, 1)[1].split(END, 1)[0].strip()
    assert table == predict.markdown(report, cases=predict.DOC_CASES).strip(), (
        "docs/predicted-peak.md's table drifted: regenerate it with "
        "`wavefront predict` (see the doc)")


def test_bad_requests_name_the_argument(tmp_path):
    with pytest.raises(RequestError) as e:
        predict.predict(predict.PredictRequest(targets=("sm_80",)))
    assert e.value.argument == "targets"
    bad = tmp_path / "x.json"
    bad.write_text("[]")
    with pytest.raises(RequestError) as e:
        predict.predict(predict.PredictRequest(baseline=str(bad)))
    assert e.value.argument == "baseline"


@pytest.mark.parametrize(("mode", "pointer", "tma"), [("fwd", "_attn_fwd_kernel", "_attn_fwd_tma_kernel"),
                                                     ("bwd", "_attn_bwd_dkdv_kernel", "_attn_bwd_dkdv_tma_kernel")])
def test_attention_tma_kernels_share_their_pointer_twins_loop(mode, pointer, tma):
    # One program under two kernels (the operand-path split): the same loop model on the same entry.
    want = predict.loop_shape("attention", mode, "llama3-8b_s8192_causal", pointer, "sm_90")
    assert want is not None
    assert predict.loop_shape("attention", mode, "llama3-8b_s8192_causal", tma, "sm_90") == want
