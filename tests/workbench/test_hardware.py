"""The device table and the per-arch limits behind occupancy."""

from __future__ import annotations

import pytest

from wavefront import runtime
from wavefront.workbench import hardware as hw

REQUIRED = ("a100", "h100", "h200", "b200", "mi300x", "mi325x", "mi250x")


def test_required_devices_are_present_with_sources():
    for key in REQUIRED:
        g = hw.GPUS[key]
        assert g.source.strip(), key
        assert g.arch in runtime.ARCHS, key
        assert g.sm_count > 0 and g.hbm_tbps > 0 and g.hbm_gb > 0 and g.tdp_w > 0, key
        assert g.l2_mb > 0 and g.scaleup_gbps_per_dir > 0, key


def test_dense_peaks_not_sparse():
    # The sparse headline of an H100 SXM is 1979 TFLOPS BF16; the table must hold the dense half.
    assert hw.get_gpu("h100").bf16_tflops == pytest.approx(989.4, rel=1e-3)
    # Dense matrix peaks are at most a few times the vector FP32 peak on every part but NVIDIA's, where
    # tensor cores give ~15-30x; sparse figures would double that. Check the ratio stays in range.
    for g in hw.GPUS.values():
        ratio = g.bf16_tflops / g.fp32_tflops
        assert 1.5 <= ratio <= 32, (g.key, ratio)  # GB200: 2,500 / 80 = 31.25 (NVL72 table); sparse would be 62
        if g.fp8_tflops is not None:
            assert g.fp8_tflops == pytest.approx(2 * g.bf16_tflops, rel=0.01), g.key


def test_ridge_points_match_the_facts_file():
    # ../shared/facts/devices.md: ridge BF16 = dense BF16 / HBM bandwidth.
    for key, ridge in (("a100", 153), ("h100", 295), ("h200", 206), ("b200", 281), ("mi300x", 247), ("mi325x", 218)):
        assert hw.get_gpu(key).ridge_bf16 == pytest.approx(ridge, abs=1.5), key


def test_unknown_gpu_lists_the_known_ones():
    with pytest.raises(ValueError, match="unknown GPU 'v100'.*a100.*h100"):
        hw.get_gpu("v100")
    with pytest.raises(ValueError, match="not in the device table"):
        hw.gpu_from_device_name("NVIDIA GeForce RTX 4090")


@pytest.mark.parametrize(("reported", "key"), [
    ("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H200", "h200"), ("NVIDIA A100-SXM4-80GB", "a100"),
    ("AMD Instinct MI300X", "mi300x"), ("AMD Instinct MI250X/MI250", "mi250x-gcd"), ("NVIDIA B200", "b200"),
    ("AMD Radeon PRO W7900", "w7900"),
])
def test_device_names_map_to_rows(reported, key):
    assert hw.gpu_from_device_name(reported).key == key


def test_every_default_target_has_a_device_and_limits():
    for target in runtime.DEFAULT_TARGETS:
        g = hw.gpu_for_target(target)
        assert g.arch == target
        limits = g.limits
        assert limits.name == target and limits.regs_per_sm > 0 and limits.shared_mem_per_sm > 0
    with pytest.raises(ValueError, match="no device in the table for target 'sm_75'"):
        hw.gpu_for_target("sm_75")


def test_arch_limits_are_consistent():
    for name, a in runtime.ARCHS.items():
        assert a.shared_mem_per_block <= a.shared_mem_per_sm, name
        assert a.max_threads_per_block % a.warp_size == 0, name
        assert a.max_warps_per_sm >= 1 and a.reg_alloc_unit >= 1, name
    assert runtime.ARCHS["gfx942"].warp_size == 64 and runtime.ARCHS["gfx1100"].warp_size == 32
    assert runtime.ARCHS["gfx942"].max_num_warps == 16 and runtime.ARCHS["sm_90"].max_num_warps == 32


def test_assume_target_is_scoped():
    before = runtime.arch("cpu").name
    with runtime.assume_target("gfx942", 304):
        assert runtime.arch("cpu").name == "gfx942"
        assert runtime.sm_count("cpu") == 304
    assert runtime.arch("cpu").name == before
    with pytest.raises(ValueError, match="unknown architecture 'gfx9000'"), runtime.assume_target("gfx9000", 1):
        pass
