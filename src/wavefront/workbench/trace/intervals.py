"""Interval arithmetic on half-open time intervals ``[start, end)`` (integer nanoseconds), vectorized.

An :class:`IntervalSet` is a sorted list of disjoint, non-touching intervals (a union already taken).
Boolean combinations of several sets are computed on their elementary segments: the pieces between
consecutive boundary points, on which every set's membership is constant. That makes every breakdown
category a disjoint piece of the timeline, so the categories sum to the window exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt


@dataclass(frozen=True)
class IntervalSet:
    starts: np.ndarray
    ends: np.ndarray

    @staticmethod
    def empty() -> IntervalSet:
        return IntervalSet(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))

    @staticmethod
    def union_of(starts: npt.ArrayLike, ends: npt.ArrayLike) -> IntervalSet:
        """The union of possibly overlapping intervals (zero-length ones dropped)."""
        starts = np.asarray(starts)
        ends = np.asarray(ends)
        keep = ends > starts
        starts, ends = starts[keep], ends[keep]
        if len(starts) == 0:
            return IntervalSet.empty()
        order = np.argsort(starts, kind="stable")
        s, e = starts[order], ends[order]
        reach = np.maximum.accumulate(e)
        # a new merged interval begins where a start lies beyond everything before it
        new = np.empty(len(s), dtype=bool)
        new[0] = True
        new[1:] = s[1:] > reach[:-1]
        first = np.flatnonzero(new)
        last = np.append(first[1:] - 1, len(s) - 1)
        return IntervalSet(s[first], reach[last])

    def __len__(self) -> int:
        return len(self.starts)

    def measure(self) -> int:
        return int(np.sum(self.ends - self.starts))

    def clip(self, lo: float, hi: float) -> IntervalSet:
        if hi <= lo or len(self) == 0:
            return IntervalSet.empty()
        i = np.searchsorted(self.ends, lo, side="right")
        j = np.searchsorted(self.starts, hi, side="left")
        s = np.clip(self.starts[i:j], lo, hi)
        e = np.clip(self.ends[i:j], lo, hi)
        keep = e > s
        return IntervalSet(s[keep], e[keep])

    def contains(self, points: np.ndarray) -> np.ndarray:
        """Membership of each point (half-open: a start is inside, an end is not)."""
        if len(self) == 0:
            return np.zeros(len(points), dtype=bool)
        idx = np.searchsorted(self.starts, points, side="right") - 1
        ok = idx >= 0
        inside = np.zeros(len(points), dtype=bool)
        inside[ok] = points[ok] < self.ends[idx[ok]]
        return inside


def sorted_unique(points: np.ndarray) -> np.ndarray:
    """np.unique for a concatenation of a few sorted runs: a stable sort (timsort) merges the runs
    in linear time where np.unique would hash and sort from scratch."""
    points = np.sort(points, kind="stable")
    keep = np.empty(len(points), dtype=bool)
    keep[:1] = True
    np.not_equal(points[1:], points[:-1], out=keep[1:])
    return points[keep]


@dataclass(frozen=True)
class Segments:
    """The elementary segments of several interval sets: ``[bounds[i], bounds[i+1])`` with the membership
    of each set (``member[k][i]``)."""

    bounds: np.ndarray
    member: list[np.ndarray]

    @staticmethod
    def of(sets: list[IntervalSet], lo: float | None = None, hi: float | None = None) -> Segments:
        pts = [s.starts for s in sets] + [s.ends for s in sets]
        if lo is not None:
            pts.append(np.array([lo, hi], dtype=np.int64))
        bounds = sorted_unique(np.concatenate(pts)) if pts else np.zeros(0, dtype=np.int64)
        if lo is not None and hi is not None:
            bounds = bounds[(bounds >= lo) & (bounds <= hi)]
        left = bounds[:-1]
        return Segments(bounds, [s.contains(left) for s in sets])

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.bounds)

    def select(self, fn: Callable[..., np.ndarray]) -> IntervalSet:
        """The intervals where ``fn(*memberships)`` is true."""
        mask = fn(*self.member) if len(self.bounds) > 1 else np.zeros(0, dtype=bool)
        if not np.any(mask):
            return IntervalSet.empty()
        return IntervalSet.union_of(self.bounds[:-1][mask], self.bounds[1:][mask])

    def measure(self, fn: Callable[..., np.ndarray]) -> int:
        if len(self.bounds) < 2:
            return 0
        return int(np.sum(self.lengths[fn(*self.member)]))


def union(*sets: IntervalSet) -> IntervalSet:
    if not sets:
        return IntervalSet.empty()
    return IntervalSet.union_of(np.concatenate([s.starts for s in sets]), np.concatenate([s.ends for s in sets]))


def intersect(a: IntervalSet, b: IntervalSet) -> IntervalSet:
    return Segments.of([a, b]).select(lambda x, y: x & y)


def subtract(a: IntervalSet, b: IntervalSet) -> IntervalSet:
    return Segments.of([a, b]).select(lambda x, y: x & ~y)


def gaps(busy: IntervalSet, lo: float, hi: float) -> IntervalSet:
    """The complement of ``busy`` inside ``[lo, hi)``."""
    inner = busy.clip(lo, hi)
    starts = np.concatenate([np.array([lo], dtype=np.int64), inner.ends])
    ends = np.concatenate([inner.starts, np.array([hi], dtype=np.int64)])
    keep = ends > starts
    return IntervalSet(starts[keep], ends[keep])
