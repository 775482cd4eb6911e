"""`wavefront bench` (correctness part) end to end through the CLI, with its JSON document."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def _run(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "wavefront", *args], capture_output=True, text=True, timeout=300,
                          cwd=cwd)


def test_bench_json_document_for_one_op(tmp_path):
    """The CPU main job for one op (the quick sweep: one case per dtype): correctness, then inspect (one target
    here) and traffic documents that land in the dashboard."""
    out = tmp_path / "bench.json"
    proc = _run("bench", "--op", "softmax", "--dtype", "bf16", "--no-store", "--inspect-targets", "gfx942",
                "--json", str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["schema"] == "wavefront.bench/1"
    assert doc["n_failed"] == 0 and doc["n_cases"] == len(doc["results"]) == 1 and doc["sweep"] == "quick"
    assert doc["run"]["info"]["extra"]["status"] == "complete"
    first = doc["results"][0]
    assert first["op"] == "softmax" and first["dtype"] == "bf16" and first["passed"] is True
    assert {c["mode"] for c in first["checks"]} == {"fwd", "bwd"}
    summary = " ".join(proc.stdout.split())
    assert "correctness: 1/1 correct against the float64 reference" in summary
    assert doc["findings"]["inspect"].startswith("2 kernel x target x case rows compiled for gfx942: 0 failed")
    assert f"inspect: {doc['findings']['inspect']}" in summary and f"traffic: {doc['findings']['traffic']}" in summary
    assert "quick CPU sweep" in proc.stderr and "roughly" in proc.stderr, "says up front what runs"
    docs = {name: json.loads(Path(path if Path(path).is_absolute() else tmp_path / path).read_text())
            for name, path in doc["documents"].items()}
    assert set(docs) == {"inspect", "traffic"}
    assert {r["target"] for r in docs["inspect"]["rows"]} == {"gfx942"}
    assert all(r["op"] == "softmax" for r in docs["traffic"]["rows"])
    html = (tmp_path / doc["report"]).read_text()
    assert "_softmax_fwd_kernel" in html, "the inspect table is in the dashboard"


def test_unknown_op_is_one_clear_line():
    proc = _run("bench", "--op", "nope")
    assert proc.returncode == 2
    assert "unknown op 'nope'" in proc.stderr
    assert "Traceback" not in proc.stderr
