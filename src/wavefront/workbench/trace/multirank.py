"""Several ranks at once: step-time skew, the slowest rank per step, and the time each rank waits in
collectives, with the ranks' clocks aligned on collective boundaries.

Collective instances: per rank, the communication kernels (device domain; keyed by the launching op,
e.g. ``nccl:all_reduce``, or else the kernel family) or the backend's collective ops (CPU domain:
``gloo:all_reduce`` on gloo's worker threads). The k-th instance of a key on one rank is matched with
the k-th instance of that key on every other rank that has the key (collectives of one process group run
in the same order everywhere).

Clock alignment (``align``):
- ``"auto"``: ranks that report the same ``host_name`` share one clock and are not shifted; ranks on
  different hosts are aligned on collective ends.
- ``"ends"``: a collective completes on all ranks at (nearly) the same instant, because none can finish
  before the last has contributed. Each rank's offset to the lowest rank is the median, over matched
  instances, of ``end(ref) - end(rank)``; the median spread of the aligned ends is reported as the
  residual (how well the assumption held).
- ``"none"``: timestamps are used as written.

Wait time: for instance k, ``wait(rank) = max over ranks of aligned start - aligned start(rank)``: how long
the rank sat in the collective before the last rank arrived. It is summed per rank per step (the step
whose window contains the instance's start on that rank). The rank arriving last is the straggler.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field

import numpy as np


@dataclass
class CollectiveInstances:
    """One rank's collectives in time order (not serialized)."""

    keys: list[str]
    start_us: np.ndarray
    end_us: np.ndarray


@dataclass(frozen=True)
class RankSteps:
    """What multi-rank analysis needs of one rank."""

    rank: int
    host: str | None
    steps: list[tuple[int | None, float, float]]  # (step, start_us, dur_us)
    collectives: CollectiveInstances


@dataclass(frozen=True)
class StepSkew:
    step: int | None
    dur_us_by_rank: dict[int, float]
    skew_us: float  # slowest minus fastest step time
    slowest_rank: int
    fastest_rank: int


@dataclass
class MultiRankReport:
    ranks: list[int]
    alignment: str
    clock_offset_us: dict[int, float]
    alignment_residual_us: float | None
    n_matched_collectives: int
    steps: list[StepSkew]
    wait_us: dict[int, dict]  # rank -> {step: wait_us}
    wait_total_us: dict[int, float]
    last_arrivals: dict[int, int]  # rank -> how many matched collectives it entered last
    warnings: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        d = asdict(self)
        d["steps"] = [asdict(s) | {"dur_us_by_rank": {str(k): v for k, v in s.dur_us_by_rank.items()}}
                      for s in self.steps]
        d["wait_us"] = {str(r): {str(k): v for k, v in w.items()} for r, w in self.wait_us.items()}
        return d


def _matched(ranks: list[RankSteps], warnings: list[str]) -> list[dict[int, tuple[float, float]]]:
    """Matched instances: a list of {rank: (start, end)}."""
    by_key: dict[str, dict[int, list[tuple[float, float]]]] = {}
    for r in ranks:
        c = r.collectives
        for key, s, e in zip(c.keys, c.start_us.tolist(), c.end_us.tolist(), strict=True):
            by_key.setdefault(key, {}).setdefault(r.rank, []).append((s, e))
    out = []
    for key, per_rank in sorted(by_key.items()):
        if len(per_rank) < 2:
            continue
        counts = {rank: len(v) for rank, v in per_rank.items()}
        n = min(counts.values())
        if len(set(counts.values())) > 1:
            warnings.append(f"collective {key!r}: instance counts differ across ranks {counts}; matched the "
                            f"first {n}")
        for k in range(n):
            out.append({rank: v[k] for rank, v in per_rank.items()})
    return out


def _offsets(ranks: list[RankSteps], matched, align: str, warnings: list[str]) -> tuple[str, dict[int, float]]:
    ids = [r.rank for r in ranks]
    zero = {r: 0.0 for r in ids}
    if align == "none":
        return "none (timestamps as written)", zero
    hosts = {r.host for r in ranks}
    if align == "auto" and len(hosts) == 1 and None not in hosts:
        return f"shared clock (all ranks on host {next(iter(hosts))})", zero
    ref = min(ids)
    offsets = dict(zero)
    for r in ids:
        if r == ref:
            continue
        diffs = [inst[ref][1] - inst[r][1] for inst in matched if ref in inst and r in inst]
        if diffs:
            offsets[r] = float(statistics.median(diffs))
        else:
            warnings.append(f"rank {r} shares no collective with rank {ref}: its clock is not aligned")
    return f"collective ends (median offset to rank {ref})", offsets


def multirank(ranks: list[RankSteps], align: str = "auto") -> MultiRankReport:
    if align not in ("auto", "ends", "none"):
        raise ValueError(f"align must be 'auto', 'ends' or 'none', got {align!r}")
    warnings: list[str] = []
    ids = [r.rank for r in ranks]
    matched = _matched(ranks, warnings)
    method, offsets = _offsets(ranks, matched, align, warnings)

    residual = None
    if matched:
        spreads = [max(e + offsets[r] for r, (_, e) in inst.items()) - min(e + offsets[r] for r, (_, e) in inst.items())
                   for inst in matched]
        residual = float(statistics.median(spreads))

    step_sets = [{s[0] for s in r.steps} for r in ranks]
    common = set.intersection(*step_sets) if step_sets else set()
    if any(s != common for s in step_sets):
        warnings.append("ranks have different steps; skew is computed on the steps all ranks have: "
                        + ", ".join(str(s) for s in sorted(common, key=lambda x: (x is None, x or 0))))
    durs = {r.rank: {s[0]: s[2] for s in r.steps} for r in ranks}
    skews = []
    for step in sorted(common, key=lambda x: (x is None, x or 0)):
        by_rank = {r: durs[r][step] for r in ids}
        slow = max(by_rank, key=by_rank.get)
        fast = min(by_rank, key=by_rank.get)
        skews.append(StepSkew(step, by_rank, by_rank[slow] - by_rank[fast], slow, fast))

    wait: dict[int, dict] = {r: {} for r in ids}
    last = {r: 0 for r in ids}
    windows = {r.rank: r.steps for r in ranks}
    for inst in matched:
        aligned = {r: s + offsets[r] for r, (s, _) in inst.items()}
        latest = max(aligned.values())
        last[max(aligned, key=aligned.get)] += 1
        for r, (s, _) in inst.items():
            step = next((w[0] for w in windows[r] if w[1] <= s < w[1] + w[2]), "outside steps")
            wait[r][step] = wait[r].get(step, 0.0) + (latest - aligned[r])
    totals = {r: float(sum(w.values())) for r, w in wait.items()}
    return MultiRankReport(ids, method, offsets, residual, len(matched), skews, wait, totals, last, warnings)
