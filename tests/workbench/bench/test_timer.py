"""The timer's logic on CPU with a fake clock: warm-up counted, flush between repetitions, quantiles."""

from __future__ import annotations

import numpy as np
import pytest

from wavefront.workbench.bench import timer as T


class FakeClock:
    """Time advances only when the timed function says so; every event is logged."""

    method = "fake"

    def __init__(self, log: list[str]):
        self.now_us = 0.0
        self.log = log
        self.pairs: list[tuple[float, float]] = []
        self.syncs = 0

    def begin(self):
        self.log.append("begin")
        return self.now_us

    def end(self, handle):
        self.log.append("end")
        self.pairs.append((handle, self.now_us))

    def durations_us(self):
        out = [b - a for a, b in self.pairs]
        self.pairs = []
        return out

    def sync(self):
        self.syncs += 1


def _timed(durations, log, clock):
    it = iter(durations)

    def fn():
        log.append("call")
        clock.now_us += next(it)

    return fn


def test_warmup_is_untimed_and_flush_precedes_every_rep():
    log: list[str] = []
    clock = FakeClock(log)
    warm = [1000.0] * 3  # warm-up calls are slow (compilation) and must not show up in the samples
    reps = [10.0, 20.0, 30.0, 40.0, 50.0]
    fn = _timed(warm + reps, log, clock)
    t = T.time_fn(fn, clock=clock, reps=5, warmup=3, flush=lambda: log.append("flush"), flush_label="flush 1 MiB")
    assert log[:3] == ["call"] * 3
    assert log[3:] == ["flush", "begin", "call", "end"] * 5
    assert t.samples_us == tuple(reps)
    assert t.n_warmup == 3 and t.n_reps == 5 and t.flush == "flush 1 MiB" and t.method == "fake"
    assert clock.syncs >= 1  # warm-up work is drained before timing


def test_quantiles_are_numpy_linear():
    log: list[str] = []
    clock = FakeClock(log)
    samples = [float(x) for x in np.random.default_rng(0).permutation(np.arange(1, 101))]
    t = T.time_fn(_timed(samples, log, clock), clock=clock, reps=100, warmup=0)
    assert t.median_us == pytest.approx(50.5)
    assert t.p10_us == pytest.approx(10.9)
    assert t.p90_us == pytest.approx(90.1)
    s = t.summary()
    assert (s["p10_us"], s["median_us"], s["p90_us"]) == pytest.approx((10.9, 50.5, 90.1))
    assert s["mean_us"] == pytest.approx(50.5)


def test_graph_replay_divides_by_calls_and_rotates_inputs():
    log: list[str] = []
    clock = FakeClock(log)
    made: list[int] = []

    def make_call(i):
        made.append(i)
        return lambda: log.append(f"set{i}")

    class FakeGraph:
        def __init__(self, calls):
            self.calls = calls

        def replay(self):
            for c in self.calls:
                c()
            clock.now_us += 2.0 * len(self.calls)  # 2 us per captured call

    t = T.time_graph(make_call, 4, clock=clock, reps=30, warmup=2, calls_per_set=3, capture=FakeGraph)
    assert made == [0, 1, 2, 3]
    assert t.calls_per_sample == 12 and t.method == "graph"
    assert t.samples_us == (2.0,) * 30
    assert t.flush == "rotation 4 input sets"
    assert log.count("set0") == 3 * (2 + 30)  # warm-up replays count too, none of them timed


def test_flush_and_rotation_sizes():
    mi300x_llc = (32 + 256) * 10**6
    assert T.flush_bytes_for(mi300x_llc) >= 512 * 10**6
    assert T.flush_bytes_for(50 * 10**6) == 256 << 20  # the floor
    assert T.rotation_sets(10 * 10**6, 100 * 10**6) == 11
    assert T.rotation_sets(10**9, 100 * 10**6) == 2
    assert T.rotation_sets(1, 10**9) == 64


def test_bad_arguments_are_rejected():
    clock = FakeClock([])
    with pytest.raises(ValueError, match="reps"):
        T.time_fn(lambda: None, clock=clock, reps=0)
    with pytest.raises(ValueError, match="warmup"):
        T.time_fn(lambda: None, clock=clock, warmup=-1)
    with pytest.raises(ValueError, match="bytes_per_set"):
        T.rotation_sets(0, 10)


def test_wall_clock_measures_real_time():
    import time

    t = T.time_fn(lambda: time.sleep(0.002), clock=T.WallClock(), reps=3, warmup=1)
    assert t.method == "wall"
    assert all(1500 < s < 200_000 for s in t.samples_us)
