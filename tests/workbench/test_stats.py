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


def _exact_two_sided_p(a, b) -> float:
    """Exact permutation p-value of U by enumerating every split of the pooled sample: twice the smaller
    tail (the two-sided convention of scipy and of most tables)."""
    from itertools import combinations

    pooled = np.concatenate([a, b])
    n1, n = len(a), len(a) + len(b)

    def u_of(x, y):
        return sum((xi > yj) + 0.5 * (xi == yj) for xi in x for yj in y)

    observed = u_of(a, b)
    us = [u_of(pooled[list(idx)], pooled[[i for i in range(n) if i not in idx]]) for idx in combinations(range(n), n1)]
    below = sum(u <= observed + 1e-12 for u in us) / len(us)
    above = sum(u >= observed - 1e-12 for u in us) / len(us)
    return min(1.0, 2 * min(below, above))


def test_mann_whitney_small_samples_are_exact():
    # No overlap, 5 vs 5: U = 0, and only 2 of the C(10, 5) = 252 splits are that extreme: p = 2/252.
    # (The normal approximation said 0.0122, above alpha = 0.01: the case this change is for.)
    u, p = mann_whitney_u([1, 2, 3, 4, 5], [6, 7, 8, 9, 10])
    assert u == 0.0
    assert p == pytest.approx(2 / 252, rel=1e-12)
    assert compare([1.0, 1.01, 1.02, 1.03, 1.04], [2.0, 2.01, 2.02, 2.03, 2.04]).verdict == "slower"
    # Identical samples: no evidence at all.
    assert mann_whitney_u([1, 1, 1], [1, 1, 1])[1] == 1.0


@pytest.mark.parametrize("ties", [False, True], ids=["distinct", "ties"])
def test_mann_whitney_small_samples_match_enumeration(ties):
    rng = np.random.default_rng(5)
    a, b = rng.normal(0, 1, 4), rng.normal(1, 1, 6)
    if ties:
        a, b = a.round(0), b.round(0)  # a permutation test: 210 splits, fewer than the resamples, so exact
    u, p = mann_whitney_u(a, b)
    assert u == pytest.approx(sum((x > y) + 0.5 * (x == y) for x in a for y in b))
    assert p == pytest.approx(_exact_two_sided_p(a, b), rel=1e-9)


def test_mann_whitney_large_samples_use_the_tie_corrected_normal_approximation():
    rng = np.random.default_rng(11)
    a, b = rng.normal(0, 1, 25).round(1), rng.normal(0.4, 1, 31).round(1)  # rounding makes ties
    u, p = mann_whitney_u(a, b)
    pooled = np.concatenate([a, b])
    n1, n2, n = len(a), len(b), len(a) + len(b)
    _, counts = np.unique(pooled, return_counts=True)
    var = n1 * n2 / 12.0 * ((n + 1) - (counts**3 - counts).sum() / (n * (n - 1)))
    z = (abs(u - n1 * n2 / 2.0) - 0.5) / np.sqrt(var)
    from math import erfc, sqrt

    assert p == pytest.approx(erfc(z / sqrt(2.0)), rel=1e-9)
