"""Timing one callable: warm-up, a cold last-level cache, many repetitions, quantiles.

The protocol, on a GPU (``time_fn`` with an :class:`EventClock`):

1. ``warmup`` untimed calls (compilation, autotuning, allocator growth happen here);
2. ``reps`` timed repetitions; before each one ``flush()`` overwrites a buffer at least twice the size of
   the device's last-level cache (L2 on NVIDIA; L2 + the 256 MB Infinity Cache on MI300X), so every
   repetition reads its inputs from HBM as a training step would; device events bracket only the call,
   never the flush, and are read after one synchronize at the end (no host sync per repetition);
3. the samples' median is the estimate, p10/p90 its spread.

Kernels shorter than about 20 us are dominated by launch overhead and event resolution, so
:func:`time_graph` captures ``calls_per_sample`` calls into a CUDA/HIP graph, each on its own copy of the
inputs (input rotation keeps the cache cold without a flush inside the graph), and times graph replays;
one sample is a replay's time divided by the calls in it.

On a CPU the same functions run with a :class:`WallClock`: the numbers are then correctness runs of the
Triton interpreter, not performance figures, and every caller labels them so.

The logic is clock-agnostic, so tests drive it with a fake clock (warm-up counted, flush between
repetitions, quantiles). This module imports only numpy and torch, and its siblings only relatively:
``wavefront bisect`` and ``wavefront compare --git`` copy it next to ``probe.py`` to time other revisions.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import numpy as np

#: Below this median, a kernel is timed by graph replay (launch overhead would dominate otherwise).
GRAPH_THRESHOLD_US = 20.0
#: Minimum repetitions for a reported figure (median, p10, p90 need enough samples to mean anything).
MIN_REPS = 30


def quantiles_us(samples_us: Sequence[float], qs: Sequence[float] = (0.1, 0.5, 0.9)) -> tuple[float, ...]:
    """Quantiles with linear interpolation between order statistics (numpy's default)."""
    if len(samples_us) == 0:
        raise ValueError("quantiles_us needs at least one sample")
    return tuple(float(v) for v in np.quantile(np.asarray(samples_us, dtype=np.float64), qs))


@dataclass(frozen=True)
class Timing:
    """Samples of one callable, in microseconds per call, with how they were taken."""

    samples_us: tuple[float, ...]
    method: str  # "events", "graph" (replay of calls_per_sample calls), "wall" (CPU)
    flush: str  # what kept the cache cold: "flush 576 MiB", "rotation 8 input sets", "none"
    n_warmup: int
    calls_per_sample: int = 1

    @property
    def n_reps(self) -> int:
        return len(self.samples_us)

    @property
    def median_us(self) -> float:
        return quantiles_us(self.samples_us, (0.5,))[0]

    @property
    def p10_us(self) -> float:
        return quantiles_us(self.samples_us, (0.1,))[0]

    @property
    def p90_us(self) -> float:
        return quantiles_us(self.samples_us, (0.9,))[0]

    @property
    def mean_us(self) -> float:
        return float(np.mean(self.samples_us))

    def summary(self) -> dict[str, Any]:
        p10, p50, p90 = quantiles_us(self.samples_us)
        return {"method": self.method, "flush": self.flush, "n_warmup": self.n_warmup, "n_reps": self.n_reps,
                "calls_per_sample": self.calls_per_sample, "median_us": p50, "p10_us": p10, "p90_us": p90,
                "mean_us": self.mean_us}

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | self.summary()


class Clock(Protocol):
    """Brackets calls and reports the bracketed durations once all calls are issued."""

    method: str

    def begin(self) -> Any: ...

    def end(self, handle: Any) -> None: ...

    def durations_us(self) -> list[float]:
        """Durations of every begin/end pair since the last call, in order; waits for the device."""
        ...

    def sync(self) -> None: ...


class WallClock:
    """Host wall time (time.perf_counter_ns), optionally synchronizing a device around each bracket."""

    method = "wall"

    def __init__(self, sync: Callable[[], None] | None = None):
        self._now_ns = time.perf_counter_ns
        self._sync = sync or (lambda: None)
        self._pairs: list[tuple[int, int]] = []

    def begin(self) -> int:
        self._sync()
        return self._now_ns()

    def end(self, handle: int) -> None:
        self._sync()
        self._pairs.append((handle, self._now_ns()))

    def durations_us(self) -> list[float]:
        out = [(b - a) / 1e3 for a, b in self._pairs]
        self._pairs = []
        return out

    def sync(self) -> None:
        self._sync()


class EventClock:
    """Device events on the current CUDA/HIP stream; read after one synchronize."""

    method = "events"

    def __init__(self):
        import torch  # lazy: torch-free import

        self._torch = torch
        self._pairs: list[tuple[Any, Any]] = []

    def begin(self):
        ev = self._torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def end(self, handle) -> None:
        ev = self._torch.cuda.Event(enable_timing=True)
        ev.record()
        self._pairs.append((handle, ev))

    def durations_us(self) -> list[float]:
        self._torch.cuda.synchronize()
        out = [a.elapsed_time(b) * 1e3 for a, b in self._pairs]  # elapsed_time is in ms
        self._pairs = []
        return out

    def sync(self) -> None:
        self._torch.cuda.synchronize()


def time_fn(fn: Callable[[], Any], *, clock: Clock, reps: int = MIN_REPS, warmup: int = 5,
            flush: Callable[[], Any] | None = None, flush_label: str = "none",
            calls_per_sample: int = 1) -> Timing:
    """Time `fn`: `warmup` untimed calls, then `reps` bracketed calls, `flush()` before each.

    `fn` performing `calls_per_sample` calls (a graph replay) gives per-call samples.
    """
    if reps < 1:
        raise ValueError(f"reps must be >= 1, got {reps}")
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    if calls_per_sample < 1:
        raise ValueError(f"calls_per_sample must be >= 1, got {calls_per_sample}")
    for _ in range(warmup):
        fn()
    clock.sync()
    clock.durations_us()  # discard anything bracketed before this call
    for _ in range(reps):
        if flush is not None:
            flush()
        handle = clock.begin()
        fn()
        clock.end(handle)
    samples = clock.durations_us()
    if len(samples) != reps:
        raise RuntimeError(f"the clock returned {len(samples)} durations for {reps} repetitions")
    method = clock.method if calls_per_sample == 1 else "graph"
    return Timing(tuple(s / calls_per_sample for s in samples), method, flush_label, warmup, calls_per_sample)


def flush_bytes_for(llc_bytes: int, *, factor: int = 2, floor_bytes: int = 256 << 20) -> int:
    """Size of the flush buffer: `factor` x the last-level cache, and at least `floor_bytes`."""
    if llc_bytes < 0:
        raise ValueError(f"llc_bytes must be >= 0, got {llc_bytes}")
    return max(factor * llc_bytes, floor_bytes)


class CacheFlusher:
    """Overwrites a device buffer of `n_bytes` (allocated once, outside any timed region)."""

    def __init__(self, n_bytes: int, device):
        import torch  # lazy: torch-free import

        self.n_bytes = int(n_bytes)
        self._buf = torch.empty(self.n_bytes // 4, dtype=torch.int32, device=device)

    @property
    def label(self) -> str:
        return f"flush {self.n_bytes / 2**20:.0f} MiB"

    def __call__(self) -> None:
        self._buf.zero_()


def rotation_sets(bytes_per_set: int, cold_bytes: int, *, max_sets: int = 64) -> int:
    """Input copies to cycle through so that consecutive uses of one copy are `cold_bytes` apart."""
    if bytes_per_set <= 0:
        raise ValueError(f"bytes_per_set must be > 0, got {bytes_per_set}")
    return max(2, min(max_sets, -(-cold_bytes // bytes_per_set) + 1))


def time_graph(make_call: Callable[[int], Callable[[], Any]], n_sets: int, *, clock: Clock, reps: int = MIN_REPS,
               warmup: int = 3, calls_per_set: int = 1, capture: Callable[[Sequence[Callable[[], Any]]], Any]
               | None = None) -> Timing:
    """Graph replay with input rotation: `make_call(i)` is the call on input set i (i < n_sets).

    The graph holds n_sets * calls_per_set calls; `capture(calls)` returns an object with ``replay()``
    (default: a CUDA/HIP graph captured on a side stream after one eager warm-up of every call).
    """
    calls = [make_call(i) for i in range(n_sets)] * calls_per_set
    graph = (capture or capture_cuda_graph)(calls)
    return time_fn(graph.replay, clock=clock, reps=reps, warmup=warmup,
                   flush_label=f"rotation {n_sets} input sets", calls_per_sample=len(calls))


def capture_cuda_graph(calls: Sequence[Callable[[], Any]]):
    import torch  # lazy: torch-free import

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for call in calls:  # warm-up on the capture stream, as torch.cuda.graphs requires
            call()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    torch.cuda.synchronize()
    return graph
