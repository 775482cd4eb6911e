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
