"""A/B statistics on synthetic samples: calibration targets, noise levels, heavy tails, the U test."""

from __future__ import annotations

import numpy as np
import pytest

from wavefront.workbench.bench.calibration import Scenario, calibrate, synthetic_samples
from wavefront.workbench.stats import bootstrap_ratio_ci, compare, mann_whitney_u

TRIALS = 200


def _rates(*scenarios: Scenario):
    return {r.scenario.name: r for r in calibrate(scenarios, trials=TRIALS, seed=7)}


@pytest.mark.parametrize("noise", [0.01, 0.02, 0.03])
def test_aa_is_same_at_least_95_percent_at_realistic_noise(noise):
    r = _rates(Scenario("aa", 1.0, noise))["aa"]
    assert r.same >= 0.95, r
    assert r.slower + r.faster <= 0.03, r  # false alarms stay near alpha = 1%


def test_aa_with_heavy_tail_is_still_same():
    r = _rates(Scenario("aa-tail", 1.0, 0.02, tail_frac=0.10))["aa-tail"]
    assert r.same >= 0.95, r


@pytest.mark.parametrize("noise", [0.01, 0.02, 0.03])
def test_planted_5_percent_slowdown_is_slower(noise):
    r = _rates(Scenario("slow", 1.05, noise))["slow"]
    assert r.slower >= 0.95, r
    assert r.faster == 0.0 and r.same <= 0.01, r


def test_planted_slowdown_with_heavy_tail_is_slower():
    r = _rates(Scenario("slow-tail", 1.05, 0.02, tail_frac=0.10))["slow-tail"]
    assert r.slower >= 0.95, r


def test_planted_speedup_is_faster():
    r = _rates(Scenario("fast", 1 / 1.05, 0.02))["fast"]
    assert r.faster >= 0.95 and r.slower == 0.0, r


def test_high_noise_is_not_called_same_when_slower():
    # At 5% noise a 5% slowdown is hard to see; the verdict may be unknown, but must rarely be "same"
    # (the margin sits exactly at the effect) and never "faster".
    r = _rates(Scenario("slow-noisy", 1.05, 0.05))["slow-noisy"]
    assert r.faster == 0.0
    assert r.slower >= 0.6, r
    assert r.same <= 0.10, r


def test_heavy_tail_median_is_robust_where_mean_is_not():
    rng = np.random.default_rng(3)
    a = synthetic_samples(rng, 40, 100.0, 0.01)
    b = synthetic_samples(rng, 40, 100.0, 0.01)
    b[:4] *= 50.0  # four repetitions preempted
    c = compare(a, b)
    assert c.verdict == "same", c
    assert abs(c.ratio - 1.0) < 0.02
    assert b.mean() / a.mean() > 3.0  # what a mean-based comparison would have reported


def test_too_few_samples_is_unknown():
    c = compare([1.0, 1.1, 1.0], [2.0, 2.1, 2.2])
    assert c.verdict == "unknown" and c.n_a == 3


def test_bad_input_is_rejected():
    with pytest.raises(ValueError, match="finite and positive"):
        compare([1.0] * 10, [1.0] * 9 + [0.0])
    with pytest.raises(ValueError, match="1-D"):
        compare(np.ones((2, 5)), np.ones(10))


def test_speedup_is_inverse_of_ratio():
    a = np.full(20, 2.0) * np.linspace(0.99, 1.01, 20)
    b = a / 2.0
    c = compare(a, b)
    assert c.verdict == "faster"
    assert c.speedup == pytest.approx(2.0, rel=1e-9)
    lo, hi = bootstrap_ratio_ci(a, b)
    assert lo <= c.ratio <= hi


def test_mann_whitney_against_hand_computed_values():
    # No overlap, 5 vs 5: U = 0; z = (12.5 - 0.5) / sqrt(25 * 11 / 12) = 2.5067, p = 0.01219.
    u, p = mann_whitney_u([1, 2, 3, 4, 5], [6, 7, 8, 9, 10])
    assert u == 0.0
    assert p == pytest.approx(0.012186, abs=2e-5)
    # Identical samples: no evidence at all.
    assert mann_whitney_u([1, 1, 1], [1, 1, 1])[1] == 1.0


def test_mann_whitney_matches_scipy():
    scipy_stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(11)
    a, b = rng.normal(0, 1, 25).round(1), rng.normal(0.4, 1, 31).round(1)  # rounding makes ties
    u, p = mann_whitney_u(a, b)
    ref = scipy_stats.mannwhitneyu(a, b, alternative="two-sided", method="asymptotic", use_continuity=True)
    assert u == pytest.approx(ref.statistic)
    assert p == pytest.approx(ref.pvalue, rel=1e-9)
