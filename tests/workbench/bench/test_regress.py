"""The dynamic gate: exit codes for a planted slowdown, noise, memory growth, errors and missing cases."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from wavefront.workbench.bench.records import Measurement, RunInfo, StoredRun
from wavefront.workbench.bench.regress import dynamic_gate, is_regression, noise_band


def _samples(median, noise, seed, n=30):
    return list(median * np.exp(np.random.default_rng(seed).normal(0, noise, n)))


def run_of(cases: dict[str, tuple[float, float, int | None]], seed: int, device="NVIDIA H100 80GB HBM3",
           timing="gpu") -> StoredRun:
    """cases: name -> (median us, noise, peak memory)."""
    info = RunInfo("2026-01-01T00:00:00Z", "", "b" * 40, False, device, "sm_90", "cuda", "2.13", "3.9", "3.11", "h",
                   timing)
    ms = []
    for i, (name, (med, noise, mem)) in enumerate(cases.items()):
        for provider in ("wavefront", "eager"):
            ms.append(Measurement("op", name, "fwd", "bf16", provider, "ok", samples_us=_samples(med, noise, seed + i),
                                  peak_mem_bytes=mem))
    return StoredRun(info, ms)


BASE = {"a": (100.0, 0.02, 1000), "b": (50.0, 0.02, 2000), "c": (200.0, 0.01, None)}


def test_same_performance_passes():
    rep = dynamic_gate(run_of(BASE, 0), run_of(BASE, 100))
    assert rep.passed and rep.exit_code == 0, rep.markdown()
    assert {r.status for r in rep.rows} == {"ok"}
    assert "PASSED" in rep.markdown()


def test_planted_slowdown_fails_with_summary():
    cur = dict(BASE, b=(50.0 * 1.10, 0.02, 2000))
    rep = dynamic_gate(run_of(BASE, 0), run_of(cur, 100))
    assert rep.exit_code == 1
    assert [r.case for r in rep.failures] == ["b"]
    assert rep.failures[0].status == "slower" and rep.failures[0].ratio == pytest.approx(1.10, abs=0.03)
    md = rep.markdown()
    assert "FAILED (1 case(s))" in md and "op/b/fwd/bf16/wavefront" in md and "**slower**" in md


def test_slowdown_inside_noise_band_passes():
    noisy = {"a": (100.0, 0.12, None)}
    cur = {"a": (107.0, 0.12, None)}  # 7% slower than the threshold but well inside +-15% noise
    base_run, cur_run = run_of(noisy, 0), run_of(cur, 100)
    band = noise_band(base_run.measurements[0].samples_us)
    assert band > 0.07
    rep = dynamic_gate(base_run, cur_run)
    assert rep.passed, rep.markdown()


def test_slowdown_below_threshold_passes_even_if_significant():
    cur = dict(BASE, c=(200.0 * 1.03, 0.01, None))
    regressed, cmp, ratio, _ = is_regression(run_of(BASE, 0).measurements[4].samples_us,
                                             run_of(cur, 100).measurements[4].samples_us)
    assert cmp.verdict == "slower" and not regressed and ratio < 1.05
    assert dynamic_gate(run_of(BASE, 0), run_of(cur, 100)).passed


def test_memory_growth_fails():
    cur = dict(BASE, a=(100.0, 0.02, 1100))
    rep = dynamic_gate(run_of(BASE, 0), run_of(cur, 100))
    assert rep.exit_code == 1
    assert rep.failures[0].status == "memory" and "peak memory +10.0%" in rep.failures[0].why


def test_error_and_missing_fail_unless_allowed():
    base = run_of(BASE, 0)
    cur = run_of(BASE, 100)
    broken = copy.deepcopy(cur)
    broken.measurements[0].status, broken.measurements[0].reason, broken.measurements[0].samples_us = \
        "error", "RuntimeError: boom", []
    rep = dynamic_gate(base, broken)
    assert [r.status for r in rep.failures] == ["error"] and "boom" in rep.failures[0].why
    partial = copy.deepcopy(cur)
    partial.measurements = [m for m in partial.measurements if m.case != "c"]
    assert dynamic_gate(base, partial).exit_code == 1
    assert dynamic_gate(base, partial, allow_missing=True).exit_code == 0


def test_only_wavefront_is_gated_by_default():
    cur = run_of(BASE, 100)
    for m in cur.measurements:
        if m.provider == "eager":
            m.samples_us = [s * 1.5 for s in m.samples_us]
    assert dynamic_gate(run_of(BASE, 0), cur).passed
    assert not dynamic_gate(run_of(BASE, 0), cur, providers=None).passed


def test_runs_on_different_devices_are_refused():
    with pytest.raises(ValueError, match="comparable only on one device"):
        dynamic_gate(run_of(BASE, 0), run_of(BASE, 1, device="AMD Instinct MI300X"))


def test_as_dict_is_complete():
    d = dynamic_gate(run_of(BASE, 0), run_of(BASE, 100)).as_dict()
    assert d["passed"] is True and d["exit_code"] == 0 and len(d["rows"]) == 3 and d["counts"] == {"ok": 3}


def test_gate_runs_reads_files_and_store(tmp_path):
    from wavefront.workbench.bench.regress import gate_runs
    from wavefront.workbench.bench.store import ResultStore, write_document

    with ResultStore(tmp_path / "r.sqlite") as st:
        st.save(run_of(BASE, 0))
        baseline_file = write_document(st, tmp_path / "baseline.json")
        st.save(run_of(dict(BASE, a=(120.0, 0.02, 1000)), 100))
    rep = gate_runs(str(baseline_file), "latest", store_path=str(tmp_path / "r.sqlite"))
    assert rep.exit_code == 1 and [r.case for r in rep.failures] == ["a"]
    assert gate_runs(str(baseline_file), "1", store_path=str(tmp_path / "r.sqlite")).passed


def test_gate_cli_perf_half_and_both_halves(tmp_path):
    """`wavefront gate --baseline PERF` fails with one line per slowed case; an A/A run passes; a static
    baseline given beside it is routed to the static half (fed canned inspect/traffic documents here)."""
    import json
    import subprocess
    import sys

    from wavefront.workbench.bench.store import ResultStore, write_document

    with ResultStore(tmp_path / "r.sqlite") as st:
        st.save(run_of(BASE, 0))
        base_file = write_document(st, tmp_path / "perf-baseline.json")
        st.save(run_of(dict(BASE, b=(60.0, 0.02, 2000)), 100))

    def gate(*args):
        return subprocess.run([sys.executable, "-m", "wavefront", "gate", *args, "--store", str(tmp_path / "r.sqlite")],
                              capture_output=True, text=True, timeout=120)

    slow = gate("--baseline", str(base_file), "--current", "latest", "--markdown", str(tmp_path / "gate.md"))
    assert slow.returncode == 1, slow.stderr
    assert "REGRESSION perf: op/b/fwd/bf16/wavefront" in slow.stderr
    assert "op/a/" not in slow.stderr and "Traceback" not in slow.stderr
    assert "Dynamic perf gate: FAILED" in (tmp_path / "gate.md").read_text()
    same = gate("--baseline", str(base_file), "--current", "1")
    assert same.returncode == 0, same.stderr

    rows = [{"key": "k", "op": "op", "target": "sm_90", "spill_bytes": 0}]
    (tmp_path / "inspect.json").write_text(json.dumps({"rows": rows}))
    (tmp_path / "traffic.json").write_text(json.dumps({"rows": []}))
    (tmp_path / "static.json").write_text(json.dumps({"schema": "wavefront.gate.static-baseline/1",
                                                      "inspect": {}, "traffic": {}}))
    both = gate("--baseline", str(tmp_path / "static.json"), "--baseline", str(base_file), "--current", "latest",
                "--inspect", str(tmp_path / "inspect.json"), "--traffic", str(tmp_path / "traffic.json"),
                "--json", str(tmp_path / "gate.json"))
    doc = json.loads((tmp_path / "gate.json").read_text())
    assert [h["name"] for h in doc["halves"]] == ["static", "perf"]
    assert both.returncode == 1 and doc["passed"] is False
    assert doc["halves"][0]["passed"] is True and doc["halves"][1]["passed"] is False
