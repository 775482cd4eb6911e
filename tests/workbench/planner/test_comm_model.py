"""nccl-tests bandwidth conventions, the alpha-beta fit on synthetic timings, the calibration file."""

from __future__ import annotations

import json
import random

import pytest

from wavefront.workbench.planner.comm_model import (
    COLLECTIVES,
    AlphaBeta,
    Calibration,
    algbw_gbps,
    bus_factor,
    busbw_gbps,
    fit_alpha_beta,
    load_calibration,
    save_calibration,
)


@pytest.mark.parametrize(("collective", "n", "factor"), [
    ("all_reduce", 2, 1.0), ("all_reduce", 8, 1.75), ("all_reduce", 1, 0.0),
    ("all_gather", 4, 0.75), ("reduce_scatter", 8, 0.875), ("all_to_all", 2, 0.5),
    ("broadcast", 8, 1.0), ("send_recv", 2, 1.0),
])
def test_bus_factor_matches_nccl_tests(collective, n, factor):
    assert bus_factor(collective, n) == pytest.approx(factor)


def test_busbw_is_algbw_times_factor():
    # 1 GB all-reduced over 8 ranks in 10 ms: algbw 100 GB/s, busbw 175 GB/s.
    assert algbw_gbps(1e9, 0.01) == pytest.approx(100.0)
    assert busbw_gbps("all_reduce", 1e9, 0.01, 8) == pytest.approx(175.0)


def test_bus_factor_rejects_unknown_collective_and_bad_n():
    with pytest.raises(ValueError, match="collective must be one of"):
        bus_factor("allreduce", 2)
    with pytest.raises(ValueError, match="n must be >= 1"):
        bus_factor("all_reduce", 0)


@pytest.mark.parametrize("collective", COLLECTIVES)
def test_fit_recovers_exact_alpha_beta(collective):
    n, alpha_s, busbw = 8, 12e-6, 150.0
    sizes = [2 ** k for k in range(3, 31)]
    times = [alpha_s + bus_factor(collective, n) * s / (busbw * 1e9) for s in sizes]
    fit = fit_alpha_beta(collective, n, sizes, times)
    assert fit.alpha_us == pytest.approx(12.0, rel=1e-6)
    assert fit.busbw_gbps == pytest.approx(150.0, rel=1e-6)
    assert fit.max_rel_error < 1e-9
    assert fit.time_s(1 << 20) == pytest.approx(times[sizes.index(1 << 20)], rel=1e-9)


def test_fit_with_5pct_noise_stays_within_10pct():
    rng = random.Random(7)
    sizes = [2 ** k for k in range(3, 31)]
    true = [20e-6 + 1.75 * s / 200e9 for s in sizes]
    noisy = [t * (1 + rng.uniform(-0.05, 0.05)) for t in true]
    fit = fit_alpha_beta("all_reduce", 8, sizes, noisy)
    assert fit.alpha_us == pytest.approx(20.0, rel=0.1)
    assert fit.busbw_gbps == pytest.approx(200.0, rel=0.1)
    assert 0.0 < fit.max_rel_error <= 0.12


def test_fit_clamps_negative_latency_to_zero():
    # Pure bandwidth with a slightly super-linear tail would give alpha < 0 unconstrained.
    sizes = [1e3, 1e4, 1e5, 1e6]
    times = [s / 1e9 * (1 + 0.02 * i) for i, s in enumerate(sizes)]
    fit = fit_alpha_beta("broadcast", 2, sizes, times)
    assert fit.alpha_us == 0.0
    assert fit.busbw_gbps > 0


def test_fit_needs_two_sizes_and_two_ranks():
    with pytest.raises(ValueError, match="2 distinct sizes"):
        fit_alpha_beta("all_reduce", 2, [1024, 1024], [1e-5, 1.1e-5])
    with pytest.raises(ValueError, match="group_size >= 2"):
        fit_alpha_beta("all_reduce", 1, [1024, 2048], [1e-5, 2e-5])


def _calibration() -> Calibration:
    fits = [AlphaBeta("all_reduce", 2, 30.0, 5.0, 10, 8, 4096, 0.2),
            AlphaBeta("all_reduce", 8, 60.0, 4.0, 10, 8, 4096, 0.3),
            AlphaBeta("all_gather", 8, 50.0, 3.0, 10, 8, 4096, 0.1)]
    return Calibration("gloo", "cpu", 8, "intra", "2026-01-01T00:00:00+00:00", "2.13.0", fits,
                       {"send_recv": "gloo: not supported here"}, "test")


def test_calibration_roundtrip(tmp_path):
    path = tmp_path / "cal.json"
    save_calibration(_calibration(), path)
    cal = load_calibration(path)
    assert cal.domain == "intra" and cal.world_size == 8
    assert cal.fits == _calibration().fits
    assert cal.unsupported == {"send_recv": "gloo: not supported here"}
    assert cal.fit_for("all_reduce", 8).alpha_us == 60.0
    assert cal.fit_for("all_reduce", 4).group_size in (2, 8)  # nearest measured size
    assert cal.fit_for("all_reduce", 64).group_size == 8
    assert cal.fit_for("broadcast", 8) is None


@pytest.mark.parametrize(("content", "message"), [
    ("not json", "not valid JSON"),
    (json.dumps({"schema": "other/1"}), "expected an object with schema"),
    (json.dumps([1, 2]), "expected an object with schema"),
    (json.dumps({"schema": "wavefront.comm.calibration/1", "backend": "gloo", "device": "cpu", "world_size": 2,
                 "domain": "rack", "fits": []}), "domain must be one of"),
    (json.dumps({"schema": "wavefront.comm.calibration/1", "backend": "gloo", "device": "cpu", "world_size": 2,
                 "domain": "intra", "fits": [{"collective": "all_reduce"}]}), "lacks or mistypes"),
    (json.dumps({"schema": "wavefront.comm.calibration/1", "backend": "gloo", "device": "cpu", "world_size": "2",
                 "domain": "intra", "fits": []}), "world_size"),
])
def test_malformed_calibration_is_a_clear_error(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        load_calibration(path)


def test_missing_calibration_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_calibration(tmp_path / "nope.json")
