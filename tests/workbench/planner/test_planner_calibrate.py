"""`wavefront plan --calibrate STORE`: kernel efficiencies measured on the target GPU, read from a results
store that the bench's own writer builds here with synthetic timings (no GPU needed to test the reader)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from wavefront.cli import build_app
from wavefront.workbench.bench.records import Measurement, RunInfo, StoredRun
from wavefront.workbench.bench.store import ResultStore
from wavefront.workbench.hardware import get_gpu
from wavefront.workbench.planner import PlanRequest, plan
from wavefront.workbench.planner.kernel_calibration import load_kernel_calibration
from wavefront.workbench.planner.kernels import attention_curve, wave_quantization

H100 = get_gpu("h100")
PEAK = H100.peak_tflops("bf16") * 1e12
GEMM, ATTN, HBM = 0.61, 0.27, 0.83  # the efficiencies the synthetic timings encode


def _run(timing: str, model: str = "h100") -> RunInfo:
    return RunInfo("2026-12-02T18:00:00Z", "synthetic", None, None, "NVIDIA H100 80GB HBM3", "sm_90", "cuda",
                   "2.9", "3.4", "3.11", "host", timing=timing, device_model=model)


def _m(op, case, mode, dims, flops, n_bytes, us, provider="wavefront", status="ok") -> Measurement:
    return Measurement(op, case, mode, "bf16", provider, status, dims=dims, samples_us=[us * 0.99, us, us * 1.01],
                       flops=flops, min_bytes=int(n_bytes))


def _gpu_measurements() -> list[Measurement]:
    m = n = k = 8192
    gemm_flops = 2.0 * m * n * k
    gemm_us = gemm_flops / (PEAK * GEMM * wave_quantization(H100, m, n)) * 1e6
    seq, hd, heads = 8192, 128, 32
    attn_flops = 3.5 * 4 * heads * seq * seq * hd / 2  # causal fwd + bwd, as the registry counts them
    attn_us = attn_flops / (PEAK * ATTN * attention_curve(seq, hd)) * 1e6
    norm_bytes = 2 * 2 * 32768 * 8192
    norm_us = norm_bytes / (H100.hbm_tbps * 1e12 * HBM) * 1e6
    return [
        _m("linear", "8192^3", "fwd", {"M": m, "N": n, "K": k}, gemm_flops, 2 * (m * k + k * n + m * n), gemm_us),
        _m("linear", "8192^3", "fwd", {"M": m, "N": n, "K": k}, gemm_flops, 2 * (m * k + k * n + m * n),
           1.5 * gemm_us, provider="eager"),  # slower: the fastest provider counts
        _m("attention", "s8k", "fwd_bwd", {"batch": 1, "heads": heads, "kv_heads": 8, "seq": seq, "head_dim": hd},
           attn_flops, 1e9, attn_us),
        _m("rms_norm", "32k x 8k", "fwd", {"n_rows": 32768, "n_cols": 8192}, 4.0 * 32768 * 8192, norm_bytes, norm_us),
        _m("softmax", "broken", "fwd", {}, 1.0, 1e6, 1.0, status="error"),  # failed measurements are ignored
    ]


@pytest.fixture
def store(tmp_path):
    path = tmp_path / "results.sqlite"
    with ResultStore(path) as s:
        s.save(StoredRun(_run("cpu-interpreter"), [_m("linear", "x", "fwd", {"M": 64, "N": 64, "K": 64}, 1, 1, 1)]))
        s.save(StoredRun(_run("gpu"), _gpu_measurements()))
        # a newer GPU run that was interrupted: left out (it is marked incomplete)
        s.add_run(_run("gpu"), status="incomplete")
    return path


def test_the_store_gives_the_efficiencies_its_timings_encode(store):
    cal = load_kernel_calibration(store, "h100")
    assert cal.run_id == 2  # the GPU run, not the CPU-interpreter one
    assert cal.gemm == pytest.approx(GEMM, rel=1e-6)
    assert cal.attention == pytest.approx(ATTN, rel=1e-6)
    assert cal.hbm == pytest.approx(HBM, rel=1e-6)
    assert cal.n_cases == {"gemm": 1, "attention": 1, "hbm": 1}


def test_plan_uses_the_measured_constants_and_says_where_each_came_from(store, tmp_path):
    calibrated = plan(PlanRequest(model="llama3-8b", gpus=("8xh100",), calibrate=str(store), top=3))
    published = plan(PlanRequest(model="llama3-8b", gpus=("8xh100",), top=3))
    doc = calibrated.as_dict()
    eff = doc["efficiency"][0]
    assert (eff["gemm"], eff["attention"], eff["hbm"]) == pytest.approx((GEMM, ATTN, HBM), rel=1e-3)
    kernels = doc["constants_from"]["kernels"]
    assert all(kernels[k].startswith("measured:") and str(store) in kernels[k] for k in ("gemm", "attention", "hbm"))
    assert kernels["fp8_gemm"].startswith("published:")
    assert doc["constants_from"]["links"]["8xh100 intra"].startswith("default")
    assert published.as_dict()["constants_from"]["kernels"]["gemm"].startswith("published:")
    assert calibrated.best.time.step_s != pytest.approx(published.best.time.step_s, rel=1e-3)
    # a command-line override still wins over the store
    over = plan(PlanRequest(model="llama3-8b", gpus=("8xh100",), calibrate=str(store), gemm_eff=0.5, top=1))
    assert over.as_dict()["efficiency"][0]["gemm"] == 0.5
    assert over.as_dict()["constants_from"]["kernels"]["gemm"] == "command line (--gemm-eff)"


def test_stores_that_cannot_calibrate_are_refused_clearly(store, tmp_path):
    cpu_only = tmp_path / "cpu.sqlite"
    with ResultStore(cpu_only) as s:
        s.save(StoredRun(_run("cpu-interpreter"), []))
    with pytest.raises(ValueError, match="no run timed on a GPU"):
        load_kernel_calibration(cpu_only, "h100")
    with pytest.raises(ValueError, match="measured on h100.*a100"):
        load_kernel_calibration(store, "a100")
    not_a_store = tmp_path / "x.sqlite"
    not_a_store.write_text("hello")
    with pytest.raises(ValueError, match="not an SQLite results store"):
        load_kernel_calibration(not_a_store, "h100")
    res = CliRunner().invoke(build_app(), ["plan", "--model", "llama3-8b", "--gpus", "8xh100", "--calibrate",
                                           str(tmp_path / "missing.sqlite")])
    assert res.exit_code == 2
    assert "--calibrate" in res.output and "Traceback" not in res.output


def test_cli_writes_the_provenance_into_the_json(store, tmp_path):
    out = tmp_path / "plan.json"
    res = CliRunner().invoke(build_app(), ["plan", "--model", "llama3-8b", "--gpus", "8xh100", "--calibrate",
                                           str(store), "--top", "1", "--json", str(out)])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert doc["constants_from"]["kernels"]["attention"].startswith("measured:")
