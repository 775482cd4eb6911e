"""Launch statistics: how long work waits between the host's launch call and the device, how much of the
device's work is too short to hide its launch, and how much CPU time each step spends launching.

- launch delay, one sample per launch call with device work: start of the first device event it launched
  minus the start of the runtime call; and ``op_delay_us``, one sample per CPU op call that launched
  device work: its first device event's start minus the op's start (what the op costs before the device
  sees it: dispatch, argument checks, the launch call, the queue) (``cudaLaunchKernel``, ``hipExtModuleLaunchKernel``,
  ``cudaGraphLaunch``, ``cudaMemcpyAsync`` ...). A graph launch is one sample (its first kernel), never one
  per kernel of the graph. Long delays mean a deep queue (healthy, the host runs ahead); delays near the
  launch latency with device idle between kernels mean the host is the bottleneck.
- short kernels: kernels shorter than ``short_us`` (default 10 us, about one launch's host cost), their
  share of the kernel count and of kernel time.
- per step: CPU time inside launch APIs (any runtime call that launched device work, or a known launch API
  name) and inside synchronization APIs, for calls that start in the step's window.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from wavefront.workbench.trace.breakdown import Step
from wavefront.workbench.trace.classify import GRAPH_LAUNCH_APIS, LAUNCH_APIS, SYNC_APIS, DeviceClasses, name_flags
from wavefront.workbench.trace.model import KIND_KERNEL, Trace


@dataclass(frozen=True)
class Distribution:
    n: int
    mean: float
    p50: float
    p90: float
    p99: float
    max: float

    @staticmethod
    def of(values: np.ndarray) -> Distribution:
        if len(values) == 0:
            return Distribution(0, *([float("nan")] * 5))
        p50, p90, p99 = np.percentile(values, [50, 90, 99]).tolist()
        return Distribution(len(values), float(values.mean()), p50, p90, p99, float(values.max()))

    def divided(self, by: float) -> Distribution:
        return Distribution(self.n, self.mean / by, self.p50 / by, self.p90 / by, self.p99 / by, self.max / by)


@dataclass(frozen=True)
class StepLaunch:
    step: int | None
    launch_cpu_us: float
    n_launch_calls: int
    sync_cpu_us: float
    launch_fraction: float  # launch_cpu_us / step duration
    launch_cpu_ns: int = 0  # launch_cpu_us and sync_cpu_us in exact nanoseconds
    sync_cpu_ns: int = 0


@dataclass
class LaunchStats:
    delay_us: Distribution
    op_delay_us: Distribution
    launches_by_api: dict[str, int]
    n_graph_launches: int
    graph_kernels: int  # kernels that ran inside graph launches
    short_us: float
    n_kernels: int
    n_short: int
    short_count_fraction: float
    short_time_fraction: float
    unlinked_device_events: int  # device events whose launch call is not in the trace
    per_step: list[StepLaunch] = field(default_factory=list)
    delay_ns: Distribution | None = None  # delay_us and op_delay_us from the integer nanoseconds
    op_delay_ns: Distribution | None = None


def launch_stats(trace: Trace, classes: DeviceClasses, steps: list[Step], short_us: float = 10.0) -> LaunchStats:
    dev, rt = trace.device, trace.runtime
    linked = classes.runtime_row >= 0
    rows = classes.runtime_row[linked]
    never = np.iinfo(np.int64).max
    first_start = np.full(len(rt), never, dtype=np.int64)
    np.minimum.at(first_start, rows, dev.ts_ns[linked])
    launched = first_start != never
    delay_ns = Distribution.of(first_start[launched] - rt.ts_ns[launched])

    by_op = classes.op_row >= 0
    op_first = np.full(len(trace.cpu), never, dtype=np.int64)
    np.minimum.at(op_first, classes.op_row[by_op], dev.ts_ns[by_op])
    op_launched = op_first != never
    op_delay_ns = Distribution.of(op_first[op_launched] - trace.cpu.ts_ns[op_launched])

    api_names = np.array(trace.names, dtype=object)
    by_api: dict[str, int] = {}
    if np.any(launched):
        ids, counts = np.unique(rt.name[launched], return_counts=True)
        by_api = {str(api_names[i]): int(c) for i, c in zip(ids.tolist(), counts.tolist(), strict=True)}
    graph_flag = name_flags(trace.names, GRAPH_LAUNCH_APIS.__contains__)
    n_graph = int(np.sum(launched & graph_flag[rt.name])) if len(rt) else 0
    graph_kernels = int(np.sum(graph_flag[rt.name[rows]])) if len(rows) else 0

    kernels = dev.kind == KIND_KERNEL
    k_dur = dev.dur_ns[kernels] / 1e3
    short = k_dur < short_us
    n_k = int(kernels.sum())

    is_launch = launched | name_flags(trace.names, LAUNCH_APIS.__contains__)[rt.name] if len(rt) else launched
    is_sync = name_flags(trace.names, SYNC_APIS.__contains__)[rt.name] if len(rt) else np.zeros(0, dtype=bool)
    # runtime rows are sorted by start: each step's calls are one slice, summed with prefix sums
    def prefix(values: np.ndarray) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(values)])

    launch_ns, n_launch = prefix(np.where(is_launch, rt.dur_ns, 0)), prefix(is_launch.astype(np.int64))
    sync_ns = prefix(np.where(is_sync, rt.dur_ns, 0))
    lo = np.searchsorted(rt.ts_ns, [s.start_ns for s in steps], side="left")
    hi = np.searchsorted(rt.ts_ns, [s.end_ns for s in steps], side="left")
    per_step = []
    for s, a, b in zip(steps, lo.tolist(), hi.tolist(), strict=True):
        launch_cpu, sync_cpu = int(launch_ns[b] - launch_ns[a]), int(sync_ns[b] - sync_ns[a])
        per_step.append(StepLaunch(s.step, launch_cpu / 1000, int(n_launch[b] - n_launch[a]), sync_cpu / 1000,
                                   launch_cpu / s.dur_ns if s.dur_ns > 0 else float("nan"), launch_cpu, sync_cpu))
    return LaunchStats(delay_ns.divided(1000), op_delay_ns.divided(1000), by_api, n_graph, graph_kernels,
                       short_us, n_k, int(short.sum()),
                       float(short.mean()) if n_k else float("nan"),
                       float(k_dur[short].sum() / k_dur.sum()) if n_k and k_dur.sum() > 0 else float("nan"),
                       int(np.sum(~linked)), per_step, delay_ns, op_delay_ns)
