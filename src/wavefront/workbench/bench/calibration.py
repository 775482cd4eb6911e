"""Calibration of the A/B verdicts (wavefront.workbench.stats.compare) on synthetic timing samples.

A timing sample is modeled as ``median * exp(N(0, sigma))`` (multiplicative noise; sigma is about the
coefficient of variation) with a heavy right tail: a fraction ``tail_frac`` of repetitions is slowed by
a Pareto-distributed factor (preemption, clock changes, a late launch), which is what GPU event timings
look like. A scenario plants a true ratio B/A; running many independent trials gives the rate of each
verdict, which is what the calibration targets are about:

- A/A (ratio 1): "same" in at least 95% of trials, "slower"/"faster" (false alarms) rare;
- a planted 5% slowdown at realistic noise: "slower" in nearly every trial.

``wavefront compare --calibrate`` prints the table; tests/workbench/test_stats.py asserts the targets.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from wavefront.workbench.stats import compare


@dataclass(frozen=True)
class Scenario:
    name: str
    ratio: float  # true median(B) / median(A)
    noise_cv: float  # sigma of the log-normal body
    n: int = 30  # samples per side
    tail_frac: float = 0.0  # fraction of samples hit by a heavy-tail slowdown
    tail_alpha: float = 1.5  # Pareto shape of the slowdown factor (smaller: heavier)


def synthetic_samples(rng: np.random.Generator, n: int, median_us: float, noise_cv: float, tail_frac: float = 0.0,
                      tail_alpha: float = 1.5) -> np.ndarray:
    """n timing samples around `median_us`; see the module docstring."""
    x = median_us * np.exp(rng.normal(0.0, noise_cv, size=n))
    hit = rng.random(n) < tail_frac
    x[hit] *= 1.0 + rng.pareto(tail_alpha, size=int(hit.sum()))
    return x


@dataclass(frozen=True)
class CalibrationResult:
    scenario: Scenario
    trials: int
    same: float
    slower: float
    faster: float
    unknown: float


DEFAULT_SCENARIOS: tuple[Scenario, ...] = (
    Scenario("A/A, 1% noise", 1.0, 0.01),
    Scenario("A/A, 2% noise", 1.0, 0.02),
    Scenario("A/A, 3% noise", 1.0, 0.03),
    Scenario("A/A, 5% noise", 1.0, 0.05),
    Scenario("A/A, 2% noise + 10% heavy tail", 1.0, 0.02, tail_frac=0.10),
    Scenario("A/A, 2% noise + 20% heavy tail", 1.0, 0.02, tail_frac=0.20, tail_alpha=1.0),
    Scenario("5% slower, 1% noise", 1.05, 0.01),
    Scenario("5% slower, 2% noise", 1.05, 0.02),
    Scenario("5% slower, 3% noise", 1.05, 0.03),
    Scenario("5% slower, 5% noise", 1.05, 0.05),
    Scenario("5% slower, 2% noise + 10% heavy tail", 1.05, 0.02, tail_frac=0.10),
    Scenario("5% faster, 2% noise", 1 / 1.05, 0.02),
    Scenario("2% slower, 1% noise", 1.02, 0.01),
)


def calibrate(scenarios=DEFAULT_SCENARIOS, trials: int = 500, seed: int = 0,
              **compare_kwargs) -> list[CalibrationResult]:
    """Verdict rates of `compare` over `trials` independent synthetic A/B pairs per scenario."""
    if trials < 1:
        raise ValueError(f"trials must be >= 1, got {trials}")
    rng = np.random.default_rng(seed)
    out = []
    for sc in scenarios:
        counts = {"same": 0, "slower": 0, "faster": 0, "unknown": 0}
        for t in range(trials):
            a = synthetic_samples(rng, sc.n, 100.0, sc.noise_cv, sc.tail_frac, sc.tail_alpha)
            b = synthetic_samples(rng, sc.n, 100.0 * sc.ratio, sc.noise_cv, sc.tail_frac, sc.tail_alpha)
            counts[compare(a, b, seed=t, **compare_kwargs).verdict] += 1
        out.append(CalibrationResult(sc, trials, *(counts[k] / trials for k in ("same", "slower", "faster",
                                                                                "unknown"))))
    return out


def markdown_table(results: list[CalibrationResult]) -> str:
    lines = ["| scenario | n per side | trials | same | slower | faster | unknown |", "|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r.scenario.name} | {r.scenario.n} | {r.trials} | {r.same:.1%} | {r.slower:.1%} | "
                     f"{r.faster:.1%} | {r.unknown:.1%} |")
    return "\n".join(lines)
