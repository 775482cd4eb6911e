"""Helpers for the bench tests: a throwaway git repository with a planted regressing commit."""

from __future__ import annotations

import subprocess

import pytest

SCRIPT = """import random
random.seed({seed})
print("building...")
print(" ".join(str({base} * (1 + random.gauss(0, 0.01))) for _ in range(30)))
"""


def _git(repo, *args):
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


@pytest.fixture
def make_repo(tmp_path):
    """make_repo(n_commits, first_slow, broken): commit i's measure.py prints 30 samples around 100 us, or
    130 us from commit `first_slow` on; commits in `broken` cannot be measured."""

    def make(n_commits=9, first_slow=6, broken=()):
        repo = tmp_path / "repo"
        repo.mkdir()
        _git(repo, "init", "-q")
        _git(repo, "config", "user.email", "t@example.com")
        _git(repo, "config", "user.name", "t")
        for i in range(1, n_commits + 1):
            text = SCRIPT.format(seed=i, base=130.0 if i >= first_slow else 100.0)
            if i in broken:
                text = "raise SystemExit('does not build')\n"
            (repo / "measure.py").write_text(text)
            _git(repo, "add", "measure.py")
            _git(repo, "commit", "-q", "-m", f"commit {i}")
        return repo

    return make
