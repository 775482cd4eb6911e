"""scripts/gpu_check.sh --dry-run: the plan a lent GPU would run, and its provenance file, without a GPU."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
def test_dry_run_plans_tests_and_full_bench(tmp_path):
    env = dict(os.environ, OUT=str(tmp_path), PYTHON=shutil.which("python") or "python3")
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--dry-run"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    logs = list(tmp_path.glob("bench_dryrun_*.log"))
    metas = list(tmp_path.glob("bench_dryrun_*.meta.json"))
    assert len(logs) == 1 and len(metas) == 1
    stem = str(logs[0])[: -len(".log")]
    log = logs[0].read_text()
    assert "-m pytest -q -x" in log
    assert f"-m wavefront bench --budget-s 200 --store {stem}.sqlite --report {stem}.html --json {stem}.json" in log
    assert f"--export-json {stem}.results.json" in log
    meta = json.loads(metas[0].read_text())
    assert meta["dry_run"] is True and meta["torch"] and meta["runtime"]["backend"]
    assert meta["date_utc"].endswith("Z") and "git_sha" in meta
    assert not list(tmp_path.glob("*.sqlite"))  # nothing ran


def test_unknown_argument_is_one_clear_line(tmp_path):
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--bogus"], cwd=ROOT,
                          env=dict(os.environ, OUT=str(tmp_path)), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0 and "--bogus" in proc.stderr
