"""The runtime layer: backend detection, per-arch limits, and no import-time side effects."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from wavefront import runtime


def test_backend_on_this_machine_matches_the_interpreter_setting():
    if torch.cuda.is_available():
        assert runtime.backend() in ("cuda", "hip")
    else:
        assert runtime.backend() == ("cpu-interpreter" if runtime.interpreting() else "cpu-reference")
    assert runtime.uses_triton("cpu") == runtime.interpreting()


def test_reference_backend_without_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert runtime.backend("cpu") == "cpu-reference"
    assert not runtime.uses_triton(torch.device("cpu"))


def test_describe_reports_what_is_in_use():
    info = runtime.describe()
    for key in ("backend", "arch", "warp_size", "max_num_warps", "torch", "triton", "device_name"):
        assert key in info
    assert info["warp_size"] in (32, 64)


def test_lane_widths_and_warp_clamps_per_arch():
    assert runtime.get_arch("sm_90").warp_size == 32
    assert runtime.get_arch("gfx942").warp_size == 64
    assert runtime.get_arch("gfx1100").warp_size == 32
    # 1024 threads per block: 32 warps of 32 lanes, but only 16 wavefronts of 64.
    assert runtime.clamp_num_warps(32, runtime.get_arch("sm_90")) == 32
    assert runtime.clamp_num_warps(32, runtime.get_arch("gfx942")) == 16
    assert runtime.clamp_num_warps(8, runtime.get_arch("gfx90a")) == 8
    with pytest.raises(ValueError, match="num_warps"):
        runtime.clamp_num_warps(0, runtime.get_arch("sm_80"))


def test_unknown_arch_lists_the_known_ones():
    with pytest.raises(ValueError, match="sm_90"):
        runtime.get_arch("sm_75")


def test_importing_wavefront_imports_neither_torch_nor_triton():
    code = "import sys, wavefront; print('torch' in sys.modules, 'triton' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_importing_ops_does_not_import_triton():
    code = "import sys, wavefront.ops, wavefront.nn; print('triton' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_reference_fallback_warns_once_per_process_naming_the_fix():
    # Issue #13: the README's snippet silently ran the reference on CPU. A fresh process without the
    # interpreter: two ops, one warning, which names TRITON_INTERPRET=1; the results are still right.
    script = (
        "import os, warnings\n"
        "os.environ.pop('TRITON_INTERPRET', None)\n"
        "import torch, wavefront.ops as ops\n"
        "from wavefront.runtime import ReferenceFallbackWarning\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    x, w = torch.randn(3, 8), torch.randn(8)\n"
        "    y = ops.rms_norm(x, w)\n"
        "    ops.softmax(x)\n"
        "assert torch.allclose(y, torch.nn.functional.rms_norm(x, (8,), w, 1e-6))\n"
        "hits = [str(c.message) for c in caught if issubclass(c.category, ReferenceFallbackWarning)]\n"
        "print(len(hits)); print(hits[0])\n"
    )
    env = {k: v for k, v in __import__("os").environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    count, message = res.stdout.strip().splitlines()[:2]
    assert count == "1"
    assert "TRITON_INTERPRET=1" in message and "before importing wavefront" in message


def test_triton_outside_the_tested_range_is_named():
    assert runtime.triton_version_problem("3.9.0") is None
    assert runtime.triton_version_problem("3.3.1+git1234") is None
    for version in ("3.10.0", "4.0.0", "3.2.0"):
        problem = runtime.triton_version_problem(version)
        assert problem is not None and f"Triton {version} is outside the tested range >=3.3,<3.10" in problem
    assert "cannot read the Triton version" in runtime.triton_version_problem("nightly")
