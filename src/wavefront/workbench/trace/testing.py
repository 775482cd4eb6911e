"""Synthetic Kineto traces with planted timings, in the exact shape torch.profiler writes on a GPU machine
(for tests and benchmarks; nothing in the analysis imports this module).

:class:`SynthTrace` builds a trace event by event: CPU ops (with recorded shapes), ProfilerStep spans,
kernels launched through a runtime call with a correlation id and an ac2g flow, CUDA/HIP graph launches
(many kernels, one correlation), memcpy/memset, GPU-side sync events, NCCL or RCCL collectives with the
``record_param_comms`` metadata. Times are written as exact decimal text (``base_us`` may be a Unix-epoch
clock such as ``"1760000000000000.123"``), so tests plant overlaps, gaps and skews at any clock and
check every number of the analysis exactly. :func:`fsdp_ranks` plants FSDP-like ranks whose
all-gathers and reduce-scatters start in different orders; :func:`write_large_trace` streams a realistic
trace of any size to disk for the speed benchmark.
"""

from __future__ import annotations

import csv
import gzip
import json
import random
import re
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

Num = float | int | Decimal  # a time in microseconds; Decimal keeps an epoch-scale clock exact

VENDORS = {
    "nvidia": {"launch": "cudaLaunchKernel", "graph": "cudaGraphLaunch", "memcpy": "cudaMemcpyAsync",
               "memset": "cudaMemsetAsync", "sync": "cudaStreamSynchronize", "device": "NVIDIA H100 80GB HBM3",
               "gemm": "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_cublas",
               "allreduce": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"},
    "amd": {"launch": "hipExtModuleLaunchKernel", "graph": "hipGraphLaunch", "memcpy": "hipMemcpyAsync",
            "memset": "hipMemsetAsync", "sync": "hipStreamSynchronize", "device": "AMD Instinct MI300X",
            "gemm": "Cijk_Alik_Bljk_BBS_BH_MT128x128x64_MI32x32x8x1_SN_1LDSB1_GRVW8",
            "allreduce": "ncclKernel_AllReduce_RING_LL_Sum_bf16(ncclWorkElem)"},
}


class SynthTrace:
    """A trace under construction. Times are microseconds; ids are assigned in call order."""

    def __init__(self, *, vendor: str = "nvidia", rank: int | None = None, world_size: int | None = None,
                 host: str = "synth-host", device_name: str | None = None, pid: int = 4242, tid: int = 4242,
                 base_us: Num | str = 1_000_000, cpu_only: bool = False, whole_us: bool = False):
        if vendor not in VENDORS:
            raise ValueError(f"vendor must be one of {sorted(VENDORS)}, got {vendor!r}")
        self.v = VENDORS[vendor]
        self.vendor = vendor
        self.pid, self.tid = pid, tid
        self.base = Decimal(str(base_us))
        self.whole_us = whole_us
        self.events: list[dict[str, Any]] = []
        self.meta: dict[str, Any] = {"schemaVersion": 1, "host_name": host, "record_shapes": 1,
                           "deviceProperties": [] if cpu_only else [{"id": 0, "name": device_name or self.v["device"],
                                                                    "totalGlobalMem": 85_000_000_000}]}
        if rank is not None:
            self.meta["distributedInfo"] = {"backend": "nccl" if vendor == "nvidia" else "rccl", "rank": rank,
                                            "world_size": world_size or 1}
        self._next_ext = 1
        self._next_corr = 1

    def _t(self, t: Num) -> Decimal:
        return self.base + Decimal(repr(t) if isinstance(t, float) else str(t))

    @staticmethod
    def _dur(d: Num) -> Decimal:
        return Decimal(repr(d) if isinstance(d, float) else str(d))

    def _number(self, value: Decimal) -> str:
        """Kineto's text: microseconds with three decimals (whole microseconds with ``whole_us``)."""
        if self.whole_us:
            if value != value.to_integral_value():
                raise ValueError(f"{value} us is not a whole microsecond (whole_us=True)")
            return str(int(value))
        return f"{value.quantize(Decimal('0.001')):f}"

    def op(self, name: str, ts: Num, dur: Num, *, tid: int | None = None, dims: list[Any] | None = None,
           types: list[Any] | None = None, cat: str = "cpu_op", args: dict[str, Any] | None = None) -> int:
        """A CPU op (or user annotation); returns its External id."""
        ext = self._next_ext
        self._next_ext += 1
        a: dict[str, Any] = {"External id": ext, "Record function id": 0}
        if dims is not None:
            a["Input Dims"], a["Input type"] = dims, types or []
        a.update(args or {})
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": self.pid, "tid": tid or self.tid,
                            "ts": self._t(ts), "dur": self._dur(dur), "args": a})
        return ext

    def step(self, n: int, ts: Num, dur: Num) -> None:
        self.op(f"ProfilerStep#{n}", ts, dur, cat="user_annotation")

    def runtime(self, name: str, ts: Num, dur: Num, *, ext: int | None = None, corr: int | None = None) -> None:
        args: dict[str, Any] = {"cbid": 0}
        if ext is not None:
            args["External id"] = ext
        if corr is not None:
            args["correlation"] = corr
        self.events.append({"ph": "X", "cat": "cuda_runtime", "name": name, "pid": self.pid, "tid": self.tid,
                            "ts": self._t(ts), "dur": self._dur(dur), "args": args})

    def _device(self, cat: str, name: str, ts: Num, dur: Num, stream: int, corr: int, ext: int | None,
                extra: dict[str, Any] | None) -> None:
        args = {"External id": ext if ext is not None else 0, "device": 0, "stream": stream, "correlation": corr}
        args.update(extra or {})
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": self._t(ts),
                            "dur": self._dur(dur), "args": args})
        self.events.append({"ph": "f", "id": corr, "pid": 0, "tid": stream, "ts": self._t(ts), "cat": "ac2g",
                            "name": "ac2g", "bp": "e"})

    def launch(self, name: str, ts: Num, dur: Num, *, launch_ts: Num, launch_dur: Num = 5.0,
               stream: int = 7, op: int | None = None, api: str | None = None, cat: str = "kernel",
               extra: dict[str, Any] | None = None) -> int:
        """One device event launched by one runtime call; returns the correlation id."""
        corr = self._next_corr
        self._next_corr += 1
        api = api or {"kernel": self.v["launch"], "gpu_memcpy": self.v["memcpy"], "gpu_memset": self.v["memset"]}[cat]
        self.runtime(api, launch_ts, launch_dur, ext=op, corr=corr)
        self.events.append({"ph": "s", "id": corr, "pid": self.pid, "tid": self.tid, "ts": self._t(launch_ts),
                            "cat": "ac2g", "name": "ac2g"})
        self._device(cat, name, ts, dur, stream, corr, op, extra)
        return corr

    def graph_launch(self, kernels: list[tuple[str, Num, Num, int]], *, launch_ts: Num,
                     launch_dur: Num = 8.0, op: int | None = None) -> int:
        """A CUDA/HIP graph launch: one runtime call, every kernel sharing its correlation id."""
        corr = self._next_corr
        self._next_corr += 1
        self.runtime(self.v["graph"], launch_ts, launch_dur, ext=op, corr=corr)
        for name, ts, dur, stream in kernels:
            self._device("kernel", name, ts, dur, stream, corr, op, None)
        return corr

    def sync_event(self, ts: Num, dur: Num, stream: int = 7) -> None:
        """A GPU-side synchronization record (cat cuda_sync): not device work."""
        self.events.append({"ph": "X", "cat": "cuda_sync", "name": "Stream Sync", "pid": 0, "tid": stream,
                            "ts": self._t(ts), "dur": self._dur(dur), "args": {"stream": stream, "device": 0}})

    def to_dict(self) -> dict[str, Any]:
        """The trace as Python objects; times become floats (inexact at Unix-epoch clocks: use text())."""
        events = [{k: float(v) if isinstance(v, Decimal) else v for k, v in e.items()} for e in self.events]
        return {**self.meta, "traceEvents": events}

    def text(self, indent: int | None = None) -> str:
        """The trace as JSON, every time written exactly."""
        numbers: list[str] = []

        def mark(e: dict[str, Any]) -> dict[str, Any]:
            out = {}
            for k, v in e.items():
                if isinstance(v, Decimal):
                    numbers.append(self._number(v))
                    v = f"@@num{len(numbers) - 1}@@"
                out[k] = v
            return out

        text = json.dumps({**self.meta, "traceEvents": [mark(e) for e in self.events]}, indent=indent)
        return re.sub(r'"@@num(\d+)@@"', lambda m: numbers[int(m.group(1))], text)

    def write(self, path: str | Path, *, gz: bool | None = None, indent: int | None = None) -> Path:
        path = Path(path)
        gz = path.suffix == ".gz" if gz is None else gz
        text = self.text(indent)
        if gz:
            with gzip.open(path, "wt", encoding="utf-8") as f:
                f.write(text)
        else:
            path.write_text(text)
        return path


# The breakdown of planted_gpu_trace's two steps, worked out by hand from its docstring (microseconds).
PLANTED_STEP1_US = {"compute": 400, "comm_overlapped": 100, "comm_exposed": 200, "memory": 50, "idle_host_bound": 200,
                    "idle_other": 50}
PLANTED_STEP2_US = {"compute": 340, "comm_overlapped": 50, "comm_exposed": 200, "memory": 0, "idle_host_bound": 100,
                    "idle_other": 310}


def planted_gpu_trace(vendor: str = "nvidia", **kwargs: Any) -> SynthTrace:
    """Two steps with planted overlaps and gaps (times relative to the trace base, microseconds).

    Step 1 [0, 1000): mm kernel A [100, 300) and B [300, 500) on stream 7, a collective [400, 700) on the
    comm stream, a host-bound gap [700, 750) (C launched at [720, 740)), C [750, 800), a memcpy
    [800, 850), an "other" gap [850, 900) (D was queued at [600, 610); a GPU sync record spans it), D
    [900, 950), then a host-bound gap into step 2 (its first launch ends at 1060).
    Step 2 [1000, 2000): a graph launch [1050, 1058) runs [1100, 1200), [1210, 1300), [1300, 1400) (the
    10 us gap inside is "other"); a collective whose kernel name matches no pattern, [1350, 1600),
    identified through its launching op; E [1600, 1700) with a memset [1650, 1660) under it; no more work.
    """
    t = SynthTrace(vendor=vendor, **kwargs)
    v = t.v
    t.step(1, 0, 1000)
    t.step(2, 1000, 1000)
    mm = t.op("aten::mm", 40, 30, dims=[[64, 128], [128, 256]], types=["c10::BFloat16", "c10::BFloat16"])
    t.launch(v["gemm"], 100, 200, launch_ts=50, launch_dur=10, op=mm)
    add = t.op("aten::add", 58, 14, dims=[[64, 256], [64, 256], []], types=["c10::BFloat16", "c10::BFloat16",
                                                                          "Scalar"])
    t.launch("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16> >()",
             300, 200, launch_ts=60, launch_dur=10, op=add)
    # ProcessGroupNCCL names its regions "nccl:*" on ROCm too (RCCL builds the same code).
    coll = t.op("nccl:all_reduce", 75, 20)
    t.launch(v["allreduce"], 400, 300, launch_ts=80, launch_dur=10, stream=20, op=coll)
    relu = t.op("aten::relu", 715, 30)
    t.launch("triton_poi_fused_relu_0", 750, 50, launch_ts=720, launch_dur=20, op=relu)
    cp = t.op("aten::copy_", 744, 6)
    t.launch("Memcpy HtoD (Pageable -> Device)", 800, 50, launch_ts=745, launch_dur=3, op=cp, cat="gpu_memcpy")
    mul = t.op("aten::mul", 598, 14)
    t.launch("triton_poi_fused_mul_1", 900, 50, launch_ts=600, launch_dur=10, op=mul)
    t.sync_event(850, 50)
    t.runtime(v["sync"], 860, 30)

    graph_op = t.op("cuda_graph_replay", 1045, 20, cat="user_annotation")
    t.graph_launch([("triton_poi_fused_graph_0", 1100, 100, 7), ("triton_poi_fused_graph_1", 1210, 90, 7),
                    ("triton_poi_fused_graph_2", 1300, 100, 7)], launch_ts=1050, launch_dur=10, op=graph_op)
    rs = t.op("nccl:reduce_scatter", 1335, 12)
    t.launch("fused_collective_kernel_v2", 1350, 250, launch_ts=1340, launch_dur=5, stream=21, op=rs)
    gelu = t.op("aten::gelu", 1585, 12)
    t.launch("triton_poi_fused_gelu_2", 1600, 100, launch_ts=1590, launch_dur=5, op=gelu)
    zero = t.op("aten::zero_", 1638, 6)
    t.launch("Memset (Device)", 1650, 10, launch_ts=1640, launch_dur=2, stream=8, op=zero, cat="gpu_memset")
    return t


def planted_ranks(clock_offsets_us: list[float], *, late_rank: int, late_us: float = 100.0, n_steps: int = 5,
                  same_host: bool = False, vendor: str = "nvidia") -> list[SynthTrace]:
    """One trace per rank with planted skew, a late rank and clock offsets (true time + offset is what
    each rank records).

    In true time, step k (1-based) starts at ``1100 * k`` on every rank and lasts ``900 + 50 * rank`` us
    (skew 50 * (n - 1), the highest rank slowest). Each step: a compute kernel [100, 500) after the step
    start, then an all-reduce that every rank enters at +500 except ``late_rank`` at ``+500 + late_us``,
    and that ends at +800 everywhere. So each on-time rank waits ``late_us`` per step.
    """
    n = len(clock_offsets_us)
    traces = []
    for rank, offset in enumerate(clock_offsets_us):
        t = SynthTrace(vendor=vendor, rank=rank, world_size=n, host="node0" if same_host else f"node{rank}",
                       base_us=1_000_000.0 + offset)
        for k in range(1, n_steps + 1):
            s = 1100.0 * k
            t.step(k, s, 900.0 + 50.0 * rank)
            mm = t.op("aten::mm", s + 10, 40, dims=[[256, 256], [256, 256]], types=["c10::BFloat16"] * 2)
            t.launch(t.v["gemm"], s + 100, 400, launch_ts=s + 20, op=mm)
            coll = t.op("nccl:all_reduce", s + 60, 20)
            arrive = s + 500 + (late_us if rank == late_rank else 0.0)
            t.launch(t.v["allreduce"], arrive, s + 800 - arrive, launch_ts=s + 65, stream=20, op=coll)
        traces.append(t)
    return traces


@dataclass
class PlantedFSDP:
    """FSDP-like ranks and their ground truth: each rank's wait per step (ns) and how many collectives it
    entered last, worked out from the planted arrival times."""

    traces: list[SynthTrace]
    wait_ns: dict[int, dict[int, int]]  # rank -> step -> ns waited for the last rank
    last_arrivals: dict[int, int]
    clock_offsets_ns: dict[int, int]  # what each rank's clock reads minus true time
    n_instances: int


def fsdp_ranks(n_ranks: int = 4, *, n_steps: int = 3, n_layers: int = 4, seed: int = 0,
               base_us: str = "1760000000000000.000", clock_offsets_ns: list[int] | None = None,
               metadata: bool = True) -> PlantedFSDP:
    """Ranks of an FSDP-like step: per layer an all-gather (stream 20) and a reduce-scatter (stream 24),
    issued alternately on process group "0" with sequence numbers 0, 1, 2, ... (``record_param_comms``
    args, or none with ``metadata=False``), and a compute kernel. In true time (ns after the base), step k
    starts at ``20_000_000 * k`` and lasts 18 ms on every rank; the all-gather of layer i is planned at
    +1 ms + 1 ms * i and its reduce-scatter 100 us later; each rank enters each collective up to 400 us
    late (seeded, whole ns, distinct per rank), so the two types start in different orders on different
    ranks. Every rank leaves the collective 200 us after the last rank entered it. Rank r's clock reads
    true time + ``clock_offsets_ns[r]`` (hosts differ, so the analysis aligns the clocks)."""
    rng = random.Random(seed)
    offsets = clock_offsets_ns or [0] * n_ranks
    if len(offsets) != n_ranks:
        raise ValueError("clock_offsets_ns: one offset per rank")
    base = Decimal(base_us)
    traces = [SynthTrace(rank=r, world_size=n_ranks, host=f"node{r}", base_us=base + Decimal(offsets[r]) / 1000)
              for r in range(n_ranks)]
    wait: dict[int, dict[int, int]] = {r: {} for r in range(n_ranks)}
    last = {r: 0 for r in range(n_ranks)}
    n_instances = 0

    def us(ns: int) -> Decimal:
        return Decimal(ns) / 1000

    for k in range(1, n_steps + 1):
        step0 = 20_000_000 * k
        for t in traces:
            t.step(k, us(step0), us(18_000_000))
        seq = (k - 1) * 2 * n_layers
        for i in range(n_layers):
            for kind, planned, stream in (("_allgather_base", 1_000_000 + 1_000_000 * i, 20),
                                          ("reduce_scatter_tensor", 1_100_000 + 1_000_000 * i, 24)):
                late = [rng.randrange(0, 400_000 // n_ranks) * n_ranks + r for r in range(n_ranks)]  # distinct
                arrive = {r: step0 + planned + late[r] for r in range(n_ranks)}
                end = max(arrive.values()) + 200_000
                latest = max(arrive, key=lambda r: arrive[r])
                last[latest] += 1
                n_instances += 1
                for r, t in enumerate(traces):
                    wait[r][k] = wait[r].get(k, 0) + arrive[latest] - arrive[r]
                    args = {"Collective name": kind, "Process Group Name": "0", "Process Group Description":
                            "default_pg", "Process Group Ranks": list(range(n_ranks)), "Seq": seq,
                            "In msg nelems": 1 << 20, "Out msg nelems": n_ranks << 20, "Group size": n_ranks,
                            "dtype": "BFloat16", "Rank": r} if metadata else {}
                    launch = step0 + planned - 300_000
                    name = "record_param_comms" if metadata else ("nccl:all_gather" if kind.startswith("_all")
                                                                  else "nccl:reduce_scatter")
                    op = t.op(name, us(launch), us(20_000), args=args)
                    kernel = ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)" if stream == 20
                              else "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)")
                    t.launch(kernel, us(arrive[r]), us(end - arrive[r]), launch_ts=us(launch + 5_000),
                             launch_dur=us(5_000), stream=stream, op=op)
                seq += 1
            for t in traces:
                mm = t.op("aten::mm", us(step0 + 900_000 + 1_000_000 * i), us(10_000))
                t.launch(t.v["gemm"], us(step0 + 1_000_000 + 1_000_000 * i), us(600_000),
                         launch_ts=us(step0 + 905_000 + 1_000_000 * i), op=mm)
    return PlantedFSDP(traces, wait, last, dict(enumerate(offsets)), n_instances)


def write_large_trace(path: str | Path, target_bytes: int, *, seed: int = 0, rank: int = 0, world_size: int = 1,
                      vendor: str = "nvidia", clock_offset_us: float = 0.0, whole_us: bool = False,
                      progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Stream a realistic multi-step GPU trace of about ``target_bytes`` to ``path`` (Kineto's indented
    layout, near enough). Each step: forward/backward CPU ops with shapes, their runtime launches and kernels on two
    compute streams, an NCCL all-reduce overlapping the backward, a memcpy, launch gaps. Times have
    nanosecond resolution (three decimals, as Kineto writes), or whole microseconds with ``whole_us``.
    Returns counts."""
    rng = random.Random(seed)
    v = VENDORS[vendor]
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    n_events = 0
    written = 0
    ext = corr = 0
    t = 1_000_000.0 + clock_offset_us
    head = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": v["device"]}],
            "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world_size},
            "record_shapes": 1, "host_name": f"synth-node{rank}", "displayTimeUnit": "ms",
            "baseTimeNanoseconds": 1_700_000_000_000_000_000}
    kernels = ["sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_cublas",
               "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl>()",
               "triton_per_fused_rms_norm_0", "void at::native::(anonymous namespace)::cunn_SoftMaxForward<8>()",
               "flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>>"]
    with opener(path, "wt", encoding="utf-8") as f:
        f.write(json.dumps(head)[:-1] + ',\n  "traceEvents": [\n')

        digits = 0 if whole_us else 3

        def emit(ev: dict[str, Any]) -> None:
            nonlocal n_events, written
            for key in ("ts", "dur"):
                if key in ev:
                    ev[key] = round(ev[key], digits) if digits else float(round(ev[key]))
            # the C encoder (indent= would use the pure-Python one), laid out about as Kineto indents
            text = ("  " if n_events == 0 else ",\n  ") + json.dumps(ev, separators=(",\n    ", ": "))
            f.write(text)
            written += len(text)
            n_events += 1

        step = 0
        while written < target_bytes:
            step += 1
            step_start = t
            step_ev = {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": 1, "tid": 1,
                       "ts": step_start, "dur": 0.0, "args": {"External id": ext}}
            ext += 1
            gpu_t = t + 20
            for i in range(200):
                name = kernels[i % len(kernels)]
                ext += 1
                corr += 1
                op_dur = rng.uniform(8, 20)
                emit({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": t, "dur": op_dur,
                      "args": {"External id": ext, "Sequence number": ext, "Fwd thread id": 0,
                               "Record function id": 0, "Input Dims": [[1024, 4096], [4096, 4096]],
                               "Input type": ["c10::BFloat16", "c10::BFloat16"], "Ev Idx": ext}})
                emit({"ph": "X", "cat": "cuda_runtime", "name": v["launch"], "pid": 1, "tid": 1, "ts": t + 2,
                      "dur": 4.0, "args": {"External id": ext, "cbid": 211, "correlation": corr}})
                emit({"ph": "s", "id": corr, "pid": 1, "tid": 1, "ts": t + 2, "cat": "ac2g", "name": "ac2g"})
                k_dur = rng.uniform(5, 60)
                gpu_t = max(gpu_t, t + 6) + rng.choice((0.0, 0.0, 0.0, rng.uniform(1, 30)))
                stream = 7 if i % 4 else 13
                emit({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": gpu_t, "dur": k_dur,
                      "args": {"External id": ext, "queued": 0, "device": 0, "context": 1, "stream": stream,
                               "correlation": corr, "registers per thread": 128, "shared memory": 0,
                               "blocks per SM": 1.0, "warps per SM": 4.0, "grid": [132, 1, 1], "block": [128, 1, 1],
                               "est. achieved occupancy %": 6}})
                emit({"ph": "f", "id": corr, "pid": 0, "tid": stream, "ts": gpu_t, "cat": "ac2g", "name": "ac2g",
                      "bp": "e"})
                if i == 150:
                    ext += 1
                    corr += 1
                    emit({"ph": "X", "cat": "cpu_op", "name": "nccl:all_reduce", "pid": 1, "tid": 1, "ts": t + 1,
                          "dur": 10.0, "args": {"External id": ext, "Record function id": 0}})
                    emit({"ph": "X", "cat": "cuda_runtime", "name": v["launch"], "pid": 1, "tid": 1, "ts": t + 3,
                          "dur": 5.0, "args": {"External id": ext, "cbid": 211, "correlation": corr}})
                    emit({"ph": "X", "cat": "kernel", "name": v["allreduce"], "pid": 0, "tid": 20,
                          "ts": gpu_t + 1, "dur": rng.uniform(1500, 2500),
                          "args": {"External id": ext, "device": 0, "stream": 20, "correlation": corr}})
                if i == 100:
                    corr += 1
                    emit({"ph": "X", "cat": "cuda_runtime", "name": v["memcpy"], "pid": 1, "tid": 1, "ts": t + 7,
                          "dur": 3.0, "args": {"External id": ext, "cbid": 41, "correlation": corr}})
                    emit({"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pinned -> Device)", "pid": 0,
                          "tid": 13, "ts": gpu_t + k_dur, "dur": 30.0,
                          "args": {"External id": ext, "device": 0, "stream": 13, "correlation": corr,
                                   "bytes": 1 << 20, "memory bandwidth (GB/s)": 30.0}})
                gpu_t += k_dur
                t += op_dur + rng.uniform(0.5, 3.0)
            t = max(t, gpu_t) + rng.uniform(50, 400)
            step_ev["dur"] = t - step_start
            emit(step_ev)
            if progress is not None:
                progress(written, target_bytes)
        f.write("\n  ]\n}\n")
    return {"n_events": n_events, "n_steps": step, "bytes": written}


# The Nsight Systems export tables write_nsys_sqlite fills, with the columns of the documented schema
# (2024.x/2025.x) that the reader uses plus a few it does not, as a real export carries them.
NSYS_TABLES = {
    "StringIds": "id INTEGER PRIMARY KEY, value TEXT NOT NULL",
    "CUPTI_ACTIVITY_KIND_KERNEL": "start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL, "
                                  "contextId INTEGER, streamId INTEGER NOT NULL, correlationId INTEGER, "
                                  "globalPid INTEGER, demangledName INTEGER NOT NULL, shortName INTEGER NOT NULL, "
                                  "mangledName INTEGER, gridX INTEGER, gridY INTEGER, gridZ INTEGER, "
                                  "blockX INTEGER, blockY INTEGER, blockZ INTEGER, registersPerThread INTEGER",
    "CUPTI_ACTIVITY_KIND_MEMCPY": "start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL, "
                                  "contextId INTEGER, streamId INTEGER NOT NULL, correlationId INTEGER, "
                                  "globalPid INTEGER, bytes INTEGER NOT NULL, copyKind INTEGER NOT NULL, "
                                  "srcKind INTEGER, dstKind INTEGER",
    "CUPTI_ACTIVITY_KIND_MEMSET": "start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL, "
                                  "contextId INTEGER, streamId INTEGER NOT NULL, correlationId INTEGER, "
                                  "globalPid INTEGER, value INTEGER NOT NULL, bytes INTEGER NOT NULL, memKind INTEGER",
    "CUPTI_ACTIVITY_KIND_RUNTIME": "start INTEGER NOT NULL, end INTEGER NOT NULL, eventClass INTEGER, "
                                   "globalTid INTEGER, correlationId INTEGER, nameId INTEGER NOT NULL, "
                                   "returnValue INTEGER, callchainId INTEGER",
    "NVTX_EVENTS": "start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL, rangeId INTEGER, "
                   "category INTEGER, color INTEGER, text TEXT, globalTid INTEGER, endGlobalTid INTEGER, "
                   "textId INTEGER, domainId INTEGER",
    "TARGET_INFO_GPU": "vmId INTEGER, id INTEGER NOT NULL, name TEXT, busLocation TEXT, totalMemory INTEGER, "
                       "smCount INTEGER",
}


def write_nsys_sqlite(trace: SynthTrace, path: str | Path, *, tables: dict[str, str] | None = None,
                      api_suffix: str = "_v7000") -> Path:
    """The same timeline as ``trace`` written as an ``nsys export --type sqlite`` file: kernels, memcpy and
    memset as CUPTI activity rows, runtime calls (named with nsys's API version suffix) with their
    correlation ids, and CPU ops and annotations as NVTX push/pop ranges on the host thread (as
    ``torch.autograd.profiler.emit_nvtx`` writes them). GPU-side sync records and flows have no row.
    ``tables`` replaces the schema (to write a foreign one)."""
    path = Path(path)
    path.unlink(missing_ok=True)
    strings: dict[str, int] = {}

    def sid(text: str) -> int:
        return strings.setdefault(text, len(strings) + 1)

    def ns(value: Decimal) -> int:
        return int(value.quantize(Decimal("0.001")) * 1000)

    rows: dict[str, list[tuple[Any, ...]]] = {t: [] for t in NSYS_TABLES}
    next_corr = 1 << 20  # runtime calls that launch nothing still carry a correlation id of their own
    for e in trace.events:
        if e.get("ph") != "X":
            continue
        start, end = ns(e["ts"]), ns(e["ts"] + e["dur"])
        args, cat = e.get("args", {}), e["cat"]
        gtid = (e["pid"] << 24) | e["tid"]
        if cat == "kernel":
            rows["CUPTI_ACTIVITY_KIND_KERNEL"].append(
                (start, end, args["device"], 1, args["stream"], args["correlation"], e["pid"] << 24, sid(e["name"]),
                 sid(e["name"].split("(")[0].split("<")[0]), None, 1, 1, 1, 128, 1, 1, 32))
        elif cat == "gpu_memcpy":
            m = re.match(r"Memcpy (\w+) \((\w+) -> (\w+)\)", e["name"])
            kinds = m.groups() if m else ("", "", "")
            memory = ("Unknown", "Pageable", "Pinned", "Device")
            rows["CUPTI_ACTIVITY_KIND_MEMCPY"].append(
                (start, end, args["device"], 1, args["stream"], args["correlation"], 0, 4096,
                 {"HtoD": 1, "DtoH": 2, "DtoD": 8}.get(kinds[0], 0),
                 memory.index(kinds[1]) if kinds[1] in memory else 0,
                 memory.index(kinds[2]) if kinds[2] in memory else 0))
        elif cat == "gpu_memset":
            rows["CUPTI_ACTIVITY_KIND_MEMSET"].append(
                (start, end, args["device"], 1, args["stream"], args["correlation"], 0, 0, 4096, 3))
        elif cat == "cuda_runtime":
            corr = args.get("correlation")
            if corr is None:
                corr, next_corr = next_corr, next_corr + 1
            rows["CUPTI_ACTIVITY_KIND_RUNTIME"].append((start, end, 1, gtid, corr, sid(e["name"] + api_suffix), 0,
                                                        None))
        elif cat in ("cpu_op", "user_annotation"):
            rows["NVTX_EVENTS"].append((start, end, 59, None, 0, None, e["name"], gtid, gtid, None, 0))
    rows["StringIds"] = [(i, s) for s, i in strings.items()]
    rows["TARGET_INFO_GPU"] = [(0, p["id"], p["name"], "0000:00:00.0", p.get("totalGlobalMem"), 132)
                               for p in trace.meta["deviceProperties"]]
    with sqlite3.connect(path) as db:
        for table, columns in (tables if tables is not None else NSYS_TABLES).items():
            db.execute(f"CREATE TABLE {table} ({columns})")
            n = columns.count(",") + 1
            if table in rows and rows[table] and tables is None:
                db.executemany(f"INSERT INTO {table} VALUES ({', '.join('?' * n)})", rows[table])
    db.close()
    return path


# The rocprofv3 CSV headers write_rocprof_csv writes: ROCm 6.3/6.4's, as the "Using rocprofv3" guide shows
# them (agent_info.csv: the columns the reader uses and a few more of the many a real one carries).
ROCPROF_HEADERS = {
    "kernel_trace": ("Kind", "Agent_Id", "Queue_Id", "Stream_Id", "Thread_Id", "Dispatch_Id", "Kernel_Id",
                     "Kernel_Name", "Correlation_Id", "Start_Timestamp", "End_Timestamp", "LDS_Block_Size",
                     "Scratch_Size", "VGPR_Count", "Accum_VGPR_Count", "SGPR_Count", "Workgroup_Size_X",
                     "Workgroup_Size_Y", "Workgroup_Size_Z", "Grid_Size_X", "Grid_Size_Y", "Grid_Size_Z"),
    "memory_copy_trace": ("Kind", "Direction", "Stream_Id", "Source_Agent_Id", "Destination_Agent_Id",
                          "Correlation_Id", "Start_Timestamp", "End_Timestamp"),
    "hip_api_trace": ("Domain", "Function", "Process_Id", "Thread_Id", "Correlation_Id", "Start_Timestamp",
                      "End_Timestamp"),
    "marker_api_trace": ("Domain", "Function", "Process_Id", "Thread_Id", "Correlation_Id", "Start_Timestamp",
                         "End_Timestamp"),
    "agent_info": ("Node_Id", "Logical_Node_Id", "Agent_Type", "Cpu_Cores_Count", "Simd_Count", "Wave_Front_Size",
                   "Cu_Count", "Name", "Product_Name"),
}


def write_rocprof_csv(trace: SynthTrace, directory: str | Path, *, prefix: str = "4242_",
                      headers: dict[str, tuple[str, ...]] | None = None) -> Path:
    """The same timeline as ``trace`` written as ``rocprofv3 --runtime-trace`` writes it (CSV, ROCm 6.3/6.4):
    ``<prefix>kernel_trace.csv`` (memsets as the HIP runtime's ``__amd_rocclr_fillBufferAligned`` dispatch,
    which is how hipMemset runs), ``memory_copy_trace.csv``, ``hip_api_trace.csv`` (runtime calls with
    their correlation ids), ``marker_api_trace.csv`` (CPU ops and annotations as ROCTx ranges, as
    ``emit_nvtx`` writes them on ROCm) and ``agent_info.csv`` (CPU agent 0, then the GPUs: device d is
    "Agent d+1", as rocprofv3 numbers agents). GPU-side sync
    records and flows have no row. Returns the kernel trace's path. ``headers`` replaces the columns (to
    write a foreign schema)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    heads = {**ROCPROF_HEADERS, **(headers or {})}
    rows: dict[str, list[dict[str, Any]]] = {k: [] for k in heads}

    def ns(value: Decimal) -> int:
        return int(value.quantize(Decimal("0.001")) * 1000)

    next_corr = 1 << 20  # runtime calls that launch nothing still carry a correlation id of their own
    directions = {"HtoD": "HOST_TO_DEVICE", "DtoH": "DEVICE_TO_HOST", "DtoD": "DEVICE_TO_DEVICE"}
    for n, e in enumerate(e for e in trace.events if e.get("ph") == "X"):
        start, end = ns(e["ts"]), ns(e["ts"] + e["dur"])
        args, cat = e.get("args", {}), e["cat"]
        times = {"Start_Timestamp": start, "End_Timestamp": end}
        if cat in ("kernel", "gpu_memset"):
            name = e["name"] if cat == "kernel" else "__amd_rocclr_fillBufferAligned"
            rows["kernel_trace"].append({"Kind": "KERNEL_DISPATCH", "Agent_Id": f"Agent {args['device'] + 1}",
                                         "Queue_Id": 1, "Stream_Id": args["stream"], "Thread_Id": trace.tid,
                                         "Dispatch_Id": n, "Kernel_Id": 7, "Kernel_Name": name,
                                         "Correlation_Id": args["correlation"], **times, "LDS_Block_Size": 0,
                                         "Scratch_Size": 0, "VGPR_Count": 32, "Accum_VGPR_Count": 0,
                                         "SGPR_Count": 16, "Workgroup_Size_X": 256, "Workgroup_Size_Y": 1,
                                         "Workgroup_Size_Z": 1, "Grid_Size_X": 65536, "Grid_Size_Y": 1,
                                         "Grid_Size_Z": 1})
        elif cat == "gpu_memcpy":
            kind = e["name"].split()[1] if len(e["name"].split()) > 1 else ""
            rows["memory_copy_trace"].append({"Kind": "MEMORY_COPY",
                                              "Direction": f"MEMORY_COPY_{directions.get(kind, 'NONE')}",
                                              "Stream_Id": args["stream"], "Source_Agent_Id": "Agent 0",
                                              "Destination_Agent_Id": f"Agent {args['device'] + 1}",
                                              "Correlation_Id": args["correlation"], **times})
        elif cat == "cuda_runtime":
            corr = args.get("correlation")
            if corr is None:
                corr, next_corr = next_corr, next_corr + 1
            rows["hip_api_trace"].append({"Domain": "HIP_RUNTIME_API", "Function": e["name"], "Process_Id": e["pid"],
                                          "Thread_Id": e["tid"], "Correlation_Id": corr, **times})
        elif cat in ("cpu_op", "user_annotation"):
            corr, next_corr = next_corr, next_corr + 1
            rows["marker_api_trace"].append({"Domain": "MARKER_CORE_API", "Function": e["name"],
                                             "Process_Id": e["pid"], "Thread_Id": e["tid"], "Correlation_Id": corr,
                                             **times})
    rows["agent_info"] = [{"Node_Id": 0, "Logical_Node_Id": 0, "Agent_Type": "CPU", "Cpu_Cores_Count": 64,
                           "Simd_Count": 0, "Wave_Front_Size": 0, "Cu_Count": 0, "Name": "AMD EPYC 9654",
                           "Product_Name": "AMD EPYC 9654"}]
    rows["agent_info"] += [{"Node_Id": p["id"] + 1, "Logical_Node_Id": p["id"] + 1, "Agent_Type": "GPU",
                            "Cpu_Cores_Count": 0, "Simd_Count": 1216, "Wave_Front_Size": 64, "Cu_Count": 304,
                            "Name": "gfx942", "Product_Name": p["name"]} for p in trace.meta["deviceProperties"]]
    for kind, header in heads.items():
        with open(directory / f"{prefix}{kind}.csv", "w", newline="") as f:
            writer = csv.writer(f, quoting=csv.QUOTE_NONNUMERIC, lineterminator="\n")
            writer.writerow(header)
            writer.writerows([r.get(c, "") for c in header] for r in rows[kind])
    return directory / f"{prefix}kernel_trace.csv"
