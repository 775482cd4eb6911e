"""`wavefront bench` (correctness part) end to end through the CLI, with its JSON document."""

from __future__ import annotations

import json
import subprocess
import sys


def _run(*args):
    return subprocess.run([sys.executable, "-m", "wavefront", *args], capture_output=True, text=True, timeout=300)


def test_bench_json_document_for_one_op(tmp_path):
    out = tmp_path / "bench.json"
    proc = _run("bench", "--op", "softmax", "--dtype", "bf16", "--no-store", "--no-report", "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["schema"] == "wavefront.bench/1"
    assert doc["n_failed"] == 0 and doc["n_cases"] == len(doc["results"]) > 5
    first = doc["results"][0]
    assert first["op"] == "softmax" and first["dtype"] == "bf16" and first["passed"] is True
    assert {c["mode"] for c in first["checks"]} == {"fwd", "bwd"}
    assert "correctness vs float64 reference" in proc.stdout


def test_unknown_op_is_one_clear_line():
    proc = _run("bench", "--op", "nope")
    assert proc.returncode == 2
    assert "unknown op 'nope'" in proc.stderr
    assert "Traceback" not in proc.stderr
