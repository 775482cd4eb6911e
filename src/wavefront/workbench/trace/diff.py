"""Compare two traces (or two sets of rank traces) step by step, with a statistical verdict per quantity.

Samples are per step, pooled over ranks: the step time, each breakdown category, and the time of each
kernel family (events that start in the step). Each quantity is compared with
:func:`wavefront.workbench.stats.compare` (ratio of medians B/A with a bootstrap CI and a Mann-Whitney
test; verdict faster / slower / same / unknown), so one noisy step cannot flip a verdict and a
difference inside the noise is reported as such rather than as a change.

Durations must be positive for the ratio; a category that is zero in some steps (idle, exposed
communication) is compared with the Mann-Whitney test alone: ``slower``/``faster`` when it is
significant, else ``unknown`` (no ratio interval to prove equivalence); zero in every step on both
sides, or the same values on both sides, is ``same``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from wavefront.workbench import stats
from wavefront.workbench.document import encode
from wavefront.workbench.trace.analysis import TraceAnalysis
from wavefront.workbench.trace.breakdown import CATEGORIES

SCHEMA = "wavefront.trace.diff/1"


@dataclass(frozen=True)
class DiffRow:
    kind: str  # "step" | "category" | "family"
    key: str
    n_a: int
    n_b: int
    median_a_us: float
    median_b_us: float
    ratio: float | None  # median(B) / median(A): above 1, B takes longer
    ci_low: float | None
    ci_high: float | None
    p_value: float | None
    verdict: str  # faster | slower | same | unknown (B relative to A)
    note: str | None = None



@dataclass
class TraceDiff:
    SCHEMA: ClassVar[str] = SCHEMA

    rows: list[DiffRow]
    domain_a: str
    domain_b: str
    n_steps_a: int
    n_steps_b: int
    warnings: list[str] = field(default_factory=list)
    a: list[str] = field(default_factory=list)  # the trace files of A (TraceAnalysis.inputs)
    b: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """The ``wavefront.trace.diff/1`` document (docs/json/trace.md)."""
        return {"schema": SCHEMA, "domain_a": self.domain_a, "domain_b": self.domain_b, "n_steps_a": self.n_steps_a,
                "n_steps_b": self.n_steps_b, "warnings": self.warnings, "rows": encode(self.rows), "a": self.a,
                "b": self.b}


def compare_samples(kind: str, key: str, a: list[float], b: list[float], *, alpha: float = 0.01,
                    equivalence: float = 0.05) -> DiffRow:
    xa, xb = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    med_a = float(np.median(xa)) if len(xa) else math.nan
    med_b = float(np.median(xb)) if len(xb) else math.nan
    if len(xa) == 0 or len(xb) == 0:
        return DiffRow(kind, key, len(xa), len(xb), med_a, med_b, None, None, None, None, "unknown",
                       "no samples on one side")
    if np.all(xa > 0) and np.all(xb > 0):
        c = stats.compare(xa, xb, alpha=alpha, equivalence=equivalence)

        def none(v: float) -> float | None:
            return None if not math.isfinite(v) else v

        return DiffRow(kind, key, c.n_a, c.n_b, med_a, med_b, none(c.ratio), none(c.ci_low), none(c.ci_high),
                       none(c.p_value), c.verdict, None if c.verdict != "unknown" or c.n_a >= stats.MIN_SAMPLES
                       and c.n_b >= stats.MIN_SAMPLES else f"fewer than {stats.MIN_SAMPLES} steps on a side")
    if not np.any(xa) and not np.any(xb):
        return DiffRow(kind, key, len(xa), len(xb), 0.0, 0.0, None, None, None, None, "same",
                       "zero in every step on both sides")
    if len(xa) == len(xb) and np.array_equal(np.sort(xa), np.sort(xb)):
        return DiffRow(kind, key, len(xa), len(xb), med_a, med_b, None, None, None, None, "same",
                       "identical samples")
    ratio = med_b / med_a if med_a > 0 else None
    if len(xa) < stats.MIN_SAMPLES or len(xb) < stats.MIN_SAMPLES:
        return DiffRow(kind, key, len(xa), len(xb), med_a, med_b, ratio, None, None, None, "unknown",
                       f"fewer than {stats.MIN_SAMPLES} steps on a side")
    _, p = stats.mann_whitney_u(xa, xb)
    verdict = "unknown"
    if p < alpha:
        centre_a, centre_b = (med_a, med_b) if med_a != med_b else (float(xa.mean()), float(xb.mean()))
        verdict = "slower" if centre_b > centre_a else "faster"
    return DiffRow(kind, key, len(xa), len(xb), med_a, med_b, ratio, None, None, p, verdict,
                   "zeros in some steps: verdict from the Mann-Whitney test alone")


def _samples(analysis: TraceAnalysis) -> tuple[dict[str, list[float]], dict[str, list[float]], int]:
    """Per-step samples pooled over ranks: (step and categories, families), and the step count."""
    quantities: dict[str, list[float]] = {"step": []}
    quantities.update({c: [] for c in CATEGORIES})
    families: dict[str, list[float]] = {}
    n = 0
    for r in analysis.ranks:
        quantities["step"].extend(s.dur_us for s in r.steps)
        for c in CATEGORIES:
            quantities[c].extend(s.us(c) for s in r.steps)
        for fam in set(families) | set(r.family_step_us):
            families.setdefault(fam, [0.0] * n).extend(r.family_step_us.get(fam, [0.0] * len(r.steps)))
        n += len(r.steps)
    return quantities, families, n


def diff(a: TraceAnalysis, b: TraceAnalysis, *, top: int = 15, alpha: float = 0.01,
         equivalence: float = 0.05) -> TraceDiff:
    """B relative to A: per-step samples of step time, breakdown categories and the top kernel families."""
    qa, fa, n_a = _samples(a)
    qb, fb, n_b = _samples(b)
    dom_a = "/".join(sorted({r.domain for r in a.ranks}))
    dom_b = "/".join(sorted({r.domain for r in b.ranks}))
    warnings = []
    if dom_a != dom_b:
        warnings.append(f"A is a {dom_a} trace and B a {dom_b} trace: the categories do not mean the same")
    rows = [compare_samples("step", "step", qa["step"], qb["step"], alpha=alpha, equivalence=equivalence)]
    rows += [compare_samples("category", c, qa[c], qb[c], alpha=alpha, equivalence=equivalence) for c in CATEGORIES]
    total = {f: sum(fa.get(f, [])) + sum(fb.get(f, [])) for f in set(fa) | set(fb)}
    for fam in sorted(total, key=lambda f: -total[f])[:top]:
        rows.append(compare_samples("family", fam, fa.get(fam, [0.0] * n_a), fb.get(fam, [0.0] * n_b),
                                    alpha=alpha, equivalence=equivalence))
    return TraceDiff(rows, dom_a, dom_b, n_a, n_b, warnings, list(a.inputs), list(b.inputs))
