"""Bisection end to end on a throwaway git repository with a planted regressing commit."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from wavefront.workbench.bench.bisect import MeasureError, bisect, parse_samples, shell_command

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")

def _sha_of(repo, subject):
    out = subprocess.run(["git", "-C", str(repo), "log", "--format=%H %s"], capture_output=True, text=True).stdout
    return next(line.split()[0] for line in out.splitlines() if line.endswith(subject))


def test_finds_the_planted_commit(make_repo):
    repo = make_repo()
    result = bisect(repo, "HEAD~8", "HEAD", shell_command("python measure.py"))
    assert result.found, result.message
    assert result.first_bad == _sha_of(repo, "commit 6") and result.subject == "commit 6"
    assert result.baseline_median_us == pytest.approx(100, rel=0.02)
    assert result.bad_median_us == pytest.approx(130, rel=0.02)
    assert {s.verdict for s in result.steps} <= {"good", "bad"} and result.steps
    assert all((s.ratio > 1.2) == (s.verdict == "bad") for s in result.steps)
    # the user's checkout is untouched: no bisect in progress, no leftover worktree
    status = subprocess.run(["git", "-C", str(repo), "worktree", "list"], capture_output=True, text=True).stdout
    assert len(status.strip().splitlines()) == 1
    assert (repo / "measure.py").read_text().count("130.0") == 1


def test_unmeasurable_commits_are_skipped(make_repo):
    repo = make_repo(broken=(4,))
    result = bisect(repo, "HEAD~8", "HEAD", shell_command("python measure.py"))
    assert result.found and result.subject == "commit 6"


def test_no_regression_is_reported_not_bisected(make_repo):
    repo = make_repo(first_slow=100)
    result = bisect(repo, "HEAD~8", "HEAD", shell_command("python measure.py"))
    assert not result.found and "is not a regression" in result.message and result.steps == []


def test_bad_revisions_are_clear_errors(make_repo):
    repo = make_repo(n_commits=3)
    with pytest.raises(Exception, match="is not a commit"):
        bisect(repo, "nope", "HEAD", shell_command("python measure.py"))
    with pytest.raises(ValueError, match="not an ancestor"):
        bisect(repo, "HEAD", "HEAD~2", shell_command("python measure.py"))
    with pytest.raises(MeasureError, match="cannot measure the good revision"):
        bisect(repo, "HEAD~2", "HEAD", shell_command("exit 3"))


def test_parse_samples_forms():
    assert parse_samples("noise\n[1, 2.5]\n") == [1.0, 2.5]
    assert parse_samples('{"samples_us": [3, 4]}') == [3.0, 4.0]
    assert parse_samples("5 6 7") == [5.0, 6.0, 7.0]
    with pytest.raises(MeasureError, match="printed nothing"):
        parse_samples("\n")
    with pytest.raises(MeasureError, match="boom"):
        parse_samples('{"error": "boom"}')
    with pytest.raises(MeasureError, match="no positive samples"):
        parse_samples("0 1")
