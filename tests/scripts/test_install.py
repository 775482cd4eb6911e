"""scripts/install.sh stays CPU-only on a machine without a GPU, whatever pip would resolve.

The script is run in --plan mode with PYTHON pointing at a stand-in interpreter that answers the three
questions the script asks (is torch importable, where does the CPU index answer, what would pip install)
and delegates everything else to the real interpreter.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

if shutil.which("nvidia-smi") or os.path.exists("/dev/kfd"):
    pytest.skip("the CPU-only install path is for machines without a GPU", allow_module_level=True)


def _fake_python(tmp_path: Path, resolved: list[str]) -> Path:
    report = tmp_path / "resolution.json"
    report.write_text(json.dumps({"install": [{"metadata": {"name": n}} for n in resolved]}))
    fake = tmp_path / "python"
    fake.write_text(f"""#!/usr/bin/env bash
if [[ "$1" == "-c" && "$2" == "import torch" ]]; then exit 1; fi
if [[ "$1 $2 $3" == "-m pip install" && " $* " == *" --dry-run "* ]]; then
  while [[ $# -gt 0 ]]; do if [[ "$1" == "--report" ]]; then cp {report} "$2"; fi; shift; done
  exit 0
fi
if [[ "$1 $2" == "-m pip" ]]; then echo "pip must not install anything in --plan mode" >&2; exit 3; fi
exec {sys.executable} "$@"
""")
    fake.chmod(0o755)
    return fake


def _plan(tmp_path: Path, resolved: list[str]) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHON=str(_fake_python(tmp_path, resolved)),
               WAVEFRONT_TORCH_CPU_INDEX="http://127.0.0.1:9/unreachable")
    return subprocess.run(["bash", str(ROOT / "scripts" / "install.sh"), "--plan"], env=env,
                          capture_output=True, text=True, timeout=60)


def test_a_resolution_that_brings_cuda_is_refused_before_anything_installs(tmp_path):
    proc = _plan(tmp_path, ["torch", "nvidia-cublas-cu12", "nvidia-cudnn-cu12", "sympy"])
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "resolves to a CUDA build" in proc.stderr
    assert "nvidia-cublas-cu12" in proc.stderr and "WAVEFRONT_TORCH_CPU_INDEX" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_cpu_resolution_is_accepted_with_a_line_per_step(tmp_path):
    proc = _plan(tmp_path, ["torch", "sympy", "filelock"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.startswith("[install")]
    assert any("CPU build (no CUDA libraries)" in line for line in lines)
    assert lines[-1].endswith("plan only: nothing installed")


def test_unknown_argument_is_a_usage_error():
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "install.sh"), "--gpu"], capture_output=True,
                          text=True, timeout=30)
    assert proc.returncode == 2 and "unknown argument '--gpu'" in proc.stderr
