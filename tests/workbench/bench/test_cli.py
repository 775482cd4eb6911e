"""The verbs end to end on CPU: bench (store + report + JSON), report, compare, bisect, and their errors."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def in_process(*args, cwd, monkeypatch):
    """The verb through typer's test runner, in this process (no torch import per call)."""
    from typer.testing import CliRunner

    from wavefront.cli import build_app

    monkeypatch.chdir(cwd)
    return CliRunner().invoke(build_app(), list(args))


def wavefront(*args, cwd, columns: int = 160):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), COLUMNS=str(columns))
    return subprocess.run([sys.executable, "-m", "wavefront", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


def test_bench_stores_reports_and_writes_json(tmp_path, monkeypatch):
    p = wavefront("bench", "--op", "softmax", "--dtype", "fp32", "--case", "npow2", "--cpu-timing", "--reps", "3",
                  "--warmup", "1", "--provider", "wavefront", "--provider", "eager", "--json", "out.json",
                  "--inspect-targets", "none", "--no-traffic",
                  cwd=tmp_path, columns=120)
    assert p.returncode == 0, p.stderr + p.stdout
    # The summary states findings; every line (the plan's, the summary's) wraps at a word, never past the width.
    assert "CPU interpreter" in p.stdout and "roofline (modeled on NVIDIA H100 SXM)" in p.stdout
    assert "correctness: 1/1 correct against the float64 reference" in " ".join(p.stdout.split())
    assert max(len(line) for line in (p.stdout + p.stderr).splitlines()) <= 120, p.stderr + p.stdout
    doc = json.loads((tmp_path / "out.json").read_text())
    assert doc["schema"] == "wavefront.bench/1" and doc["n_failed"] == 0 and doc["n_cases"] > 0
    assert doc["run"]["info"]["timing"] == "cpu-interpreter"
    assert {m["provider"] for m in doc["run"]["measurements"]} == {"wavefront", "eager"}
    assert all(m["n_reps"] == 3 for m in doc["run"]["measurements"] if m["status"] == "ok")
    assert doc["modeled"] and all(p["device"] == "h100" for p in doc["modeled"])
    assert (tmp_path / "wavefront-results.sqlite").exists()
    assert (tmp_path / doc["report"]).stat().st_size > 1_000_000

    r = in_process("report", "--export-csv", "m.csv", "--json", "-", cwd=tmp_path, monkeypatch=monkeypatch)
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["n_runs"] == 1 and (tmp_path / "m.csv").exists()

    c = in_process("compare", "latest", "1", "--json", "-", cwd=tmp_path, monkeypatch=monkeypatch)
    assert c.exit_code == 0, c.output
    cdoc = json.loads(c.stdout)
    assert cdoc["schema"] == "wavefront.compare/1" and len(cdoc["cases"]) == 6
    assert "CPU interpreter: not a performance figure" in cdoc["notes"]


@pytest.mark.parametrize(("args", "message"), [
    (("bench", "--op", "nope"), "--op: unknown op 'nope'"),
    (("bench", "--mode", "up"), "'up' is not one of 'fwd', 'bwd', 'fwd_bwd'"),
    (("bench", "--device-model", "tpu"), "--device-model: unknown GPU 'tpu'"),
    (("compare", "1", "2", "--store", "absent.sqlite"), "no results store at absent.sqlite"),
    (("compare",), "give two runs"),
    (("bisect", "--good", "a", "--bad", "b"), "give exactly one of --op NAME or --command CMD"),
    (("report", "--device", "tpu"), "--device: unknown GPU 'tpu'"),
])
def test_errors_are_one_clear_line(tmp_path, monkeypatch, args, message):
    r = in_process(*args, cwd=tmp_path, monkeypatch=monkeypatch)
    assert r.exit_code == 2, r.output
    text = " ".join(r.stderr.split())  # rich wraps at the terminal width; the message itself is one line
    assert message in text and "Traceback" not in text
    assert text.startswith("error:") and text.count("error:") == 1


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_bisect_verb_with_a_command(tmp_path, monkeypatch, make_repo):
    repo = make_repo(n_commits=5, first_slow=3)
    r = in_process("bisect", "--good", "HEAD~4", "--bad", "HEAD", "--command", "python measure.py", "--repo",
                   str(repo), "--json", "-", cwd=tmp_path, monkeypatch=monkeypatch)
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["schema"] == "wavefront.bisect/1" and doc["found"] and doc["subject"] == "commit 3"


def test_findings_state_what_the_static_sections_found():
    from wavefront.workbench.jobs.bench import finding

    rows = [{"ok": True, "spills": False, "widest_load_bits": 128, "widest_store_bits": 128},
            {"ok": True, "spills": True, "widest_load_bits": 0, "widest_store_bits": 32},
            {"ok": False, "spills": False, "widest_load_bits": 0, "widest_store_bits": 0}]
    assert finding("inspect", {"targets": ["sm_90", "gfx942"], "rows": rows}) == (
        "3 kernel x target x case rows compiled for sm_90, gfx942: 1 failed, 1 spill, 1 with a global access under "
        "128 bits (or none: TMA)")
    traffic = [{"op": "a", "mode": "fwd", "ratio_min": 1.004, "error": None},
               {"op": "b", "mode": "bwd", "ratio_min": 2.5, "error": None},
               {"op": "c", "mode": "fwd", "ratio_min": None, "error": "ValueError: x"}]
    assert finding("traffic", {"rows": traffic}) == (
        "3 op x mode x case rows counted: 1 within 1% of the minimum bytes, 1 above, 1 failed (most: b bwd 2.5x)")
