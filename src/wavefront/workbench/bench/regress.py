"""The dynamic performance gate: did a case get slower than its baseline, beyond noise, or use more memory?

A case (op, case, mode, dtype, provider; by default only the wavefront provider is gated) fails when

- it is slower by more than BOTH the threshold (default 5%) and its noise band, and, when both sides
  carry at least 5 samples, the A/B statistics (wavefront.workbench.stats.compare: bootstrap interval
  and Mann-Whitney) call it "slower". The noise band of a measurement is half its p10-p90 width relative
  to its median; the larger of baseline's and current's is used;
- its peak memory grew by more than ``mem_threshold`` (default 1%);
- it measured fine in the baseline and errors now, or (unless ``allow_missing``) it is missing now.

:func:`dynamic_gate` returns a :class:`GateReport` with a markdown summary and an exit code (0 pass,
1 fail). ``wavefront gate --baseline FILE`` (the static gate's verb) and ``wavefront bisect`` call it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

from wavefront.workbench.bench.records import Measurement, StoredRun
from wavefront.workbench.bench.store import open_run
from wavefront.workbench.stats import MIN_SAMPLES, Comparison, compare

DEFAULT_THRESHOLD = 0.05
DEFAULT_MEM_THRESHOLD = 0.01


def noise_band(samples_us) -> float:
    """Half the p10-p90 width relative to the median (0.02 = +-2%)."""
    s = np.asarray(samples_us, dtype=np.float64)
    if s.size == 0:
        return math.nan
    p10, p50, p90 = np.quantile(s, [0.1, 0.5, 0.9])
    return float((p90 - p10) / (2.0 * p50)) if p50 > 0 else math.inf


def is_regression(base_samples, cur_samples, threshold: float = DEFAULT_THRESHOLD,
                  alpha: float = 0.01) -> tuple[bool, Comparison | None, float, float]:
    """(regressed, comparison or None, ratio of medians, noise band); see the module docstring."""
    if threshold < 0:
        raise ValueError(f"threshold must be >= 0, got {threshold}")
    base = np.asarray(base_samples, dtype=np.float64)
    cur = np.asarray(cur_samples, dtype=np.float64)
    if base.size == 0 or cur.size == 0:
        raise ValueError("is_regression needs samples on both sides")
    ratio = float(np.median(cur) / np.median(base))
    band = max(noise_band(base), noise_band(cur))
    beyond = ratio > 1.0 + max(threshold, band)
    cmp = None
    if base.size >= MIN_SAMPLES and cur.size >= MIN_SAMPLES:
        cmp = compare(base, cur, alpha=alpha, equivalence=threshold)
        beyond = beyond and cmp.verdict == "slower"
    return beyond, cmp, ratio, band


@dataclass
class GateRow:
    op: str
    case: str
    mode: str
    dtype: str
    provider: str
    status: str  # "ok" | "slower" | "faster" | "memory" | "error" | "missing" | "new"
    failed: bool
    why: str = ""
    base_median_us: float | None = None
    cur_median_us: float | None = None
    ratio: float | None = None
    noise_band: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    p_value: float | None = None
    base_peak_mem_bytes: int | None = None
    cur_peak_mem_bytes: int | None = None

    @property
    def label(self) -> str:
        return f"{self.op}/{self.case}/{self.mode}/{self.dtype}/{self.provider}"


@dataclass
class GateReport:
    rows: list[GateRow]
    threshold: float
    mem_threshold: float
    baseline: str
    current: str
    notes: list[str] = field(default_factory=list)

    @property
    def failures(self) -> list[GateRow]:
        return [r for r in self.rows if r.failed]

    @property
    def passed(self) -> bool:
        return not self.failures

    @property
    def exit_code(self) -> int:
        return 0 if self.passed else 1

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.rows:
            out[r.status] = out.get(r.status, 0) + 1
        return out

    def markdown(self) -> str:
        head = "PASSED" if self.passed else f"FAILED ({len(self.failures)} case(s))"
        lines = [f"## Dynamic perf gate: {head}", "",
                 f"Baseline {self.baseline} vs current {self.current}; a case fails when slower than both "
                 f"{self.threshold:.0%} and its noise band (and the A/B test says slower), or when peak memory "
                 f"grows more than {self.mem_threshold:.0%}.", ""]
        lines += [f"- {n}" for n in self.notes]
        lines.append("Counts: " + ", ".join(f"{k} {v}" for k, v in sorted(self.counts().items())))
        shown = self.failures or [r for r in self.rows if r.status != "ok"]
        if shown:
            lines += ["", "| case | status | baseline us | current us | ratio | noise band | 95% CI | p | memory "
                          "| why |", "|---|---|---|---|---|---|---|---|---|---|"]
            for r in shown:
                mem = (f"{_mib(r.base_peak_mem_bytes)} -> {_mib(r.cur_peak_mem_bytes)}"
                       if r.base_peak_mem_bytes is not None and r.cur_peak_mem_bytes is not None else "")
                ci = f"[{r.ci_low:.3f}, {r.ci_high:.3f}]" if r.ci_low is not None and math.isfinite(r.ci_low) else ""
                status = f"**{r.status}**" if r.failed else r.status
                lines.append(f"| {r.label} | {status} | {_f(r.base_median_us)} | {_f(r.cur_median_us)} | "
                             f"{_f(r.ratio, 3)} | {_pct(r.noise_band)} | {ci} | {_f(r.p_value, 3)} | {mem} | {r.why} |")
        return "\n".join(lines) + "\n"

    def as_dict(self) -> dict:
        return {"passed": self.passed, "exit_code": self.exit_code, "threshold": self.threshold,
                "mem_threshold": self.mem_threshold, "baseline": self.baseline, "current": self.current,
                "notes": self.notes, "counts": self.counts(), "rows": [asdict(r) for r in self.rows]}


def _f(x, digits: int = 2) -> str:
    return "" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.{digits}f}"


def _pct(x) -> str:
    return "" if x is None or not math.isfinite(x) else f"+-{x:.1%}"


def _mib(n: int | None) -> str:
    return "" if n is None else f"{n / 2**20:.1f} MiB"


def judge(base: Measurement, cur: Measurement | None, threshold: float = DEFAULT_THRESHOLD,
          mem_threshold: float = DEFAULT_MEM_THRESHOLD, allow_missing: bool = False) -> GateRow:
    """The gate's verdict on one case."""
    row = GateRow(*base.key, status="ok", failed=False, base_median_us=base.median_us,
                  base_peak_mem_bytes=base.peak_mem_bytes)
    if cur is None:
        row.status, row.failed = "missing", not allow_missing and base.ok
        row.why = "measured in the baseline, absent now"
        return row
    row.cur_median_us, row.cur_peak_mem_bytes = cur.median_us, cur.peak_mem_bytes
    if not base.ok:
        row.why = f"baseline has no samples ({base.status})"
        return row
    if not cur.ok:
        row.status, row.failed = "error", True
        row.why = f"{cur.status}: {cur.reason}" if cur.reason else cur.status
        return row
    regressed, cmp, ratio, band = is_regression(base.samples_us, cur.samples_us, threshold)
    row.ratio, row.noise_band = ratio, band
    if cmp is not None:
        row.ci_low, row.ci_high, row.p_value = cmp.ci_low, cmp.ci_high, cmp.p_value
    if regressed:
        row.status, row.failed = "slower", True
        row.why = f"{ratio - 1:+.1%} beyond max({threshold:.0%}, noise {band:.1%})"
    elif cmp is not None and cmp.verdict == "faster":
        row.status = "faster"
    if base.peak_mem_bytes is not None and cur.peak_mem_bytes is not None \
            and cur.peak_mem_bytes > base.peak_mem_bytes * (1.0 + mem_threshold):
        growth = cur.peak_mem_bytes / max(base.peak_mem_bytes, 1) - 1.0
        row.failed = True
        row.status = "memory" if row.status in ("ok", "faster") else row.status
        row.why = "; ".join(filter(None, [row.why, f"peak memory {growth:+.1%}"]))
    return row


def dynamic_gate(baseline: StoredRun, current: StoredRun, *, threshold: float = DEFAULT_THRESHOLD,
                 mem_threshold: float = DEFAULT_MEM_THRESHOLD, providers: tuple[str, ...] | None = ("wavefront",),
                 allow_missing: bool = False) -> GateReport:
    """Gate `current` against `baseline`; see the module docstring. Runs on different devices or of
    different timing kinds are refused (ValueError): their times are not comparable."""
    b, c = baseline.info, current.info
    if b.device_name != c.device_name or b.timing != c.timing:
        raise ValueError(f"the baseline ran on {b.device_name} ({b.timing}) and the current run on "
                         f"{c.device_name} ({c.timing}): timings are comparable only on one device and kind")
    cur = current.by_key()
    rows = [judge(m, cur.get(m.key), threshold, mem_threshold, allow_missing)
            for m in baseline.measurements if providers is None or m.provider in providers]
    base_keys = {m.key for m in baseline.measurements}
    rows += [GateRow(*m.key, status="new", failed=False, cur_median_us=m.median_us, why="not in the baseline")
             for m in current.measurements if m.key not in base_keys and (providers is None or m.provider in providers)]
    notes = []
    if c.timing == "cpu-interpreter":
        notes.append("CPU interpreter: not a performance figure (both runs timed the Triton interpreter)")
    return GateReport(rows, threshold, mem_threshold, _describe(baseline), _describe(current), notes)


def _describe(run: StoredRun) -> str:
    i = run.info
    sha = (i.git_sha or "?")[:10] + ("+dirty" if i.git_dirty else "")
    return f"run {i.id if i.id is not None else '-'} ({sha}, {i.device_name}, {i.created_utc})"


def check_complete(run: StoredRun, ref: str = "") -> None:
    """Refuse a run that `wavefront bench` marked incomplete (interrupted before it finished: its missing
    cases would read as regressions). Runs stored before runs were marked count as complete."""
    status = (run.info.extra or {}).get("status")
    if status == "incomplete":
        raise ValueError(f"run {run.info.id if run.info.id is not None else ref} is incomplete (an interrupted "
                         "`wavefront bench`): gate a complete run")


def gate_runs(baseline: str, current: str = "latest", *, store_path: str = "wavefront-results.sqlite",
              **options) -> GateReport:
    """The gate on two run references (a results JSON file, an SQLite store, ``FILE.sqlite:REF``, or a run
    id / ``latest`` / label in the store at `store_path`): what ``wavefront gate --baseline FILE`` calls."""
    runs = [open_run(ref, store_path) for ref in (baseline, current)]
    for run, ref in zip(runs, (baseline, current), strict=True):
        check_complete(run, ref)
    return dynamic_gate(*runs, **options)
