"""Classify device work as compute, communication, memcpy or memset, and link it to its launch.

Evidence, strongest first (the first that decides wins; the deciding rule is recorded per event):

1. ``category``: the event category says memcpy / memset (``gpu_memcpy``, ``gpu_memset``).
2. ``args``: the kernel carries collective metadata (``Collective name``, written by newer PyTorch on
   NCCL/RCCL kernels).
3. ``launch-op``: the CPU op that launched it (kernel ``External id``, or the launching runtime call's
   External id through the correlation id / ac2g flow) is a collective (``record_param_comms``,
   ``nccl:*``, ``c10d::*``, functional collectives, or an op with collective args) -> communication; any
   other CPU operator -> compute.
4. ``stream``: a kernel with no usable link runs on a stream whose linked kernels are all communication
   (NCCL keeps its own streams) or all compute -> the same class.
5. ``name``: only then the kernel name: NCCL/RCCL/MSCCL prefixes and collective words.
6. ``default``: compute.

GPU-side synchronization events (``cuda_sync``) are not device work and never counted as busy time.
CUDA-graph launches give every kernel of the graph the correlation id of one ``cudaGraphLaunch`` /
``hipGraphLaunch``: links are many-to-one, never assumed one-to-one.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from wavefront.workbench.trace.model import KIND_MEMCPY, KIND_MEMSET, NO_ID, Trace

COMPUTE, COMM, MEMCPY, MEMSET = 0, 1, 2, 3
CLASS_NAMES = ("compute", "comm", "memcpy", "memset")
REASONS = ("category", "args", "launch-op", "stream", "name", "default")

LAUNCH_APIS = frozenset({
    "cudaLaunchKernel", "cudaLaunchKernelExC", "cudaLaunchKernelEx", "cudaLaunchCooperativeKernel",
    "cudaLaunchCooperativeKernelMultiDevice", "cuLaunchKernel", "cuLaunchKernelEx", "cuLaunchCooperativeKernel",
    "cudaGraphLaunch", "cuGraphLaunch", "cudaMemcpyAsync", "cudaMemcpy", "cudaMemcpy2DAsync", "cudaMemcpyPeerAsync",
    "cudaMemsetAsync", "cudaMemset", "cuMemcpyAsync", "cuMemcpyHtoDAsync_v2", "cuMemcpyDtoHAsync_v2",
    "cuMemsetD8Async", "cuMemsetD32Async",
    "hipLaunchKernel", "hipExtLaunchKernel", "hipModuleLaunchKernel", "hipExtModuleLaunchKernel",
    "hipLaunchCooperativeKernel", "hipExtLaunchMultiKernelMultiDevice", "hipGraphLaunch", "hipMemcpyAsync",
    "hipMemcpy", "hipMemcpyWithStream", "hipMemcpy2DAsync", "hipMemcpyPeerAsync", "hipMemsetAsync", "hipMemset",
    "hipMemsetD32Async",
})
GRAPH_LAUNCH_APIS = frozenset({"cudaGraphLaunch", "cuGraphLaunch", "hipGraphLaunch"})
SYNC_APIS = frozenset({
    "cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "cuStreamSynchronize",
    "cuCtxSynchronize", "cuEventSynchronize", "hipDeviceSynchronize", "hipStreamSynchronize",
    "hipEventSynchronize",
})

COMM_OP_NAMES = frozenset({"record_param_comms"})
COMM_OP_PREFIXES = ("nccl:", "rccl:", "gloo:", "mpi:", "ucc:", "c10d::", "c10d_functional::", "_c10d_functional::",
                    "ProcessGroupNCCL::", "ProcessGroupGloo::", "torch.distributed.", "c10d.")
_COMM_KERNEL_NAME = re.compile(r"^(void )?(nccl|rccl|msccl)|ncclDevKernel|ncclKernel|"
                               r"all[-_]?reduce|all[-_]?gather|reduce[-_]?scatter|all[-_]?to[-_]?all|AllReduce|"
                               r"AllGather|ReduceScatter|AllToAll|SendRecv|collective[-_]permute")


def is_comm_op_name(name: str) -> bool:
    return name in COMM_OP_NAMES or name.startswith(COMM_OP_PREFIXES)


@dataclass
class DeviceClasses:
    """Per device event (rows of ``trace.device``): class, deciding rule, and launch links."""

    cls: np.ndarray  # int8, COMPUTE / COMM / MEMCPY / MEMSET
    reason: np.ndarray  # int8 index into REASONS
    runtime_row: np.ndarray  # row of the launching runtime call in trace.runtime, or -1
    op_row: np.ndarray  # row of the launching CPU op in trace.cpu, or -1

    def counts(self) -> dict[str, Any]:
        out: dict[str, dict[str, int]] = {}
        for c, name in enumerate(CLASS_NAMES):
            sel = self.cls == c
            if np.any(sel):
                r, n = np.unique(self.reason[sel], return_counts=True)
                out[name] = {REASONS[i]: int(k) for i, k in zip(r.tolist(), n.tolist(), strict=True)}
        return out


def _lookup(keys: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """Row in ``keys`` of each query (first occurrence), -1 when absent or the query is NO_ID."""
    out = np.full(len(queries), -1, dtype=np.int64)
    if len(keys) == 0 or len(queries) == 0:
        return out
    if len(keys) < 2 or bool(np.all(keys[1:] >= keys[:-1])):  # ids usually grow with time: already sorted
        order, sorted_keys = np.arange(len(keys)), keys
    else:
        order = np.argsort(keys, kind="stable")
        sorted_keys = keys[order]
    pos = np.searchsorted(sorted_keys, queries, side="left")
    pos_c = np.minimum(pos, len(keys) - 1)
    hit = (sorted_keys[pos_c] == queries) & (queries != NO_ID)
    out[hit] = order[pos_c[hit]]
    return out


def name_flags(names: list[str], predicate: Callable[[str], object]) -> np.ndarray:
    return np.fromiter((bool(predicate(n)) for n in names), dtype=bool, count=len(names))


def runtime_links(trace: Trace) -> np.ndarray:
    """Row of the launching runtime call for each device event (correlation id), -1 when unknown."""
    return _lookup(trace.runtime.correlation, trace.device.correlation)


def classify_device(trace: Trace) -> DeviceClasses:
    dev = trace.device
    n = len(dev)
    cls = np.full(n, COMPUTE, dtype=np.int8)
    reason = np.full(n, REASONS.index("default"), dtype=np.int8)
    decided = np.zeros(n, dtype=bool)

    rt_row = runtime_links(trace)
    ext = dev.external_id.copy()
    via_rt = (ext == NO_ID) & (rt_row >= 0)
    ext[via_rt] = trace.runtime.external_id[rt_row[via_rt]]
    op_row = _lookup(trace.cpu.external_id, ext)

    # 1. category
    for kind, c in ((KIND_MEMCPY, MEMCPY), (KIND_MEMSET, MEMSET)):
        sel = dev.kind == kind
        cls[sel], reason[sel], decided[sel] = c, REASONS.index("category"), True
    # 2. collective args on the kernel
    sel = ~decided & (dev.has_coll == 1)
    cls[sel], reason[sel], decided[sel] = COMM, REASONS.index("args"), True
    # 3. the launching CPU op
    if len(trace.cpu):
        comm_name = name_flags(trace.names, is_comm_op_name)
        op_is_comm = comm_name[trace.cpu.name]
        if trace.op_comm_args:
            op_is_comm |= np.isin(trace.cpu.external_id, np.fromiter(trace.op_comm_args, dtype=np.int64))
        linked = ~decided & (op_row >= 0)
        # A user annotation (a region someone named) says nothing about the kernel: only operators decide.
        linked &= trace.cpu.cat[np.maximum(op_row, 0)] == 0
        is_comm = np.zeros(n, dtype=bool)
        is_comm[linked] = op_is_comm[op_row[linked]]
        cls[linked] = np.where(is_comm[linked], COMM, COMPUTE)
        reason[linked], decided[linked] = REASONS.index("launch-op"), True
    # 4. the stream's linked kernels agree
    kernels = dev.kind == 0
    for stream in np.unique(dev.stream[kernels & ~decided]).tolist():
        on = kernels & (dev.stream == stream)
        known = on & decided
        if not np.any(known):
            continue
        classes = np.unique(cls[known])
        if len(classes) == 1:
            sel = on & ~decided
            cls[sel], reason[sel], decided[sel] = classes[0], REASONS.index("stream"), True
    # 5. the kernel name, as a last resort
    undecided = ~decided
    if np.any(undecided):
        comm_kernel = name_flags(trace.names, _COMM_KERNEL_NAME.search)
        sel = undecided & comm_kernel[dev.name]
        cls[sel], reason[sel] = COMM, REASONS.index("name")
    return DeviceClasses(cls, reason, rt_row, op_row)


# Kernel families: one readable name for the many instantiations of one kernel.
_FAMILY_RULES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"(?:nccl|rccl)(?:Dev)?Kernel_([A-Za-z]+)"), "nccl {0}"),
    (re.compile(r"^Memcpy (\w+)"), "Memcpy {0}"),
    (re.compile(r"^Memset"), "Memset"),
    (re.compile(r"^(sm\d+_xmma_gemm|ampere_\w*?gemm|sm\d+_\w*?gemm|cutlass\w*?gemm|Cijk_\w+?_MT)"), "GEMM {0}"),
)
_TRAILING_NUMBER = re.compile(r"_\d+$")


def family(name: str) -> str:
    """A kernel's family: template and argument lists and numeric suffixes stripped, library GEMMs and
    NCCL/RCCL kernels grouped by operation."""
    for pattern, fmt in _FAMILY_RULES:
        m = pattern.search(name)
        if m:
            return fmt.format(*m.groups()) if m.groups() else fmt
    short = name[5:] if name.startswith("void ") else name
    for stop in ("<", "("):
        cut = short.find(stop)
        if cut > 0:
            short = short[:cut]
    return _TRAILING_NUMBER.sub("", short.strip()) or name
