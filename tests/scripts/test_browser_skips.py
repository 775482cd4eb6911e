"""The dashboard's browser tests never skip silently: without headless Chromium the run names them in one
line and says how to enable them, and in CI (CI=true) their skip fails the run. scripts/install.sh --dev
brings Chromium where it can. Absence is simulated with WAVEFRONT_CHROMIUM pointing at a missing file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _pytest_browser_tests(tmp_path: Path, ci: bool) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "CI" and not k.startswith("PYTEST_")}
    env |= {"WAVEFRONT_CHROMIUM": str(tmp_path / "no-chromium"), "PYTHONPATH": str(ROOT / "src")}
    if ci:
        env["CI"] = "true"
    return subprocess.run([sys.executable, "-m", "pytest", "-n", "0", "-q", "tests/workbench/report/test_browser.py"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("ci", [False, True])
def test_a_browser_skip_is_named_in_one_line_and_fails_ci(tmp_path, ci):
    proc = _pytest_browser_tests(tmp_path, ci)
    lines = [ln for ln in proc.stdout.splitlines() if "dashboard browser tests" in ln]
    assert len(lines) == 1, proc.stdout
    assert lines[0].startswith("skipped 2 dashboard browser tests") and "scripts/install.sh --dev" in lines[0]
    assert ("in CI this is a failure" in lines[0]) == ci
    assert proc.returncode == (1 if ci else 0), proc.stdout[-2000:]


def _install_plan(env_extra: dict) -> subprocess.CompletedProcess:
    env = dict(os.environ, WAVEFRONT_TORCH_CPU_INDEX="http://127.0.0.1:9/unreachable", **env_extra)
    return subprocess.run(["bash", str(ROOT / "scripts" / "install.sh"), "--dev", "--plan"], env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(not os.access("/usr/bin/apt-get", os.X_OK) or os.geteuid() != 0,
                    reason="the install path for Chromium is apt-get as root (Debian)")
def test_install_dev_brings_chromium_where_it_can(tmp_path):
    proc = _install_plan({"WAVEFRONT_CHROMIUM": str(tmp_path / "no-chromium")})
    assert proc.returncode == 0, proc.stderr
    assert "browser tests: would install chromium and chromium-driver (apt-get)" in proc.stdout
    assert "plan only: nothing installed" in proc.stdout
