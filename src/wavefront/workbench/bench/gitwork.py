"""Git plumbing for benchmarking other revisions: temporary worktrees and the portable probe package."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

PROBE_FILES = ("probe.py", "timer.py", "runnable.py")
PROBE_PACKAGE = "wfprobe"


class GitError(RuntimeError):
    pass


def git(repo: str | Path, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    try:
        proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise GitError("git is not installed") from None
    if check and proc.returncode != 0:
        raise GitError(f"git {' '.join(args)} failed: {(proc.stderr or proc.stdout).strip().splitlines()[-1:]}")
    return proc


def rev_parse(repo: str | Path, rev: str) -> str:
    """The full sha of `rev` in `repo`; a clear error when it does not name a commit."""
    proc = git(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}", check=False)
    if proc.returncode != 0:
        raise GitError(f"{rev!r} is not a commit in {repo}")
    return proc.stdout.strip()


def subject(repo: str | Path, rev: str) -> str:
    return git(repo, "log", "-1", "--format=%s", rev).stdout.strip()


@contextlib.contextmanager
def temp_worktree(repo: str | Path, rev: str, dest: Path) -> Iterator[Path]:
    """A detached worktree of `rev` at `dest`, removed afterwards (the user's checkout is untouched)."""
    git(repo, "worktree", "add", "--detach", "--force", str(dest), rev)
    try:
        yield dest
    finally:
        git(repo, "worktree", "remove", "--force", str(dest), check=False)


def install_probe(dest_dir: Path) -> Path:
    """Copy the probe and its two siblings into `dest_dir`/wfprobe; returns `dest_dir` (for PYTHONPATH)."""
    here = Path(__file__).parent
    pkg = dest_dir / PROBE_PACKAGE
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text('"""Copied from wavefront.workbench.bench to time other revisions."""\n')
    for name in PROBE_FILES:
        shutil.copy2(here / name, pkg / name)
    return dest_dir
