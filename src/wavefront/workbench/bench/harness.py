"""The benchmark harness: registry x case x mode x provider, timed the same way for everyone.

For each (op, case, mode, dtype) the inputs are made once by the op's ``make_inputs`` (random, seeded by
the case) and every provider runs on them: wavefront, eager PyTorch, torch.compile of eager, Liger-Kernel
(see providers.py). Per provider:

- the timed call is built outside the timed region (runnable.py): forward for ``bwd`` and upstream
  gradients are made before timing;
- on a GPU: a short estimate, then ``reps`` (>= 30) repetitions timed with device events and the cache
  flushed before each (a buffer at least twice the last-level cache); a kernel whose estimate is under
  ``graph_threshold_us`` is timed by graph replay over rotated input copies instead (timer.py). Achieved
  GB/s and TFLOP/s come from the registry's byte and FLOP formulas, as % of the device's dense peak and
  of the device-to-device copy bandwidth measured at the start of the run. Peak memory is
  ``max_memory_allocated`` over one untimed call, above what was allocated before it;
- on a CPU: samples are wall times of the Triton interpreter or of eager CPU kernels, which are
  correctness runs and never performance figures (the run's ``timing`` says so, and every output labels
  them).

Each provider's forward output is compared with eager's (max abs difference) to catch a baseline that
computes something else. Failures are recorded per measurement and the run goes on; a time budget marks
what it did not reach as skipped.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from wavefront import runtime
from wavefront.ops import REGISTRY
from wavefront.ops._spec import dtype_name
from wavefront.workbench.bench import timer as T
from wavefront.workbench.bench.model import achieved
from wavefront.workbench.bench.providers import PROVIDERS, ProviderSet, Unavailable, check_providers
from wavefront.workbench.bench.records import Measurement
from wavefront.workbench.bench.runnable import MODES, check_mode, formula, modes_for, prepare
from wavefront.workbench.hardware import GPU


@dataclass(frozen=True)
class BenchConfig:
    ops: tuple[str, ...] | None = None  # None: the whole registry
    modes: tuple[str, ...] = MODES
    providers: tuple[str, ...] = PROVIDERS
    dtypes: tuple[torch.dtype, ...] = (torch.bfloat16,)
    case_set: str = "bench"  # "bench": real-model shapes; "small": the non-slow correctness cases
    case_names: tuple[str, ...] | None = None
    reps: int = T.MIN_REPS
    warmup: int = 5
    graph_threshold_us: float = T.GRAPH_THRESHOLD_US
    budget_s: float | None = None
    use_graphs: bool = True

    def __post_init__(self):
        for m in self.modes:
            check_mode(m)
        check_providers(self.providers)
        if self.case_set not in ("bench", "small"):
            raise ValueError(f"case_set must be 'bench' or 'small'; got {self.case_set!r}")
        if self.reps < 1:
            raise ValueError(f"reps must be >= 1; got {self.reps}")
        for name in self.ops or ():
            if name not in REGISTRY:
                raise ValueError(f"unknown op {name!r}; registered ops: {', '.join(sorted(REGISTRY))}")


@dataclass(frozen=True)
class BenchItem:
    spec: object
    case: object
    mode: str
    dtype: torch.dtype

    @property
    def label(self) -> str:
        return f"{self.spec.name}/{self.case.name}/{self.mode}/{dtype_name(self.dtype)}"


def plan(config: BenchConfig, arch: runtime.Arch | None = None) -> list[BenchItem]:
    """Every (op, case, mode, dtype) the config asks for, in registry order; on a GPU (`arch`) only the cases
    that compile for it (no FP8 case on an A100)."""
    items = []
    for name in config.ops or tuple(REGISTRY):
        spec = REGISTRY[name]
        cases = spec.bench_cases if config.case_set == "bench" else [c for c in spec.cases if not c.slow]
        if config.case_names:
            cases = [c for c in cases if c.name in config.case_names]
        if arch is not None:
            cases = [c for c in cases if spec.supports(c, arch)]
        for case in cases:
            for mode in (m for m in config.modes if m in modes_for(spec)):
                for dtype in config.dtypes:
                    if dtype in spec.dtypes:
                        items.append(BenchItem(spec, case, mode, dtype))
    return items


def _seed(item: BenchItem, salt: int = 0) -> int:
    return zlib.crc32(f"{item.spec.name}/{item.case.name}/{item.dtype}/{salt}".encode())


def _max_diff(a: torch.Tensor | None, b: torch.Tensor | None) -> float | None:
    if a is None or b is None or a.shape != b.shape:
        return None
    if a.numel() == 0:
        return 0.0
    return float((a.detach().double() - b.detach().double()).abs().max())


@dataclass
class GpuContext:
    """What timing on a GPU needs: the flush buffer, the device row and the measured copy bandwidth."""

    flusher: T.CacheFlusher
    gpu: GPU | None
    copy_gbps: float | None
    clock_factory: Callable[[], T.Clock] = field(default=T.EventClock)


def llc_bytes(device: torch.device, gpu: GPU | None) -> int:
    """Last-level cache of the device: the table's L2 + LLC (MI300X: 32 MB + 256 MB Infinity Cache),
    and never less than what the driver reports for L2."""
    table = int((gpu.l2_mb + gpu.llc_mb) * 1e6) if gpu is not None else 0
    props = torch.cuda.get_device_properties(device)
    return max(table, int(getattr(props, "L2_cache_size", 0)))


def measure_copy_gbps(device: torch.device, n_bytes: int, clock: T.Clock, reps: int = 20) -> float:
    """Device-to-device copy bandwidth, bytes read + written per second (GB/s), median of `reps`."""
    src = torch.empty(n_bytes // 4, dtype=torch.int32, device=device).random_()
    dst = torch.empty_like(src)
    timing = T.time_fn(lambda: dst.copy_(src), clock=clock, reps=reps, warmup=3)
    return 2 * src.numel() * 4 / (timing.median_us * 1e-6) / 1e9


def gpu_context(device: torch.device, gpu: GPU | None) -> GpuContext:
    flush = T.flush_bytes_for(llc_bytes(device, gpu))
    flusher = T.CacheFlusher(flush, device)
    copy = measure_copy_gbps(device, max(flush, 1 << 30), T.EventClock())
    return GpuContext(flusher, gpu, copy)


class Harness:
    """Runs a BenchConfig on a device. `gpu_ctx` None means CPU wall-clock timing (labelled)."""

    def __init__(self, config: BenchConfig, device: str | torch.device, *, gpu_ctx: GpuContext | None = None,
                 clock_factory: Callable[[], T.Clock] | None = None):
        self.config = config
        self.device = torch.device(device)
        self.gpu_ctx = gpu_ctx
        self.providers = ProviderSet(self.device)
        # Inputs of the last (op, case, dtype): its modes reuse them, since making a 256 MB random tensor on
        # the host costs seconds, more than timing it.
        self._last_inputs: tuple[tuple, object, torch.Tensor | None] | None = None
        self._clock_factory = clock_factory or (gpu_ctx.clock_factory if gpu_ctx else T.WallClock)

    def run(self, on_item: Callable[[BenchItem, list[Measurement]], None] | None = None,
            items: list[BenchItem] | None = None) -> Iterator[list[Measurement]]:
        """Yield the measurements of each item (all its providers) as it completes."""
        t0 = time.monotonic()
        for n, item in enumerate(items if items is not None else plan(self.config)):
            # The first item always runs, so a tiny budget still measures something.
            if self.config.budget_s is not None and n > 0 and time.monotonic() - t0 > self.config.budget_s:
                rows = [self._row(item, p, "skipped", f"time budget of {self.config.budget_s:.0f} s spent")
                        for p in self.config.providers]
            else:
                rows = self.run_item(item)
            if on_item is not None:
                on_item(item, rows)
            yield rows

    def _row(self, item: BenchItem, provider: str, status: str, reason: str = "") -> Measurement:
        flops, n_bytes = formula(item.spec, item.case, item.dtype, item.mode)
        return Measurement(item.spec.name, item.case.name, item.mode, dtype_name(item.dtype), provider, status,
                           reason, dict(item.case.dims), flops=flops, min_bytes=n_bytes)

    def run_item(self, item: BenchItem) -> list[Measurement]:
        key = (item.spec.name, item.case.name, item.dtype)
        if self._last_inputs is not None and self._last_inputs[0] == key:
            _, inputs, eager_out = self._last_inputs
        else:
            self._last_inputs = None  # free the previous case's tensors before making new ones
            gen = torch.Generator().manual_seed(_seed(item))
            try:
                inputs = item.spec.make_inputs(item.case, item.dtype, self.device, gen)
                eager_out = prepare(item.spec.eager_fn, inputs, "fwd", gen).first_output
            except Exception as exc:  # the case cannot even be set up: every provider reports it
                return [self._row(item, p, "error", f"inputs: {type(exc).__name__}: {exc}")
                        for p in self.config.providers]
            self._last_inputs = (key, inputs, eager_out)
        return [self._measure(item, provider, inputs, eager_out) for provider in self.config.providers]

    def _measure(self, item: BenchItem, provider: str, inputs, eager_out) -> Measurement:
        row = self._row(item, provider, "ok")
        fn = self.providers.resolve(provider, item.spec)
        if isinstance(fn, Unavailable):
            row.status, row.reason = "unavailable", fn.reason
            return row
        try:
            runnable = prepare(fn, inputs, item.mode, torch.Generator().manual_seed(_seed(item, 1)))
            row.max_diff_vs_eager = _max_diff(runnable.first_output, eager_out)
            timing, note = self._time(item, fn, runnable)
            row.samples_us = list(timing.samples_us)
            row.method, row.flush, row.n_warmup = timing.method, timing.flush, timing.n_warmup
            row.calls_per_sample = timing.calls_per_sample
            row.reason = note
            if self.gpu_ctx is not None:
                row.peak_mem_bytes = self._peak_memory(runnable.call)
                rates = achieved(row.flops, row.min_bytes, timing.median_us, self.gpu_ctx.gpu, row.dtype,
                                 self.gpu_ctx.copy_gbps)
                for k, v in rates.items():
                    setattr(row, k, v)
        except Exception as exc:  # one provider failing must not stop the others
            row.status, row.reason, row.samples_us = "error", f"{type(exc).__name__}: {exc}", []
        return row

    def _time(self, item: BenchItem, fn, runnable) -> tuple[T.Timing, str]:
        cfg = self.config
        if self.gpu_ctx is None:
            return T.time_fn(runnable.call, clock=self._clock_factory(), reps=cfg.reps, warmup=cfg.warmup), ""
        flusher = self.gpu_ctx.flusher
        estimate = T.time_fn(runnable.call, clock=self._clock_factory(), reps=5, warmup=cfg.warmup,
                             flush=flusher, flush_label=flusher.label)
        if not cfg.use_graphs or estimate.median_us >= cfg.graph_threshold_us:
            return T.time_fn(runnable.call, clock=self._clock_factory(), reps=cfg.reps, warmup=1, flush=flusher,
                             flush_label=flusher.label), ""
        n_sets = T.rotation_sets(max(runnable.input_bytes, 1), flusher.n_bytes)
        try:
            return T.time_graph(lambda i: self._rotated_call(item, fn, i), n_sets, clock=self._clock_factory(),
                                reps=cfg.reps), ""
        except Exception as exc:  # some callables cannot be captured; events still give a figure
            timing = T.time_fn(runnable.call, clock=self._clock_factory(), reps=cfg.reps, warmup=1, flush=flusher,
                               flush_label=flusher.label)
            return timing, f"graph capture failed ({type(exc).__name__}); timed with events"

    def _rotated_call(self, item: BenchItem, fn, index: int):
        gen = torch.Generator().manual_seed(_seed(item, 100 + index))
        inputs = item.spec.make_inputs(item.case, item.dtype, self.device, gen)
        return prepare(fn, inputs, item.mode, gen).call

    def _peak_memory(self, call) -> int:
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        before = torch.cuda.memory_allocated(self.device)
        call()
        torch.cuda.synchronize(self.device)
        return int(torch.cuda.max_memory_allocated(self.device) - before)
