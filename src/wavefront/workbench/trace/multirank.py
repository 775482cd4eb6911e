"""Several ranks at once: step-time skew, the slowest rank per step, and the time each rank waits in
collectives, with the ranks' clocks aligned on collective boundaries. Times are integer nanoseconds
until they are reported (in microseconds), so waits stay exact at Unix-epoch clocks.

Collective instances: per rank, the communication kernels (device domain) or the backend's collective
ops (CPU domain: ``gloo:all_reduce`` on gloo's worker threads). Matching one instance across ranks:

- ``identity`` (used when every rank's instances carry it): the process group, the collective type
  and the sequence number that torch.profiler records on ``record_param_comms`` (args ``Process Group
  Name`` or ``pg_id``, ``Collective name``, ``Seq``). Collectives of different types or process groups
  may start in different orders on different ranks (FSDP's all-gathers and reduce-scatters on their
  own streams); the identity pairs them whatever the order.
- ``identity`` of XLA collectives (jax.profiler traces): the ``run_id`` of the program execution, which
  is the same on every rank, the HLO op and its turn among that op's instances in the execution.
- ``launch order per type`` (the fallback, said in the report): the k-th instance of a collective type
  on one rank is matched with the k-th instance of that type on every other rank that has the type.

Clock alignment (``align``):
- ``"auto"``: ranks that report the same ``host_name`` share one clock and are not shifted; ranks on
  different hosts are aligned on collective ends.
- ``"ends"``: a collective completes on all ranks at (nearly) the same instant, because none can finish
  before the last has contributed. Each rank's offset to the lowest rank is the median (the lower
  middle value, so it stays a whole nanosecond), over matched instances, of ``end(ref) - end(rank)``;
  the median spread of the aligned ends is reported as the residual (how well the assumption held).
- ``"none"``: timestamps are used as written.

Wait time: for instance k, ``wait(rank) = max over ranks of aligned start - aligned start(rank)``: how long
the rank sat in the collective before the last rank arrived. It is summed per rank per step (the step
whose window contains the instance's start on that rank). The rank arriving last is the straggler.

Sanity warnings: no step common to all ranks, or an alignment residual above ``RESIDUAL_WARN_FRACTION``
of the median step time (and at least ``RESIDUAL_WARN_MIN_US``): the files probably come from
different runs; a step missing on some ranks names them.
"""

from __future__ import annotations

import bisect
import itertools
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

RESIDUAL_WARN_FRACTION = 0.05
RESIDUAL_WARN_MIN_US = 1000.0
MATCH_IDENTITY = "identity (process group, collective, sequence number)"
MATCH_XLA_IDENTITY = "identity (XLA run id, HLO op, its turn in the run)"
XLA_IDENTITY = "xla"  # first element of an XLA collective's identity
MATCH_ORDER = "launch order per collective type"


@dataclass
class CollectiveInstances:
    """One rank's collectives in time order (not serialized): the type of each (``kinds``), its
    identity when the trace records one, its start and end in integer nanoseconds."""

    kinds: list[str]
    identities: list[tuple[Any, ...] | None]
    start_ns: np.ndarray
    end_ns: np.ndarray

    @staticmethod
    def empty() -> CollectiveInstances:
        return CollectiveInstances([], [], np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))

    @property
    def has_identity(self) -> bool:
        return bool(self.identities) and all(i is not None for i in self.identities)


@dataclass(frozen=True)
class RankSteps:
    """What multi-rank analysis needs of one rank."""

    rank: int
    host: str | None
    steps: list[tuple[int | None, int, int]]  # (step, start_ns, dur_ns)
    collectives: CollectiveInstances


@dataclass(frozen=True)
class StepSkew:
    step: int | None
    dur_us_by_rank: dict[int, float]
    skew_us: float  # slowest minus fastest step time
    slowest_rank: int
    fastest_rank: int
    dur_ns_by_rank: dict[int, int] = field(default_factory=dict)  # the same in exact nanoseconds
    skew_ns: int = 0


@dataclass
class MultiRankReport:
    ranks: list[int]
    alignment: str
    clock_offset_us: dict[int, float]
    alignment_residual_us: float | None
    matching: str  # MATCH_IDENTITY or MATCH_ORDER
    n_matched_collectives: int
    steps: list[StepSkew]
    wait_us: dict[int, dict[int | str | None, float]]  # rank -> {step: wait_us}
    wait_total_us: dict[int, float]
    last_arrivals: dict[int, int]  # rank -> how many matched collectives it entered last
    warnings: list[str] = field(default_factory=list)
    # the times above in exact nanoseconds (the residual is a median: a half nanosecond at most)
    clock_offset_ns: dict[int, int] = field(default_factory=dict)
    alignment_residual_ns: float | None = None
    wait_ns: dict[int, dict[int | str | None, int]] = field(default_factory=dict)
    wait_total_ns: dict[int, int] = field(default_factory=dict)


Instance = dict[int, tuple[int, int]]  # rank -> (start_ns, end_ns)


def _by_identity(ranks: list[RankSteps], warnings: list[str]) -> list[Instance]:
    """Instances keyed by (process group, type, sequence number); the kernels of one instance on one
    rank (a collective split into several kernels) are merged into their span."""
    by_id: dict[tuple[Any, ...], Instance] = {}
    for r in ranks:
        c = r.collectives
        for ident, s, e in zip(c.identities, c.start_ns.tolist(), c.end_ns.tolist(), strict=True):
            if ident is None:
                continue
            inst = by_id.setdefault(ident, {})
            if r.rank in inst:
                s0, e0 = inst[r.rank]
                s, e = min(s, s0), max(e, e0)
            inst[r.rank] = (s, e)
    partial = sum(1 for inst in by_id.values() if len(inst) < len(ranks))
    if partial:
        warnings.append(f"{partial} collective instance(s) appear on only some ranks (a rank's trace starts or "
                        "ends at a different point, or groups smaller than the world): matched where present")
    return [inst for _, inst in sorted(by_id.items(), key=lambda kv: str(kv[0])) if len(inst) >= 2]


def _by_order(ranks: list[RankSteps], warnings: list[str]) -> list[Instance]:
    by_key: dict[str, dict[int, list[tuple[int, int]]]] = {}
    for r in ranks:
        c = r.collectives
        for key, s, e in zip(c.kinds, c.start_ns.tolist(), c.end_ns.tolist(), strict=True):
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


def _offsets(ranks: list[RankSteps], matched: list[Instance], align: str,
             warnings: list[str]) -> tuple[str, dict[int, int]]:
    ids = [r.rank for r in ranks]
    zero = {r: 0 for r in ids}
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
            offsets[r] = int(statistics.median_low(diffs))
        else:
            warnings.append(f"rank {r} shares no collective with rank {ref}: its clock is not aligned")
    return f"collective ends (median offset to rank {ref})", offsets


def _step_skews(ranks: list[RankSteps], warnings: list[str]) -> list[StepSkew]:
    step_sets = {r.rank: {s[0] for s in r.steps} for r in ranks}
    common = set.intersection(*step_sets.values()) if step_sets else set()
    every = set.union(*step_sets.values()) if step_sets else set()

    def order(x: int | None) -> tuple[bool, int]:
        return (x is None, x or 0)

    if every and not common:
        warnings.append("the ranks share no step: they probably come from different runs (or profiled different "
                        "steps); no step skew is computed")
    elif every != common:
        missing = {s: [r for r, have in step_sets.items() if s not in have] for s in sorted(every - common, key=order)}
        text = "; ".join(f"step {s} on rank(s) {rs}" for s, rs in missing.items())
        warnings.append(f"steps missing on some ranks ({text}): skew is computed on the {len(common)} step(s) all "
                        "ranks have")
    durs = {r.rank: {s[0]: s[2] for s in r.steps} for r in ranks}
    skews = []
    for step in sorted(common, key=order):
        by_rank = {r: durs[r][step] for r in durs}
        slow = max(by_rank, key=lambda k: by_rank[k])
        fast = min(by_rank, key=lambda k: by_rank[k])
        skews.append(StepSkew(step, {r: v / 1000 for r, v in by_rank.items()}, (by_rank[slow] - by_rank[fast]) / 1000,
                              slow, fast, dict(by_rank), by_rank[slow] - by_rank[fast]))
    return skews


def _step_finder(steps: list[tuple[int | None, int, int]]) -> Callable[[int], int | str | None]:
    """``find(t)``: the first step (in list order) whose window ``[start, start + dur)`` holds ``t``, else
    "outside steps". By bisection on the sorted starts, then back over the windows that may still reach
    ``t`` (one or two: neighbouring steps overlap by a rounding nanosecond at most, usually)."""
    order = sorted(range(len(steps)), key=lambda i: steps[i][1])
    starts = [steps[i][1] for i in order]
    ends = [steps[i][1] + steps[i][2] for i in order]
    reach = list(itertools.accumulate(ends, max))  # the latest end among the windows up to each

    def find(t: int) -> int | str | None:
        k = bisect.bisect_right(starts, t) - 1
        first = None
        while k >= 0 and reach[k] > t:
            if ends[k] > t and (first is None or order[k] < first):
                first = order[k]
            k -= 1
        return "outside steps" if first is None else steps[first][0]

    return find


def _whole(ns: float) -> float | int:
    """A median of integers: an int when whole (a half nanosecond otherwise)."""
    return int(ns) if ns.is_integer() else ns


def multirank(ranks: list[RankSteps], align: str = "auto") -> MultiRankReport:
    if align not in ("auto", "ends", "none"):
        raise ValueError(f"align must be 'auto', 'ends' or 'none', got {align!r}")
    warnings: list[str] = []
    ids = [r.rank for r in ranks]
    with_colls = [r for r in ranks if len(r.collectives.kinds)]
    if with_colls and all(r.collectives.has_identity for r in with_colls):
        xla = all(i is not None and i[0] == XLA_IDENTITY for r in with_colls for i in r.collectives.identities)
        matching, matched = (MATCH_XLA_IDENTITY if xla else MATCH_IDENTITY), _by_identity(ranks, warnings)
    else:
        matching, matched = MATCH_ORDER, _by_order(ranks, warnings)
        if with_colls:
            warnings.append("the traces carry no collective identity (record_param_comms process group and "
                            "sequence number): collectives are matched by launch order per type")
    method, offsets = _offsets(ranks, matched, align, warnings)

    residual_ns = None
    if matched:
        spreads = [max(e + offsets[r] for r, (_, e) in inst.items()) - min(e + offsets[r] for r, (_, e) in inst.items())
                   for inst in matched]
        residual_ns = float(statistics.median(spreads))
    skews = _step_skews(ranks, warnings)
    all_durs = [s[2] for r in ranks for s in r.steps]
    if residual_ns is not None and all_durs:
        limit_ns = max(RESIDUAL_WARN_MIN_US * 1e3, RESIDUAL_WARN_FRACTION * statistics.median(all_durs))
        if residual_ns > limit_ns:
            warnings.append(f"matched collectives end {residual_ns / 1e3:,.1f} us apart after clock alignment (median "
                            f"spread): the ranks probably come from different runs, or the clocks drift")

    wait_ns: dict[int, dict[int | str | None, int]] = {r: {} for r in ids}
    last = {r: 0 for r in ids}
    step_of = {r.rank: _step_finder(r.steps) for r in ranks}
    for inst in matched:
        aligned = {r: s + offsets[r] for r, (s, _) in inst.items()}
        latest = max(aligned.values())
        last[max(aligned, key=lambda k: aligned[k])] += 1
        for r, (s, _) in inst.items():
            step = step_of[r](s)
            wait_ns[r][step] = wait_ns[r].get(step, 0) + (latest - aligned[r])
    wait_us = {r: {k: v / 1000 for k, v in w.items()} for r, w in wait_ns.items()}
    totals = {r: sum(w.values()) for r, w in wait_ns.items()}
    return MultiRankReport(ids, method, {r: v / 1000 for r, v in offsets.items()},
                           None if residual_ns is None else residual_ns / 1e3, matching, len(matched), skews, wait_us,
                           {r: v / 1000 for r, v in totals.items()}, last, warnings, dict(offsets),
                           None if residual_ns is None else _whole(residual_ns),
                           wait_ns, totals)
