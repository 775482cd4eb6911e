"""A/B statistics for timings: is B really faster or slower than A, and by how much?

Inputs are two samples of durations (any unit, the same for both). The effect is the ratio of medians
``ratio = median(B) / median(A)`` (a time ratio: above 1 means B is slower; the speedup of B over A is
1 / ratio). Two independent pieces of evidence are required before a difference is called:

- a percentile-bootstrap 95% confidence interval of the ratio (``scipy.stats.bootstrap``, resampling each
  side independently; the median is robust to the heavy right tail that timings have), which must
  exclude 1;
- a two-sided Mann-Whitney U test (``scipy.stats.mannwhitneyu``, rank based, no normality assumption),
  whose p-value must be below ``alpha``. With at most :data:`EXACT_MAX_N` samples on one side the p-value
  is exact (the null distribution of U, or a seeded permutation test when there are ties), which is where
  the normal approximation is weakest: at 5 vs 5 it gives 0.0122 for two samples that do not overlap at
  all, against the exact 2/252 = 0.0079; larger samples use the normal approximation with tie and
  continuity corrections.

Verdicts: ``faster`` / ``slower`` when both agree; ``same`` when the difference is not significant and
the bootstrap interval at ``equivalence_confidence`` (90%) lies inside ``1 +- equivalence``; ``unknown``
otherwise (too few samples, or an interval too wide to claim anything). Requiring both tests at
alpha = 0.01 keeps the A/A false-alarm rate near 1%.

Why "same" reads a 90% interval (a refinement made during calibration): claiming equivalence is two
one-sided tests, each at 5%, whose combined form is the 90% interval inside the margin (the TOST
convention). Reading the 95% interval instead tests each side at 2.5%; on synthetic A/A samples with 5%
noise and 30 repetitions it called about 71% of cases "same" (27% "unknown"), against about 88% with
the 90% interval; at 1-3% noise both give about 99%. The figures come from wavefront.workbench.bench.calibration
(``wavefront compare --calibrate``) and tests/workbench/test_stats.py asserts the targets.

The bootstrap is scipy's with ``method="percentile"`` rather than its default BCa: BCa's acceleration
term needs a jackknife over all n_a + n_b samples per comparison, and the percentile interval is the
one the calibration targets were set with. One bootstrap distribution gives both intervals. scipy is
imported when a test runs, not with this module: importing it (as trace.diff does) needs numpy alone.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal, cast

import numpy as np
import numpy.typing as npt

Verdict = Literal["faster", "slower", "same", "unknown"]

MIN_SAMPLES = 5
EXACT_MAX_N = 8  # scipy's own threshold for the exact U distribution
PERMUTATIONS = 9999  # permutation test for small samples with ties (exact when fewer partitions exist)


@dataclass(frozen=True)
class Comparison:
    n_a: int
    n_b: int
    median_a: float
    median_b: float
    ratio: float  # median(B) / median(A); > 1: B slower
    ci_low: float
    ci_high: float
    p_value: float
    verdict: Verdict

    @property
    def speedup(self) -> float:
        """How many times faster B is than A (median(A) / median(B))."""
        return 1.0 / self.ratio if self.ratio > 0 else math.inf

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | {"speedup": self.speedup}


def mann_whitney_u(a: npt.ArrayLike, b: npt.ArrayLike, *, seed: int = 0) -> tuple[float, float]:
    """Two-sided Mann-Whitney U test. Returns (U of sample a, p-value).

    Exact p-value when one side has at most :data:`EXACT_MAX_N` samples (a permutation test seeded by
    `seed` when there are ties), otherwise the normal approximation with the tie-corrected variance and a
    continuity correction.
    """
    from scipy import stats  # lazy: optional scipy

    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    n1, n2 = len(a), len(b)
    if n1 == 0 or n2 == 0:
        raise ValueError("mann_whitney_u needs at least one sample on each side")
    pooled = np.concatenate([a, b])
    if np.all(pooled == pooled[0]):
        return n1 * n2 / 2.0, 1.0  # no evidence at all (scipy's variance would be zero)
    method: str | stats.PermutationMethod = "auto"
    if min(n1, n2) <= EXACT_MAX_N and len(np.unique(pooled)) < n1 + n2:
        method = stats.PermutationMethod(n_resamples=PERMUTATIONS, rng=np.random.default_rng(seed))
    res = stats.mannwhitneyu(a, b, alternative="two-sided", method=method, use_continuity=True)
    return float(res.statistic), float(min(1.0, res.pvalue))


def _median_ratio(a: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
    return cast(np.ndarray, np.median(b, axis=axis) / np.median(a, axis=axis))


def _bootstrap_ratios(a: np.ndarray, b: np.ndarray, n_boot: int, seed: int) -> np.ndarray:
    """The bootstrap distribution of median(b) / median(a), each side resampled independently."""
    from scipy import stats  # lazy: optional scipy

    res = stats.bootstrap(
        (a, b),
        _median_ratio,
        n_resamples=n_boot,
        vectorized=True,
        paired=False,
        method="percentile",
        rng=np.random.default_rng(seed),
    )
    return np.asarray(res.bootstrap_distribution)


def _interval(ratios: np.ndarray, confidence: float) -> tuple[float, float]:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    tail = (1.0 - confidence) / 2.0
    lo, hi = np.quantile(ratios, [tail, 1.0 - tail])
    return float(lo), float(hi)


def bootstrap_ratio_ci(a: npt.ArrayLike, b: npt.ArrayLike, *, confidence: float = 0.95, n_boot: int = 2000,
                       seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap CI of median(b) / median(a), resampling each side independently."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    return _interval(_bootstrap_ratios(a, b, n_boot, seed), confidence)


def compare(
    a: npt.ArrayLike,
    b: npt.ArrayLike,
    *,
    alpha: float = 0.01,
    equivalence: float = 0.05,
    confidence: float = 0.95,
    equivalence_confidence: float = 0.90,
    n_boot: int = 2000,
    seed: int = 0,
) -> Comparison:
    """Compare duration samples `a` (baseline) and `b` (candidate). See the module docstring."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.ndim != 1 or b.ndim != 1:
        raise ValueError("compare expects two 1-D samples of durations")
    if np.any(~np.isfinite(a)) or np.any(~np.isfinite(b)) or np.any(a <= 0) or np.any(b <= 0):
        raise ValueError("durations must be finite and positive")
    n_a, n_b = len(a), len(b)
    med_a = float(np.median(a)) if n_a else math.nan
    med_b = float(np.median(b)) if n_b else math.nan
    if n_a < MIN_SAMPLES or n_b < MIN_SAMPLES:
        ratio = med_b / med_a if n_a and n_b else math.nan
        return Comparison(n_a, n_b, med_a, med_b, ratio, math.nan, math.nan, math.nan, "unknown")
    ratio = med_b / med_a
    ratios = _bootstrap_ratios(a, b, n_boot, seed)
    lo, hi = _interval(ratios, confidence)
    eq_lo, eq_hi = _interval(ratios, equivalence_confidence)
    _, p = mann_whitney_u(a, b, seed=seed)
    significant = p < alpha and (lo > 1.0 or hi < 1.0)
    if significant:
        verdict: Verdict = "slower" if lo > 1.0 else "faster"
    elif eq_lo >= 1.0 - equivalence and eq_hi <= 1.0 + equivalence:
        verdict = "same"
    else:
        verdict = "unknown"
    return Comparison(n_a, n_b, med_a, med_b, ratio, lo, hi, p, verdict)
