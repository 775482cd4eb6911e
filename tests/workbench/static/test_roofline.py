"""The roofline model against hand-computed values, and the roofline and traffic verbs."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from wavefront.cli import build_app
from wavefront.ops import REGISTRY
from wavefront.ops._spec import Case
from wavefront.workbench.hardware import get_gpu
from wavefront.workbench.static import roofline as rl

CASE = Case("h", "hand-computed", {"n_rows": 32768, "n_cols": 4096})


def test_memory_bound_point_by_hand():
    spec = REGISTRY["rms_norm"]
    p = rl.point(spec, CASE, "fwd", torch.bfloat16, get_gpu("h100"))
    n = 32768 * 4096
    flops = 4 * n
    nbytes = 2 * n * 2 + 4096 * 2 + 32768 * 4  # x read, y written (bf16), w read, rstd written (fp32)
    assert (p.flops, p.min_bytes) == (flops, nbytes)
    assert p.t_memory_us == pytest.approx(nbytes / 3.35e12 * 1e6)
    assert p.t_compute_us == pytest.approx(flops / 66.9e12 * 1e6)  # vector FP32 roof: no matrix instructions
    assert (p.bound, p.compute_roof) == ("memory", "vector")
    assert p.attainable_us == pytest.approx(160.30, abs=0.01)
    assert p.intensity == pytest.approx(flops / nbytes) and p.ridge == pytest.approx(66.9 / 3.35)


def test_matrix_roof_traffic_and_measured_time():
    spec = REGISTRY["softmax"]
    gpu = get_gpu("mi300x")
    p = rl.point(spec, CASE, "bwd", torch.bfloat16, gpu, uses_matrix=True, traffic_ratio=1.5, measured_us=400.0)
    assert (p.compute_roof, p.peak_tflops) == ("matrix", 1307.4)
    assert p.kernel_bytes == round(p.min_bytes * 1.5)
    assert p.kernel_attainable_us == pytest.approx(p.kernel_bytes / 5.3e12 * 1e6)
    assert p.pct_of_roof == pytest.approx(p.attainable_us / 400.0 * 100)
    with pytest.raises(ValueError, match="measured time must be positive"):
        rl.point(spec, CASE, "fwd", torch.bfloat16, gpu, measured_us=0.0)


def test_roofline_over_the_registry_and_measured_times(tmp_path):
    path = tmp_path / "measured.json"
    path.write_text(json.dumps({"results": [{"op": "softmax", "case": "attn_scores_4k", "mode": "fwd", "dtype": "bf16",
                                             "device": "H100", "dur_us": 100.0}]}))
    measured = rl.load_measured(path)
    report = rl.roofline("h100", ["softmax"], measured=measured)
    assert len(report.points) == 2 * len(REGISTRY["softmax"].bench_cases)
    hit = [p for p in report.points if p.pct_of_roof is not None]
    assert [(p.case, p.mode) for p in hit] == [("attn_scores_4k", "fwd")]
    assert all(p.bound == "memory" for p in report.points)
    path.write_text(json.dumps([{"op": "softmax"}]))
    with pytest.raises(ValueError, match="record 0 needs op, case, mode, dtype, device, dur_us"):
        rl.load_measured(path)
    with pytest.raises(ValueError, match="unknown GPU 'tpu'"):
        rl.roofline("tpu")


def test_traffic_ratios_prefer_the_marginal_ratio():
    doc = {"rows": [{"op": "a", "mode": "fwd", "case": "c", "marginal_ratio": 1.0, "ratio_min": 1.3, "error": None},
                    {"op": "a", "mode": "bwd", "case": "c", "marginal_ratio": None, "ratio_min": 1.2, "error": None},
                    {"op": "b", "mode": "fwd", "case": "c", "error": "boom"}]}
    assert rl.traffic_ratios(doc) == {("a", "fwd", "c"): 1.0, ("a", "bwd", "c"): 1.2}


def test_registered_ops_use_no_matrix_units():
    # The foundation's row-wise kernels are vector code; a GEMM would show up here.
    assert rl.detect_matrix_ops(["softmax", "rms_norm"]) == set()


def test_roofline_cli_json(tmp_path):
    inspect_doc = tmp_path / "inspect.json"
    inspect_doc.write_text(json.dumps({"rows": [{"op": "softmax", "matrix_families": []}]}))
    out = tmp_path / "roof.json"
    result = CliRunner().invoke(build_app(), ["roofline", "--device", "mi300x", "--op", "softmax",
                                              "--inspect", str(inspect_doc), "--json", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert doc["schema"] == "wavefront.roofline/1" and doc["device"]["key"] == "mi300x"
    assert {p["compute_roof"] for p in doc["points"]} == {"vector"}
    bad = CliRunner().invoke(build_app(), ["roofline", "--device", "tpu"])
    assert bad.exit_code == 2 and "unknown GPU 'tpu'" in bad.output


def test_traffic_cli_json(tmp_path):
    out = tmp_path / "traffic.json"
    result = CliRunner().invoke(build_app(), ["traffic", "--op", "softmax", "--no-marginal", "--json", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert doc["schema"] == "wavefront.traffic/1" and doc["n_failed"] == 0
    first = doc["rows"][0]
    assert (first["op"], first["mode"], first["ratio_min"]) == ("softmax", "fwd", 1.0)
    assert "softmax" in result.output and "CPU interpreter" in result.output


def test_measured_times_come_from_a_stored_gpu_run(tmp_path):
    """`wavefront roofline --store`: the achieved % of roof uses a GPU run's medians; CPU runs are refused.
    (Synthetic fixture timings, not performance figures.)"""
    import pytest

    from wavefront.workbench.bench.records import Measurement, RunInfo, StoredRun
    from wavefront.workbench.bench.store import ResultStore
    from wavefront.workbench.jobs.request import RequestError
    from wavefront.workbench.jobs.roofline import measured_from_store
    from wavefront.workbench.static.roofline import roofline

    def run(timing, device):
        info = RunInfo("2026-01-01T00:00:00Z", "fixture", "a" * 40, False, device, "sm_90", "cuda", "2.13", "3.9",
                       "3.11", "h", timing)
        ms = [Measurement("rms_norm", "llama3-8b_hidden", "fwd", "bf16", p, "ok", samples_us=[us] * 5)
              for p, us in (("wavefront", 250.0), ("eager", 900.0))]
        return StoredRun(info, ms)

    with ResultStore(tmp_path / "r.sqlite") as st:
        st.save(run("gpu", "NVIDIA H100 80GB HBM3"))
        st.save(run("cpu-interpreter", "cpu"))
    times = measured_from_store(tmp_path / "r.sqlite", "1")
    assert times == {("rms_norm", "llama3-8b_hidden", "fwd", "bf16", "h100"): 250.0}
    point = next(p for p in roofline("h100", ["rms_norm"], measured=times).points
                 if p.case == "llama3-8b_hidden" and p.mode == "fwd")
    assert point.measured_us == 250.0
    assert point.pct_of_roof == pytest.approx(point.attainable_us / 250.0 * 100)
    with pytest.raises(RequestError, match="not timed on a GPU"):
        measured_from_store(tmp_path / "r.sqlite", "latest")
