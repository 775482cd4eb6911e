"""Comparing stored runs, and two git revisions benchmarked in one invocation (interleaved)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from wavefront.workbench.bench.compare import ProbeCase, compare_revisions, compare_runs, verdict_counts
from wavefront.workbench.bench.records import Measurement, RunInfo, StoredRun


def _run(scale: float, seed: int) -> StoredRun:
    rng = np.random.default_rng(seed)
    info = RunInfo("2026-01-01T00:00:00Z", "", None, None, "gpu", "sm_90", "cuda", "", "", "", "", "gpu")
    ms = [Measurement("op", c, "fwd", "bf16", "wavefront", "ok",
                      samples_us=list(100 * (scale if c == "slow" else 1) * np.exp(rng.normal(0, 0.01, 40))))
          for c in ("same", "slow")]
    ms.append(Measurement("op", "gone", "fwd", "bf16", "wavefront", "error", "boom"))
    return StoredRun(info, ms)


def test_compare_runs_verdicts_and_speedup_interval():
    deltas = compare_runs(_run(1.0, 0), _run(1.2, 1))
    by = {d.case: d for d in deltas}
    assert by["same"].verdict == "same"
    assert by["slow"].verdict == "slower"
    lo, hi = by["slow"].speedup_ci
    assert lo <= by["slow"].speedup <= hi < 1.0
    assert by["slow"].speedup == pytest.approx(1 / 1.2, rel=0.02)
    assert by["gone"].verdict == "unknown" and "no samples" in by["gone"].note
    assert verdict_counts(deltas) == {"faster": 0, "slower": 1, "same": 1, "unknown": 1}


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_compare_two_revisions_interleaved(tmp_path):
    """A throwaway repository holding a copy of this wavefront; revision B makes eager softmax 3x slower by
    running it three times (planted, measurable on any machine)."""
    src = Path(__file__).resolve().parents[3] / "src" / "wavefront"
    repo = tmp_path / "repo"
    shutil.copytree(src, repo / "src" / "wavefront", ignore=shutil.ignore_patterns("__pycache__"))
    git = lambda *a: subprocess.run(["git", "-C", str(repo), *a], check=True, capture_output=True)  # noqa: E731
    git("init", "-q")
    git("config", "user.email", "t@example.com")
    git("config", "user.name", "t")
    git("add", ".")
    git("commit", "-q", "-m", "A")
    ref = repo / "src" / "wavefront" / "reference.py"
    ref.write_text(ref.read_text() + "\n\n_softmax_fast = softmax\n\n\ndef softmax(x):\n"
                   "    for _ in range(2):\n        _softmax_fast(x)\n    return _softmax_fast(x)\n")
    git("commit", "-q", "-am", "B: slower eager softmax")
    cases = [ProbeCase("softmax", "rows_pow2", "fwd", "fp32", "eager"), ProbeCase("nope", "x")]
    seen = []
    a, b, deltas = compare_revisions(repo, "HEAD~1", "HEAD", cases, rounds=2, reps_per_round=10,
                                     progress=lambda i, n, s: seen.append(s))
    # interleaved, the order alternating per round
    assert [s.split()[2] for s in seen if "softmax" in s] == ["A", "B", "B", "A"]
    by = {d.op: d for d in deltas}
    assert by["softmax"].verdict == "slower", by["softmax"].comparison
    assert by["softmax"].speedup < 0.6
    assert len(a.measurements[0].samples_us) == 20 and a.info.timing == "cpu-interpreter"
    assert a.measurements[1].status == "error" and "not registered" in a.measurements[1].reason
    listed = subprocess.run(["git", "-C", str(repo), "worktree", "list"], capture_output=True, text=True).stdout
    assert len(listed.strip().splitlines()) == 1  # temporary worktrees are gone
