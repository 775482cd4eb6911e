"""Where a run came from: git revision and dirty flag, device, driver, versions, host, date."""

from __future__ import annotations

import subprocess
from datetime import datetime, timezone
from pathlib import Path

import wavefront
from wavefront import runtime
from wavefront.workbench.bench.records import RunInfo


def source_root() -> Path:
    """The checkout this wavefront was imported from (src/wavefront -> the repository root)."""
    return Path(wavefront.__file__).resolve().parents[2]


def git_revision(path: str | Path | None = None) -> tuple[str | None, bool | None]:
    """(commit sha, whether tracked files differ from it) of the repository at `path`; (None, None)
    outside a git checkout or without git."""
    cwd = Path(path) if path is not None else source_root()
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=30)
        if sha.returncode != 0:
            return None, None
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                                capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None, None
    return sha.stdout.strip(), bool(status.stdout.strip()) if status.returncode == 0 else None


def utc_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def collect_run_info(device, *, label: str = "", timing: str, device_model: str | None = None) -> RunInfo:
    """Provenance of a run on `device` (a torch device or its name)."""
    info = runtime.describe(device)
    sha, dirty = git_revision()
    return RunInfo(created_utc=utc_now(), label=label, git_sha=sha, git_dirty=dirty,
                   device_name=info["device_name"], arch=info["arch"], backend=info["backend"],
                   torch=info["torch"], triton=info["triton"], python=info["python"], host=info["host"],
                   timing=timing, driver=info.get("driver"), device_model=device_model)
