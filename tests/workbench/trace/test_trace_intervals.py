"""Interval arithmetic against a brute-force timeline of unit cells."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from wavefront.workbench.trace.intervals import IntervalSet, Segments, gaps, intersect, subtract, union

intervals = st.lists(st.tuples(st.integers(0, 60), st.integers(0, 15)), max_size=12)


def _cells(pairs) -> np.ndarray:
    cells = np.zeros(80, dtype=bool)
    for s, d in pairs:
        cells[s:s + d] = True
    return cells


def _set(pairs) -> IntervalSet:
    return IntervalSet.union_of([s for s, _ in pairs], [s + d for s, d in pairs])


@settings(max_examples=150, deadline=None)
@given(intervals, intervals)
def test_boolean_combinations_match_cells(a, b):
    ca, cb = _cells(a), _cells(b)
    sa, sb = _set(a), _set(b)
    assert sa.measure() == ca.sum()
    assert union(sa, sb).measure() == (ca | cb).sum()
    assert intersect(sa, sb).measure() == (ca & cb).sum()
    assert subtract(sa, sb).measure() == (ca & ~cb).sum()
    assert gaps(sa, 0, 80).measure() == (~ca).sum()
    lo, hi = 10, 50
    assert sa.clip(lo, hi).measure() == ca[lo:hi].sum()
    seg = Segments.of([sa, sb], lo, hi)
    parts = [seg.measure(f) for f in (lambda x, y: x & y, lambda x, y: x & ~y, lambda x, y: ~x & y,
                                      lambda x, y: ~x & ~y)]
    assert sum(parts) == hi - lo


def test_union_merges_touching_and_drops_empty():
    s = IntervalSet.union_of([0, 5, 9, 20], [5, 9, 9, 30])
    assert s.starts.tolist() == [0, 20] and s.ends.tolist() == [9, 30]
    assert s.contains(np.array([0, 8, 9, 20, 30])).tolist() == [True, True, False, True, False]
